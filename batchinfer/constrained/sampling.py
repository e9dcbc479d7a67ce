"""A seed per request inside continuous batching. transformers seeds one generator for the whole engine,
so a sampled completion would depend on the requests it shares steps with, and a seed per request would
need an engine pass of its own. Here each request draws from its own generator, seeded with its seed: the
same request and seed give the same completion alone or beside any others, and requests with different
seeds share one pass.
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch
from transformers.generation import LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor


class RequestHook(ContinuousBatchingLogitsProcessor):
    """A per-request logits processor in transformers' continuous batching: each step it is handed the
    requests that get a token (prepare_tensor_args, one int32 per row, -1 for none) and then their logits."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def install(self, manager, first: bool = False) -> None:
        """Add to `manager`'s processors before it starts (its argument storage is sized from their count):
        first, before temperature, top-k and top-p, or last, after them."""
        processors = manager.logit_processor
        processors.logits_processor.insert(0 if first else len(processors.logits_processor), self)
        processors.tensors_required += 1
        processors.do_processing = True

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)


class SeededSampling(RequestHook):
    """Last of the engine's processors: from the distribution its warpers left (temperature, top-k, top-p),
    each seeded request draws its token with its own generator and keeps only that token, which the
    engine's own sampling then picks. A row's generator travels in the step's tensor argument (its slot),
    so a step prepared ahead (asynchronous batching) still draws for the right request.

    In a greedy engine (serve's), a request may bring its own warpers: transformers' own, built from its
    settings as the sampling engine builds them (sampling_warpers); they warp its row before the draw, and
    the engine's argmax picks the kept token. Rows without a slot keep the engine's greedy token."""

    def __init__(self):
        self.slots: dict[str, int] = {}  # request id -> its slot
        self.drawers: dict[int, tuple[torch.Generator, Callable | None]] = {}  # slot -> generator, warpers
        self.taken = itertools.count()

    def add(self, request_id: str, seed: int, warpers: Callable | None = None) -> None:
        slot = next(self.taken)
        self.drawers[slot] = (torch.Generator().manual_seed(seed), warpers)
        self.slots[request_id] = slot

    def drop(self, request_id: str) -> None:
        """Free a finished request's generator (serve's requests come and go)."""
        self.drawers.pop(self.slots.pop(request_id, -1), None)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        slots = [self.slots.get(future.state.request_id, -1) for future in requests_with_new_token]
        return torch.tensor(slots, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # scores: [rows, vocab], one row per request that gets a token this step
        slots = tensor_arg[: scores.size(0)].tolist()
        # get, not []: serve drops a cancelled request's generator from another thread, maybe mid-step
        found = ((row, self.drawers.get(slot)) for row, slot in enumerate(slots))
        drawers = {row: drawer for row, drawer in found if drawer is not None}
        if not drawers:
            return scores
        seeded = list(drawers)
        for row, (_, warpers) in drawers.items():
            if warpers is not None:  # [1, vocab]: transformers' warpers read no input ids
                scores[row : row + 1] = warpers(None, scores[row : row + 1])
        draws = torch.stack([torch.rand((), generator=drawers[row][0]) for row in seeded])
        rows = torch.tensor(seeded, device=scores.device)
        cumulative = scores[rows].float().softmax(-1).cumsum(-1)
        # the first token whose cumulative probability passes the draw: never one the warpers removed
        picked = torch.searchsorted(cumulative, draws.to(scores.device)[:, None], right=True)
        picked = picked.clamp_(max=scores.size(1) - 1).squeeze(1)
        scores[rows] = float("-inf")
        scores[rows, picked] = 0.0
        return scores


def sampling_warpers(model, greedy, sampled) -> Callable | None:
    """The warpers (temperature, top-k, top-p, and any the model's generation_config adds) that transformers
    applies when decoding with `sampled` and not with `greedy` (two transformers GenerationConfigs): the tail
    of its logits processors past the greedy ones, which come first in the same order. None when the greedy
    ones are not such a prefix (a watermark or renormalization, which transformers puts last)."""
    first, every = model._get_logits_processor(greedy), model._get_logits_processor(sampled)
    if [type(p) for p in every[: len(first)]] != [type(p) for p in first]:
        return None
    return LogitsProcessorList(every[len(first) :])
