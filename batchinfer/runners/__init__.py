"""One runner per task (see tasks.py), found in one registry. A runner turns texts into tokens and
token batches into result columns; it knows nothing of files, chunks or order.

Each runner's module is imported when its task runs: most import torch, and a warm embed run on OpenVINO
must not (backends/__init__.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..config import JobConfig

RUNNERS = {  # task -> "module:class" under runners/
    "embed": "embed:EmbedRunner",
    "classify": "classify:ClassifyRunner",
    "score": "score:ScoreRunner",
    "token-classify": "token_classify:TokenClassifyRunner",
    "zero-shot": "zero_shot:ZeroShotRunner",
    "generate": "generate:GenerateRunner",
}
LABEL_SCORE = "label_score:LabelScoreRunner"  # classify with model.labels: a causal LM scores them


def runner_class(name: str) -> type:
    """The runner class a RUNNERS entry (or LABEL_SCORE) names."""
    module, cls = name.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def make_runner(job: JobConfig, model_path: Path, budget=None):
    """Load what the task needs and wrap it in its runner (classify with labels: a causal LM scores them);
    `budget`: a recorded probe's choice of backend."""
    name = LABEL_SCORE if job.model.task == "classify" and job.model.labels else RUNNERS[job.model.task]
    return runner_class(name).load(job, model_path, budget)
