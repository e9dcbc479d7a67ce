"""One runner per task. A runner turns texts into tokens and token batches into result columns;
it knows nothing of files, chunks or order."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import JobConfig
from ..models import load_model


def make_runner(job: JobConfig, model_path: Path):
    """Load what the task needs and wrap it in its runner."""
    if job.model.task == "generate" and job.generation.engine == "vllm":
        from .generate import GenerateRunner, load_vllm

        llm = load_vllm(model_path, job.generation.engine_options)
        return GenerateRunner(llm.get_tokenizer(), llm, torch.device("cuda"), job.model.max_length, job.generation)
    tokenizer, model, device = load_model(job.model, model_path)
    if job.model.task == "generate":
        from .generate import GenerateRunner

        return GenerateRunner(tokenizer, model, device, job.model.max_length, job.generation)
    if job.model.task == "embed":
        from .embed import EmbedRunner

        return EmbedRunner(tokenizer, model, device, job.model.max_length, model_path)
    from .classify import ClassifyRunner

    return ClassifyRunner(tokenizer, model, device, job.model.max_length, scores=job.output.scores)
