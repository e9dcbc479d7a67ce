"""batching: auto — a short probe on the job's own rows that picks max_tokens and the strategy.

The probe runs the first chunk: each candidate setting gets its own random slice of the chunk's
rows and is timed in real tokens per second; the rest of the chunk, and the job, run with the
winner. Nothing is computed twice: the slices' results are the chunk's results. On a CPU the
fastest budget wins (small enough to stay in cache, large enough to amortise per-batch overhead;
measured on MiniLM, 2 cores: 4,096 beats 16,384 by 6%); on a GPU the budget is the largest whose
activations fit in half the free memory, measured on one slice and scaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .batching import OVERHEAD_TOKENS, plan_batches, plan_packed

CPU_BUDGETS = (2048, 4096, 8192, 16384, 32768)
SAMPLE_TOKENS = 16384  # per candidate: ~2 s for MiniLM on 2 CPU cores, spent on real rows
GPU_PROBE_TOKENS = 8192
GPU_MEMORY_SHARE = 0.5  # of the memory free after loading the model: headroom for fragmentation and long rows
GPU_MAX_BUDGET = 1 << 18
DEFAULT_BUDGET = 16384  # when the probe cannot measure (too few rows)


@dataclass
class Tuning:
    max_tokens: int
    strategy: str
    tokens_per_s: dict[str, float] = field(default_factory=dict)  # "padded@8192" -> measured rate

    def describe(self) -> str:
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in self.tokens_per_s.items())
        return f"batching: {self.strategy}, max_tokens {self.max_tokens}" + (f" (tokens/s: {rates})" if rates else "")


def plan(lengths: np.ndarray, max_tokens: int, strategy: str, max_rows: int, device: torch.device) -> list[np.ndarray]:
    if strategy == "packed":
        return plan_packed(lengths, max_tokens, max_rows)
    return plan_batches(lengths, max_tokens, max_rows, OVERHEAD_TOKENS.get(device.type, OVERHEAD_TOKENS["cuda"]))


def gpu_budget(bytes_per_token: float, free_bytes: int) -> int:
    """The largest power-of-two budget whose activations fit in GPU_MEMORY_SHARE of free memory."""
    fits = GPU_MEMORY_SHARE * free_bytes / max(bytes_per_token, 1.0)
    budget = GPU_PROBE_TOKENS
    while budget * 2 <= min(fits, GPU_MAX_BUDGET):
        budget *= 2
    return budget


# run(batches, strategy) -> seconds: runs batches of positions and keeps their results.
RunBatches = Callable[[list[np.ndarray], str], float]


def probe(
    lengths: np.ndarray,
    run: RunBatches,
    max_tokens: int | str,
    strategy: str,
    max_rows: int,
    device: torch.device,
    packable: bool,
) -> tuple[Tuning, np.ndarray]:
    """Settle `auto` in max_tokens and strategy on the first chunk's rows (their token `lengths`).

    Each candidate runs its own random slice of about SAMPLE_TOKENS tokens, whose results are kept,
    so every row still runs exactly once. Returns the choice and the positions not yet run."""
    strategies = (
        ["padded", "packed"] if strategy == "auto" and packable else [strategy if strategy != "auto" else "padded"]
    )
    left = np.random.default_rng(0).permutation(len(lengths))
    rates: dict[str, float] = {}
    # A small first chunk (a short shard) still gets a slice per candidate, each a little noisier.
    budgets = 0 if max_tokens != "auto" else (1 if device.type == "cuda" else len(CPU_BUDGETS))
    slice_tokens = min(SAMPLE_TOKENS, int(lengths.sum()) // (budgets + len(strategies) + 1))
    run([left[:8]], strategies[0])  # warm-up (first-call allocations, kernel choice), kept like the rest
    left = left[8:]

    def measure(budget: int, how: str) -> float:
        nonlocal left
        take = int(np.searchsorted(np.cumsum(lengths[left]), slice_tokens)) + 1
        part, left = left[:take], left[take:]
        if not len(part):
            return 0.0
        seconds = run([part[b] for b in plan(lengths[part], budget, how, max_rows, device)], how)
        rates[f"{how}@{budget}"] = float(lengths[part].sum() / max(seconds, 1e-9))
        return rates[f"{how}@{budget}"]

    if max_tokens != "auto":
        budget = max_tokens
    elif device.type == "cuda":
        budget = gpu_budget(_bytes_per_token(measure), torch.cuda.mem_get_info(device)[0])
    else:
        measured = {b: measure(b, strategies[0]) for b in CPU_BUDGETS}
        budget = max(measured, key=measured.get) if any(measured.values()) else DEFAULT_BUDGET
    if len(strategies) > 1:
        measured = {how: rates.get(f"{how}@{budget}") or measure(budget, how) for how in strategies}
        best = max(measured, key=measured.get)
    else:
        best = strategies[0]
    return Tuning(budget, best, rates), left


def _bytes_per_token(measure: Callable[[int, str], float]) -> float:
    """Peak activation memory per padded token, from one padded slice cut at GPU_PROBE_TOKENS."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    measure(GPU_PROBE_TOKENS, "padded")
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / GPU_PROBE_TOKENS
