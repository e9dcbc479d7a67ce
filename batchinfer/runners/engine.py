"""The generation engines' one protocol: a pass of token prompts in, each row's generated tokens out.

Three engines implement it: continuous batching (continuous.py, transformers' paged KV cache), static
`model.generate` batches (static.py, the baseline) and vLLM (vllm_engine.py). The generate runner cuts rows,
text and finish reasons around them; serve drives the continuous engine's running batch itself."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..constrained.spec import Constraint
from ..job.config import GenerationConfig


@dataclass
class PassRows:
    """One engine pass's rows, every list in their order."""

    settings: list[GenerationConfig]  # each row's own (seed, stop: its own; the pass shares the rest)
    prompts: list[list[int]]  # token ids
    max_new: list[int]
    constraints: list[Constraint | None]  # the grammar a row's output must follow; None: free


@dataclass
class PassOutput:
    """What one engine pass gives back, per row of the pass in its order."""

    raw: list[tuple[list[int], str | None]]  # (generated tokens, the engine's error message or None)
    first_token_seconds: list[float] = field(default_factory=list)  # rows that report it, in any order
    prefix_hits: list[int] | None = None  # prompt tokens read from the engine's cache; None: it shares none


class Engine(Protocol):
    shared_page: int | None  # the cache page (tokens) in which rows' common prefixes are shared; None: none

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """One pass over rows whose settings the engine can take together (engine_passes), at most max_rows
        at once where the engine does not schedule them itself; `check` is called while waiting and may
        raise to stop (Ctrl-C)."""
        ...


def generation_config(model, gen: GenerationConfig, max_new_tokens: int, pad_id: int):
    """transformers' GenerationConfig for decoding with `gen`'s settings, up to max_new_tokens."""
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens = max_new_tokens
    config.do_sample = gen.temperature > 0
    if config.do_sample:
        config.temperature, config.top_p, config.top_k = gen.temperature, gen.top_p, gen.top_k or None
    else:
        config.temperature, config.top_p, config.top_k = None, None, None
    config.pad_token_id = pad_id
    return config


def engine_passes(settings: list[GenerationConfig], engine: str, skip=()) -> list[list[int]]:
    """Row positions (but those in `skip`) grouped into the engine passes their settings need. vllm: one
    pass, every row with its own settings. transformers: one per (temperature, top_p), a row's seed being
    its own inside the pass (constrained/sampling.py). static, the baseline: seeds one generator per batch, so sampled
    rows also part by seed. Greedy rows share one pass whatever their seed or top_p (neither changes a
    greedy completion), and stop strings never part rows: each row's are cut from its own text."""
    passes: dict[tuple, list[int]] = {}
    for position, gen in enumerate(settings):
        if position in skip:
            continue
        if engine == "vllm":
            key: tuple = ()
        elif gen.temperature == 0:
            key = ("greedy",)
        else:
            key = (gen.temperature, gen.top_p) + ((gen.seed,) if engine == "static" else ())
        passes.setdefault(key, []).append(position)
    return list(passes.values())
