"""One runner per task. A runner turns texts into tokens and token batches into result columns;
it knows nothing of files, chunks or order."""

from __future__ import annotations

from pathlib import Path

from ..config import JobConfig
from .base import EncoderRunner


def make_runner(job: JobConfig, tokenizer, model, device, model_path: Path) -> EncoderRunner:
    if job.model.task == "embed":
        from .embed import EmbedRunner

        return EmbedRunner(tokenizer, model, device, job.model.max_length, model_path)
    from .classify import ClassifyRunner

    return ClassifyRunner(tokenizer, model, device, job.model.max_length, scores=job.output.scores)
