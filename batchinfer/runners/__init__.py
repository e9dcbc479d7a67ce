"""One runner per task (see job/tasks.py), found in one registry. A runner turns texts into tokens and
token batches into result columns; it knows nothing of files, chunks or order."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..job.config import JobConfig

# task -> "module:class", imported when a job asks for it: generate's module loads transformers' continuous
# batching (and torch's compiler with it), seconds that an encoder job's run or plan has no use for.
RUNNERS = {
    "embed": "embed:EmbedRunner",
    "classify": "classify:ClassifyRunner",
    "score": "score:ScoreRunner",
    "token-classify": "token_classify:TokenClassifyRunner",
    "zero-shot": "zero_shot:ZeroShotRunner",
    "generate": "generate:GenerateRunner",
}
LABEL_SCORER = "label_score:LabelScoreRunner"  # classify with model.labels: a causal LM scores them


def runner_class(name: str) -> type:
    """The runner class registered as `name` ("module:class" in this package)."""
    module, cls = name.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def make_runner(job: JobConfig, model_path: Path, budget=None):
    """Load what the task needs and wrap it in its runner; `budget`: a recorded probe's choice of backend."""
    labels = job.model.task == "classify" and job.model.labels
    return runner_class(LABEL_SCORER if labels else RUNNERS[job.model.task]).load(job, model_path, budget)
