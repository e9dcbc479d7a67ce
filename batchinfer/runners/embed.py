"""task: embed — one vector per row, pooled as the model's sentence-transformers config says (with
output.format openai, each row's prompt_tokens too)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from ..models import Pooling, pooling_of
from .base import EncoderRunner, fixed_size_list, rows_of


class EmbedRunner(EncoderRunner):
    agreement = "cosine"

    @classmethod
    def converted_output(cls, model_path: Path) -> tuple[str, Callable | None]:
        # Pooled inside the converted graph: [b, h] leaves it instead of [b, L, h] (MiniLM: 10% faster).
        pooling = pooling_of(model_path)
        return f"pooled:{pooling.mode}:{pooling.normalize}", functools.partial(pool, pooling=pooling)

    def __init__(self, tokenizer, model, device, job, model_path: Path):
        super().__init__(tokenizer, model, device, job)
        self.pooling = pooling_of(model_path)
        self.width = model.config.hidden_size
        self.usage = job.output.format == "openai"  # OpenAI's embedding answers count each request's tokens

    def head(self, inputs: dict, mask: torch.Tensor) -> list:
        out = self.model(**inputs)
        pooled = out.pooled if hasattr(out, "pooled") else pool(out.last_hidden_state, mask, self.pooling)
        return list(pooled.float().cpu().numpy())  # [b] x [hidden]

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        columns = {"embedding": fixed_size_list(rows_of(results).reshape(len(results), self.width))}
        if self.usage:  # one item per row
            columns["prompt_tokens"] = pa.array(loaded.tokens.lengths[texts], pa.int32())
        return columns


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """hidden: [b, L, h], mask: [b, L] → [b, h], as the model's sentence-transformers config pools."""
    if pooling.mode == "cls":
        pooled = hidden[:, 0]
    elif pooling.mode == "lasttoken":
        last = mask.sum(dim=1) - 1  # right padding: the last real token of each row
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    else:
        weights = mask.unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    pooled = pooled.float()
    return torch.nn.functional.normalize(pooled, p=2, dim=1) if pooling.normalize else pooled
