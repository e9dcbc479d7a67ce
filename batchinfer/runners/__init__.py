"""One runner per task (see tasks.py), found in one registry. A runner turns texts into tokens and
token batches into result columns; it knows nothing of files, chunks or order."""

from __future__ import annotations

from pathlib import Path

from ..config import JobConfig
from .classify import ClassifyRunner
from .embed import EmbedRunner
from .generate import GenerateRunner
from .label_score import LabelScoreRunner
from .score import ScoreRunner
from .token_classify import TokenClassifyRunner
from .zero_shot import ZeroShotRunner

RUNNERS = {
    "embed": EmbedRunner,
    "classify": ClassifyRunner,
    "score": ScoreRunner,
    "token-classify": TokenClassifyRunner,
    "zero-shot": ZeroShotRunner,
    "generate": GenerateRunner,
}


def make_runner(job: JobConfig, model_path: Path, budget=None):
    """Load what the task needs and wrap it in its runner (classify with labels: a causal LM scores them);
    `budget`: a recorded probe's choice of backend."""
    runner = LabelScoreRunner if job.model.task == "classify" and job.model.labels else RUNNERS[job.model.task]
    return runner.load(job, model_path, budget)
