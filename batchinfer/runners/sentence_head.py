"""A sentence-transformers model's steps after the encoder (backends/sentence_modules.py), in torch, computed
as sentence-transformers 6 computes them (sentence_transformer/modules/pooling.py, base/modules/dense.py,
layer_norm.py, normalize.py) on right-padded batches; in f32, whatever the encoder ran in. The same module runs
on the torch backend and is traced into the OpenVINO graph."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..backends.sentence_modules import Dense, LayerNorm, Normalize, SentenceModel, weights_of


class SentenceHead(torch.nn.Module):
    """hidden: [b, L, h], mask: [b, L] (1: a real token, right padding) → [b, width]."""

    def __init__(self, model: SentenceModel, path: Path):
        super().__init__()
        self.pooling = model.steps[0]  # Pooling first, then the modules on the sentence embedding
        self.layers = torch.nn.ModuleList(_layer(step, path) for step in model.steps[1:])
        self.requires_grad_(False)  # weights a tracer takes as constants

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = hidden.float()
        pooled = torch.cat([pool(hidden, mask, mode) for mode in self.pooling.modes], dim=-1)
        for layer in self.layers:
            pooled = layer(pooled)
        return pooled


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden: [b, L, h], mask: [b, L] → [b, h], one of sentence-transformers' pooling modes."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1  # right padding: the last real token of each row
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    if mode == "weightedmean":  # token i (from 1) weighs i
        weights = (
            weights * torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)[None, :, None]
        )
    total = (hidden * weights).sum(dim=1)
    count = weights.sum(dim=1).clamp(min=1e-9)
    return total / (count.sqrt() if mode == "mean_sqrt_len_tokens" else count)


class _Dense(torch.nn.Module):
    def __init__(self, step: Dense, weights: dict):
        super().__init__()
        self.linear = torch.nn.Linear(step.in_features, step.out_features, bias=step.bias)
        module, _, name = step.activation.rpartition(".")
        self.activation_function = getattr(importlib.import_module(module), name)()  # its name in the weights
        self.residual = step.residual and (
            torch.nn.Identity()
            if step.in_features == step.out_features
            else torch.nn.Linear(step.in_features, step.out_features, bias=False)
        )
        self.load_state_dict(weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        return out + self.residual(x) if self.residual else out


class _LayerNorm(torch.nn.Module):
    def __init__(self, step: LayerNorm, weights: dict):
        super().__init__()
        self.norm = torch.nn.LayerNorm(step.dimension)
        self.load_state_dict(weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class _Normalize(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, p=2, dim=-1)


def _layer(step, path: Path) -> torch.nn.Module:
    if isinstance(step, Normalize):
        return _Normalize()
    weights = load_file(str(weights_of(path, step)))
    return _Dense(step, weights) if isinstance(step, Dense) else _LayerNorm(step, weights)


@functools.cache
def sentence_head(model: SentenceModel, path: Path, device: str = "cpu") -> SentenceHead:
    """The model's head, built once per process and device; with weights a tracer may take (a torch run builds
    it in inference mode, whose tensors a later OpenVINO conversion could not trace)."""
    with torch.inference_mode(False):
        return SentenceHead(model, path).to(device).eval()
