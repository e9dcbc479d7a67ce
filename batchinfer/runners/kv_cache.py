"""The continuous-batching engine's KV cache sized from the job (its requests' lengths), not from the
machine, within generation.max_memory."""

from __future__ import annotations

import psutil
import torch

CPU_BATCH_TOKENS = 1024
DEFAULT_PAGE = 256  # transformers' own page size
MAX_IN_FLIGHT = 1024  # transformers' own fallback for max_requests_per_batch


def engine_options(
    options: dict, concurrency: int, page: int | None, cpu: bool, constrained: bool, seeded: bool
) -> dict:
    """`options` (generation.engine_options) with what batchinfer sets unless they say otherwise (pure).
    `constrained`: grammar masks run, which need each step's tokens before the next step is prepared.
    `seeded`: each request draws with its own generator (constrained/sampling.py), on the host at every step, which a
    captured CUDA graph would not repeat. The KV cache's size is left to cache_blocks."""
    options = dict(options)
    if constrained:
        options["use_async_batching"] = False
    if seeded:
        options.setdefault("use_cuda_graph", False)
    options.setdefault("max_requests_per_batch", concurrency)
    options.setdefault("page_size", page or DEFAULT_PAGE)
    if cpu:
        # On CPU each step builds a dense mask of batch tokens x cache tokens: 8,192 (the default) x 65,536
        # took 2.9 GB for the tiny example job; 1,024 takes 0.8 GB and runs 1.9x faster.
        options.setdefault("max_batch_tokens", CPU_BATCH_TOKENS)
    return options


def sized_by_user(options: dict) -> bool:
    """Whether engine_options size the cache themselves (then batchinfer does not)."""
    return "num_blocks" in options or "max_memory_percent" in options


def cache_blocks(lengths: list[int], page: int, concurrency: int, bytes_per_block: int, budget: int) -> int:
    """KV-cache blocks (of `page` tokens, every layer) for one chunk: enough for its `concurrency` longest
    requests (prompt plus max new tokens) at once, at most what `budget` bytes hold, and never fewer
    than its longest request needs. The cache is sized from the job, not from the machine."""
    pages = sorted((-(-n // page) for n in lengths), reverse=True) or [1]
    return max(pages[0], min(sum(pages[:concurrency]), budget // max(bytes_per_block, 1)))


def sequences_in_flight(budget: int, bytes_per_token: int, tokens_per_sequence: float, cap: int = MAX_IN_FLIGHT) -> int:
    """How many sequences of `tokens_per_sequence` tokens (prompt plus new ones) a KV cache of `budget` bytes holds
    at once, at most `cap` (pure). On a GPU this, not batching.max_rows, bounds continuous batching: an H200's
    free memory holds thousands of a small model's sequences, and a step costs little more for more of them."""
    return max(1, min(cap, int(budget // max(bytes_per_token * tokens_per_sequence, 1))))


def kv_bytes_per_block(config, dtype: torch.dtype, page: int) -> int:
    """Bytes of one cache block: keys and values of `page` tokens in every layer."""
    config = getattr(config, "get_text_config", lambda: config)()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * page * torch.empty((), dtype=dtype).element_size()


def memory_budget(max_memory: int | str, device: torch.device) -> int:
    """generation.max_memory (bytes, read by the config); auto: a quarter of the free memory on CPU, half the
    free GPU memory."""
    if max_memory != "auto":
        return int(max_memory)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return _available_ram() // 4


def _available_ram() -> int:
    return psutil.virtual_memory().available
