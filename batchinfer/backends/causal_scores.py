"""Label scoring's Scorer on torch (backends/base.py): a causal LM's log-probabilities of chosen tokens, a padded
batch run under its own attention masks, after a prefix's KV cache where the batch follows one.

The LM head runs on the scored positions alone where it gives the model's own logits there (checked once, at load;
not so for models that scale or cap their logits after the head), not on every token.

In a causal model a prefix's states do not depend on what follows it, so a batch run after the prefix's cache, at
the positions that follow it, gives the scores of the whole prompts run at once (runners/prefix.py finds the
prefix). PrefixCache keeps the last PREFIXES_KEPT prefixes' states.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .base import Targets

PREFIXES_KEPT = 4  # distinct prefixes whose KV cache a runner keeps (a job's chunks usually share one)


class TorchScorer:
    """A transformers causal LM on its device, scoring Targets."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.head_ok = _head_shortcut_agrees(model, device)
        self.body = model.base_model if self.head_ok else model  # what runs a batch's tokens
        self.prefix_problem = PrefixCache.problem(self.body)
        self.prefixes = PrefixCache(self.body, device) if self.prefix_problem is None else None

    @torch.inference_mode()
    def logprobs(self, batch: Targets) -> np.ndarray:
        """log p(target token) at each flat position `at` of the batch: [n], float64."""
        inputs = {
            "input_ids": torch.from_numpy(batch.input_ids).to(self.device),
            "position_ids": torch.from_numpy(batch.position_ids).to(self.device),
            "attention_mask": torch.from_numpy(batch.mask).to(self.device)[:, None],  # [b, 1, L, prefix + L]
        }
        cache = self.prefixes.expanded(batch.prefix, len(batch.input_ids)) if batch.prefix else {}
        at = torch.from_numpy(batch.at).to(self.device)
        if self.head_ok:
            hidden = self.body(**inputs, **cache).last_hidden_state  # [b, L, hidden]
            logits = self.model.get_output_embeddings()(hidden.reshape(-1, hidden.shape[-1])[at])  # [n, vocab]
        else:
            logits = self.body(**inputs, **cache).logits
            logits = logits.reshape(-1, logits.shape[-1])[at]
        logprobs = logits.float().log_softmax(dim=-1)
        target = torch.from_numpy(batch.target).to(self.device)[:, None]
        return logprobs.gather(1, target)[:, 0].double().cpu().numpy()


class PrefixCache:
    """The KV caches of the prefixes a model has prefilled, the last PREFIXES_KEPT of them, each handed to a
    batch expanded to its rows as views, not copied per row."""

    def __init__(self, body: torch.nn.Module, device: torch.device):
        self.body, self.device = body, device  # the model, or its base model when the head runs apart
        self.argument = _cache_argument(body)
        self.states = functools.lru_cache(maxsize=PREFIXES_KEPT)(self.prefill)

    @staticmethod
    def problem(body: torch.nn.Module) -> str | None:
        """Why a prefix cannot be reused with this model (one that takes no cache, or whose cache layers are not
        plain growing ones: sliding windows, shared or recurrent states), or None."""
        if _cache_argument(body) is None:
            return "its forward takes no cache"
        if not all(type(layer) is DynamicLayer for layer in DynamicCache(config=body.config).layers):
            return "its cache layers are not all full attention"
        return None

    def prefill(self, prefix: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the prefix's keys and values: [1, kv heads, prefix, head dim] each (`states` keeps them)."""
        cache = DynamicCache(config=self.body.config)
        self.body(input_ids=torch.tensor([prefix], device=self.device), use_cache=True, **{self.argument: cache})
        return [(layer.keys, layer.values) for layer in cache.layers]

    def expanded(self, prefix: tuple[int, ...], rows: int) -> dict:
        """The model's cache argument for a batch of `rows` run after `prefix`: a fresh DynamicCache (the forward
        grows it; the kept states stay as they are) whose layers view the prefix's states [rows, heads, prefix,
        dim] without copying them per row: the forward's concatenation with the batch's own states copies once."""
        cache = DynamicCache(ddp_cache_data=self.states(prefix))
        for layer in cache.layers:
            layer.keys = layer.keys.expand(rows, -1, -1, -1)
            layer.values = layer.values.expand(rows, -1, -1, -1)
        return {self.argument: cache}


def _head_shortcut_agrees(model, device: torch.device) -> bool:
    """Whether the output embeddings over the base model's last hidden states are the model's logits
    (not so for models that scale or cap their logits after the head)."""
    base, head = getattr(model, "base_model", None), model.get_output_embeddings()
    if base is None or base is model or head is None:
        return False
    ids = torch.arange(1, 9, device=device)[None] % model.config.get_text_config().vocab_size
    with torch.inference_mode():
        full = model(input_ids=ids).logits.float()
        short = head(base(input_ids=ids).last_hidden_state).float()
    return bool(torch.allclose(full, short, atol=1e-4, rtol=1e-4))


def _cache_argument(body: torch.nn.Module) -> str | None:
    """The name under which the model's forward takes a cache (transformers 5.24 renamed past_key_values to
    cache; the old name warns until 5.40), or None."""
    params = inspect.signature(body.forward).parameters
    return next((name for name in ("cache", "past_key_values") if name in params), None)
