"""batching: auto — the probe, on a model-free stand-in whose speed we choose."""

import numpy as np
import pytest
import torch

from batchinfer.batching import probe as probing
from batchinfer.batching.probe import CPU_BUDGETS, GPU_PROBE_TOKENS, Candidate, Tuning, gpu_budget, overhead, probe

TORCH = Candidate("torch", packs=True, reference=True)
PADDED_TORCH = Candidate("torch", reference=True)  # a model packing does not cover
OPENVINO = Candidate("openvino", budget=4096)


def test_the_probe_keeps_the_fastest_budget_and_runs_every_row_once(monkeypatch):
    lengths = np.random.default_rng(1).integers(5, 120, size=12000)
    seen, cut = [], {}
    real_cut = probing.cut_batches

    def cut_batches(lengths, max_tokens, strategy, max_rows, device):  # remembers the budget the stand-in runs at
        cut["budget"] = max_tokens
        return real_cut(lengths, max_tokens, strategy, max_rows, device)

    def run(batches, strategy, backend):
        """8,192 is clearly faster than the default 16,384; packed 50% faster than padded."""
        rows = np.concatenate(batches)
        seen.extend(rows.tolist())
        speed = {2048: 500, 4096: 800, 8192: 1000, 16384: 850, 32768: 600}.get(cut.get("budget"), 500)
        return float(lengths[rows].sum() / (speed * (1.5 if strategy == "packed" else 1.0)))

    monkeypatch.setattr("batchinfer.batching.probe.cut_batches", cut_batches)
    tuning, rest = probe(lengths, run, "auto", "auto", 256, torch.device("cpu"), (TORCH,))
    assert tuning.max_tokens == 8192 and tuning.strategy == "packed"
    assert {f"padded@{b}" for b in CPU_BUDGETS} <= set(tuning.tokens_per_s)
    assert sorted(seen + rest.tolist()) == list(range(12000))  # the slices are real work: no row twice, none lost


def test_a_pinned_budget_probes_the_strategy_only():
    lengths = np.full(500, 40)
    tuning, _ = probe(
        lengths,
        lambda batches, strategy, backend: 1.0 if strategy == "padded" else 2.0,
        4096,
        "auto",
        64,
        torch.device("cpu"),
        (TORCH,),
    )
    assert tuning.max_tokens == 4096 and tuning.strategy == "padded"


def _stand_in(lengths, speeds: dict, seen: list | None = None):
    """run() of a model whose tokens/s per (backend, strategy) we choose, with a tiny noise-free cost."""

    def run(batches, strategy, backend):
        rows = np.concatenate(batches)
        if seen is not None:
            seen.extend(rows.tolist())
        return float(lengths[rows].sum() / speeds[backend, strategy])

    return run


def test_the_probe_picks_the_backend_that_is_clearly_faster_and_runs_every_row_once():
    lengths = np.random.default_rng(2).integers(5, 120, size=6000)
    seen = []
    speeds = {("openvino", "padded"): 1000.0, ("torch", "padded"): 3000.0, ("torch", "packed"): 3100.0}
    tuning, rest = probe(
        lengths, _stand_in(lengths, speeds, seen), 4096, "auto", 256, torch.device("cpu"), (OPENVINO, TORCH)
    )
    assert tuning.backend == "torch" and tuning.strategy == "padded"  # packed is within noise of padded
    assert {"openvino:padded@4096 (1/4 slice)", "padded@4096 (1/4 slice)"} <= set(tuning.tokens_per_s)
    assert tuning.backends == {"openvino": 1000, "torch": 3000}
    assert any("strategy: no candidate clearly faster than padded" in note for note in tuning.notes)
    assert sorted(seen + rest.tolist()) == list(range(6000))


def test_a_backend_within_noise_of_the_default_keeps_the_default():
    lengths = np.full(4000, 50)
    speeds = {("openvino", "padded"): 1000.0, ("torch", "padded"): 1050.0}
    tuning, _ = probe(lengths, _stand_in(lengths, speeds), 4096, "padded", 64, torch.device("cpu"), (OPENVINO, TORCH))
    assert tuning.backend == "openvino" and "backend: no candidate clearly faster than openvino, kept" in tuning.notes


def test_two_leaders_within_noise_are_measured_again():
    lengths = np.full(8000, 50)
    calls = []
    rates = iter([1000.0, 1040.0, 1600.0, 1000.0])  # default, the other; within noise: once more each, leader first

    def run(batches, strategy, backend):
        rows = np.concatenate(batches)
        if len(rows) > 8:  # not the warm-up
            calls.append(backend)
            return float(lengths[rows].sum() / next(rates))
        return 0.0

    tuning, _ = probe(lengths, run, 4096, "padded", 64, torch.device("cpu"), (OPENVINO, TORCH))
    assert calls == ["openvino", "torch", "torch", "openvino"]
    assert tuning.tokens_per_s == {"openvino:padded@4096 (1/4 slice)": 1000, "padded@4096 (1/4 slice)": 1320}
    assert tuning.backend == "torch"


