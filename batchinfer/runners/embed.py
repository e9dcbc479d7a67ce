"""task: embed — one vector per row, pooled as the model's sentence-transformers config says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from ..models import pooling_of
from .base import EncoderRunner, fixed_size_list, rows_of


class EmbedRunner(EncoderRunner):
    agreement = "cosine"

    def __init__(self, tokenizer, model, device, job, model_path: Path):
        super().__init__(tokenizer, model, device, job)
        self.pooling = pooling_of(model_path)
        self.width = model.config.hidden_size

    def head(self, inputs: dict, mask: torch.Tensor) -> list:
        hidden = self.model(**inputs).last_hidden_state  # [b, L, h]
        if self.pooling.mode == "cls":
            pooled = hidden[:, 0]
        elif self.pooling.mode == "lasttoken":
            last = mask.sum(dim=1) - 1  # right padding: the last real token of each row
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        pooled = pooled.float()
        if self.pooling.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return list(pooled.cpu().numpy())  # [b] x [hidden]

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        return {"embedding": fixed_size_list(rows_of(results).reshape(len(results), self.width))}
