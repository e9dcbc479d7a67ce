"""task: embed — one vector per row, pooled as the model's sentence-transformers config says (with
output.format openai, each row's prompt_tokens too). In an OpenAI Batch file a request may give a list of
texts: each is an item of its row, batched with every other item, and the row's vectors come back
together (in the chunk that holds the row, so none is lost or repeated on resume); that job's embedding
column holds a list of vectors per row."""

from __future__ import annotations

import functools
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from ..backends.models import Pooling, pooling_of
from .base import EncoderRunner, encode_capped, fixed_size_list, rows_of, tokens_of
from .protocol import Tokens

if TYPE_CHECKING:  # pool() runs on torch; on OpenVINO the graph pools and this module needs no torch
    import torch


class EmbedRunner(EncoderRunner):
    agreement = "cosine"
    numpy_head = True

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
        self.lists = job.input.format == "openai"  # a request's input may be a list of texts

    def tokenize(self, texts: list) -> Tokens:
        if not self.lists:
            return super().tokenize(texts)
        items = [text if isinstance(text, list) else [text] for text in texts]
        owner = np.repeat(np.arange(len(items)), [len(texts) for texts in items])
        return tokens_of(encode_capped(self.tokenizer, list(chain(*items)), self.max_length), owner)

    def head(self, inputs: dict, mask) -> list:
        out = self.model(**inputs)
        if hasattr(out, "pooled"):  # OpenVINO's graph pooled: numpy out for numpy in
            return list(np.asarray(out.pooled, dtype=np.float32))  # [b] x [hidden]
        return list(pool(out.last_hidden_state, mask, self.pooling).cpu().numpy())

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        if self.lists:  # [rows] x [texts] x [hidden]
            vectors = [np.asarray(v, np.float32).reshape(-1) for items in results for v in items]
            flat = fixed_size_list(np.stack(vectors) if vectors else np.zeros((0, self.width), np.float32))
            offsets = np.concatenate([[0], np.cumsum([len(items) for items in results])]).astype(np.int32)
            columns = {"embedding": pa.ListArray.from_arrays(pa.array(offsets), flat)}
        else:
            columns = {"embedding": fixed_size_list(rows_of(results).reshape(len(results), self.width))}
        if self.usage:  # a row's tokens: the sum of its texts'
            tokens = loaded.tokens
            per_row = np.bincount(tokens.owners(), weights=tokens.lengths, minlength=len(loaded.prepared.texts))
            columns["prompt_tokens"] = pa.array(per_row[texts].astype(np.int32), pa.int32())
        return columns


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """hidden: [b, L, h], mask: [b, L] → [b, h], as the model's sentence-transformers config pools."""
    import torch

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