def test_slices_too_fast_to_measure_keep_the_defaults():
    lengths = np.full(3000, 20)
    tuning, _ = probe(
        lengths, lambda batches, strategy, backend: 1e-4, "auto", "auto", 64, torch.device("cpu"), (TORCH,)
    )
    assert (tuning.max_tokens, tuning.strategy) == (16384, "padded") and tuning.tokens_per_s == {}
    assert any("too little work to measure" in note for note in tuning.notes)


def test_gpu_budget_fits_half_the_free_memory():
    assert gpu_budget(bytes_per_token=100_000, free_bytes=80 * 2**30) == 262144  # capped
    assert gpu_budget(bytes_per_token=1_000_000, free_bytes=16 * 2**30) == 8192
    assert gpu_budget(bytes_per_token=1e9, free_bytes=2**30) == GPU_PROBE_TOKENS  # never below the probe batch


def test_every_candidate_runs_the_same_length_mix_so_equal_speeds_measure_equal():
    """Attention costs more per token on long rows: slices with different length mixes would rate the same
    kernel apart. Every candidate's slice holds the chunk's mix, so candidates of one true speed measure
    within 5% of each other, and none replaces the default."""
    for seed in range(6):
        # real text: many short rows, a long tail cut at max_length
        lengths = np.clip(np.random.default_rng(seed).lognormal(3.5, 0.9, size=4096), 4, 512).astype(np.int64)

        def run(batches, strategy, backend, lengths=lengths):
            rows = np.concatenate(batches)
            return float((lengths[rows] * (1 + lengths[rows] / 64)).sum() / 1e5)  # every budget equally fast

        tuning, _ = probe(lengths, run, "auto", "padded", 256, torch.device("cpu"), (PADDED_TORCH,))
        rates = [tuning.tokens_per_s[f"padded@{b}"] for b in CPU_BUDGETS]
        assert max(rates) <= 1.05 * min(rates), (seed, tuning.tokens_per_s)
        assert tuning.max_tokens == probing.DEFAULT_BUDGET, (seed, tuning.tokens_per_s)


def test_the_probes_overhead_is_its_losing_slices_at_their_rates_not_its_whole_time():
    """A probe's slices are rows its chunk runs anyway: what it adds is each losing slice's time at its rate
    beyond the winner's, a backend's quarter slice as a quarter; the winner's own slices and faster ones add none."""
    rates = {"openvino:padded@4096": 2000.0, "padded@4096 (1/4 slice)": 500.0, "openvino:padded@2048": 1000.0}
    rates |= {"openvino:padded@8192": 2500.0}  # measured faster on its slice, yet not clearly: adds nothing
    tuning = Tuning(4096, "padded", "openvino", rates, winner="openvino:padded@4096")
    expected = 16384 / 4 * (1 / 500 - 1 / 2000) + 16384 * (1 / 1000 - 1 / 2000)
    assert overhead(tuning, 2000.0, 16384) == pytest.approx(expected)


def _timed(lengths, rates: dict[str, list[float]], seen: list):
    """run() whose backends time their slices (not the warm-ups) at the tokens/s `rates` lists, the last repeating."""

    def run(batches, strategy, backend):
        rows = np.concatenate(batches)
        if len(rows) <= 8:  # the warm-up
            return 0.0
        seen.append(backend)
        left = rates[backend]
        return float(lengths[rows].sum() / (left.pop(0) if len(left) > 1 else left[0]))

    return run


def test_a_backend_timed_under_half_its_best_known_rate_is_timed_again_before_its_rate_counts():
    """A loaded machine timed torch at 1,157 tokens/s where it ran 4,226 before: timed once more, the low rate
    dropped; the choice is made on the second timing."""
    lengths, seen = np.full(8000, 50), []
    known = Candidate("torch", reference=True, known=4226.0)
    run = _timed(lengths, {"openvino": [5550.0], "torch": [1157.0, 4300.0]}, seen)
    tuning, _ = probe(lengths, run, 4096, "padded", 64, torch.device("cpu"), (OPENVINO, known))
    assert tuning.backends == {"openvino": 5550, "torch": 4300}  # not 1,157, nor its mean with 4,300
    assert seen[:3] == ["openvino", "torch", "torch"]
    assert any("torch timed at 1,157 tokens/s, under half the 4,226" in note for note in tuning.notes)
    assert tuning.load is not None and tuning.load.seconds > 0  # the load the rates were timed under, kept with them


def test_a_second_low_timing_is_kept_and_a_backend_with_no_known_rate_is_not_timed_again():
    lengths, seen = np.full(8000, 50), []
    known = Candidate("torch", reference=True, known=4226.0)
    run = _timed(lengths, {"openvino": [1000.0], "torch": [1157.0, 1200.0]}, seen)
    tuning, _ = probe(lengths, run, 4096, "padded", 64, torch.device("cpu"), (OPENVINO, known))
    assert tuning.backends == {"openvino": 1000, "torch": 1200} and seen.count("openvino") == 1
    assert sum("timed again" in note for note in tuning.notes) == 1
