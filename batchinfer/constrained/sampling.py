"""A seed per request inside continuous batching. transformers seeds one generator for the whole engine,
so a sampled completion would depend on the requests it shares steps with, and a seed per request would
need an engine pass of its own. Here each request draws from its own generator, seeded with its seed: the
same request and seed give the same completion alone or beside any others, and requests with different
seeds share one pass.
"""

from __future__ import annotations

import torch
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
    so a step prepared ahead (asynchronous batching) still draws for the right request."""

    def __init__(self):
        self.generators: list[torch.Generator] = []
        self.slots: dict[str, int] = {}  # request id -> its generator's index

    def add(self, request_id: str, seed: int) -> None:
        self.slots[request_id] = len(self.generators)
        self.generators.append(torch.Generator().manual_seed(seed))

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        slots = [self.slots.get(future.state.request_id, -1) for future in requests_with_new_token]
        return torch.tensor(slots, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # scores: [rows, vocab], one row per request that gets a token this step
        slots = tensor_arg[: scores.size(0)].tolist()
        seeded = [row for row, slot in enumerate(slots) if slot >= 0]
        if not seeded:
            return scores
        draws = torch.stack([torch.rand((), generator=self.generators[slots[row]]) for row in seeded])
        rows = torch.tensor(seeded, device=scores.device)
        cumulative = scores[rows].float().softmax(-1).cumsum(-1)
        # the first token whose cumulative probability passes the draw: never one the warpers removed
        picked = torch.searchsorted(cumulative, draws.to(scores.device)[:, None], right=True)
        picked = picked.clamp_(max=scores.size(1) - 1).squeeze(1)
        scores[rows] = float("-inf")
        scores[rows, picked] = 0.0
        return scores
