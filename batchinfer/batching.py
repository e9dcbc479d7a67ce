"""Token counts → batches. Pure functions: no I/O, no models, so they can be property-tested.

Rows are sorted longest first (an out-of-memory shows up in the first batch, not at 3 a.m.) and cut
so that rows x longest <= max_tokens and rows <= max_rows. Because each batch holds rows of nearly
the same length, padding is small; the chunk, thousands of rows, is the unit that gets sorted.
"""

from __future__ import annotations

import numpy as np


def plan_batches(lengths: np.ndarray, max_tokens: int, max_rows: int) -> list[np.ndarray]:
    """Indices into `lengths`, grouped into batches, longest rows first.

    A row longer than max_tokens gets a batch of its own: it cannot be split, and dropping it
    would lose it.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    # Stable sort on -length keeps equal-length rows in input order, so plans are deterministic.
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)  # sorted: the first row is the longest
        size = max(1, min(max_rows, max_tokens // longest))
        batches.append(order[start : start + size])
        start += size
    return batches


def padding_stats(lengths: np.ndarray, batches: list[np.ndarray]) -> tuple[int, int]:
    """(real tokens, padded tokens) the batches compute."""
    lengths = np.asarray(lengths, dtype=np.int64)
    real = int(lengths.sum())
    padded = sum(int(lengths[b].max()) * len(b) for b in batches if len(b))
    return real, padded
