"""batching: auto — the probe, on a model-free stand-in whose speed we choose."""

import numpy as np
import torch

from batchinfer.tune import CPU_BUDGETS, GPU_PROBE_TOKENS, gpu_budget, probe


def test_the_probe_keeps_the_fastest_budget_and_runs_every_row_once(monkeypatch):
    monkeypatch.setattr("batchinfer.tune.SAMPLE_TOKENS", 60_000)  # slices of several batches at every budget
    lengths = np.random.default_rng(1).integers(5, 120, size=8000)
    seen = []

    def run(batches, strategy):
        """Fastest for batches of about 6,000 tokens (so a budget of 8,192 wins); packed 50% faster."""
        rows = np.concatenate(batches)
        seen.extend(rows.tolist())
        size = max(int(lengths[b].sum() if strategy == "packed" else lengths[b].max() * len(b)) for b in batches)
        speed = 1000.0 / (1 + abs(np.log2(size / 6000))) * (1.5 if strategy == "packed" else 1.0)
        return float(lengths[rows].sum() / speed)

    tuning, rest = probe(lengths, run, "auto", "auto", 256, torch.device("cpu"), packable=True)
    assert tuning.max_tokens == 8192 and tuning.strategy == "packed"
    assert {f"padded@{b}" for b in CPU_BUDGETS} <= set(tuning.tokens_per_s)
    assert sorted(seen + rest.tolist()) == list(range(8000))  # the slices are real work: no row twice, none lost


def test_a_pinned_budget_probes_the_strategy_only():
    lengths = np.full(500, 40)
    tuning, _ = probe(
        lengths,
        lambda batches, strategy: 1.0 if strategy == "padded" else 2.0,
        4096,
        "auto",
        64,
        torch.device("cpu"),
        packable=True,
    )
    assert tuning.max_tokens == 4096 and tuning.strategy == "padded"


def test_gpu_budget_fits_half_the_free_memory():
    assert gpu_budget(bytes_per_token=100_000, free_bytes=80 * 2**30) == 262144  # capped
    assert gpu_budget(bytes_per_token=1_000_000, free_bytes=16 * 2**30) == 8192
    assert gpu_budget(bytes_per_token=1e9, free_bytes=2**30) == GPU_PROBE_TOKENS  # never below the probe batch
