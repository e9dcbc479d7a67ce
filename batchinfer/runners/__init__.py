"""One runner per task (see tasks.py), found in one registry. A runner turns texts into tokens and
token batches into result columns; it knows nothing of files, chunks or order."""

from __future__ import annotations

from pathlib import Path

from ..config import JobConfig
from .classify import ClassifyRunner
from .embed import EmbedRunner
from .generate import GenerateRunner
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
    """Load what the task needs and wrap it in its runner; `budget`: a recorded probe's choice of backend."""
    return RUNNERS[job.model.task].load(job, model_path, budget)
