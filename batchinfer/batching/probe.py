"""batching: auto and model.backend: auto — a short probe on the job's own rows that picks the backend,
max_tokens and the strategy.

The probe runs the first chunk: each candidate setting gets its own slice of the chunk's rows, each slice
with the chunk's mix of lengths, and is timed in real tokens per second; the rest of the chunk, and the job,
run with the winner. Nothing is computed twice: the slices' results are the chunk's results. A candidate
must beat the default by more than NOISE (10%) to replace it, and two leaders that close are measured again,
so a busy machine does not pick a different setting every run. On a CPU the fastest budget wins (small
enough to stay in cache, large enough to amortise per-batch overhead); on a GPU the budget is the largest
whose activations fit in half the free memory, measured on one slice and scaled.

The backends' rates are kept for later jobs with the machine's load while they were timed (Tuning.load), and a
backend timed at under half the best rate it ran this model at here before (Candidate.known) is timed again before
the rate is kept: a machine loaded by other processes once timed torch at 1,157 tokens/s against its 4,226.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..machine import Load, LoadWindow
from .cut import cut_batches

if TYPE_CHECKING:  # imported where a GPU is measured: a warm OpenVINO run never imports torch
    import torch

CPU_BUDGETS = (2048, 4096, 8192, 16384, 32768)
SAMPLE_TOKENS = 16384  # per candidate: ~2 s for MiniLM on 2 CPU cores, spent on real rows
GPU_PROBE_TOKENS = 8192
GPU_MEMORY_SHARE = 0.5  # of the memory free after loading the model: headroom for fragmentation and long rows
GPU_MAX_BUDGET = 1 << 18
# When the probe cannot measure (too few rows), and the one a candidate must beat, unless the backend says
# otherwise (its default_budget).
DEFAULT_BUDGET = 16384
# The most of a chunk's tokens a bounded probe (share=) runs in its slices: a causal LM scoring labels on a CPU
# computes a few hundred tokens a second, and its first chunk is often a whole --limit trial.
PROBE_SHARE = 0.10


@dataclass(frozen=True)
class Candidate:
    """A backend as the probe weighs it (runners/base.py builds these from backends.base.Backend)."""

    name: str
    packs: bool = False  # it can run this task's batches packed: padded and packed are compared on it
    budget: int = DEFAULT_BUDGET  # its max_tokens when the probe leaves it at the default
    reference: bool = False  # the model's own library (torch): its keys carry no name, as records before backends did
    known: float = 0.0  # the best tokens/s it ran this model at in the backend comparison here before (0: none)

    def key(self, how: str, budget: int, share: int = 1) -> str:
        """The name its measurements go by: "padded@8192" (the reference) or "openvino:padded@8192", and the share
        of a slice it was measured on."""
        name = f"{how}@{budget}" if self.reference else f"{self.name}:{how}@{budget}"
        return name + (f" (1/{share} slice)" if share > 1 else "")


@dataclass
class Tuning:
    max_tokens: int
    strategy: str
    backend: str
    # Candidate.key -> tokens/s, averaged over repeats; only measurements long enough to tell (MIN_SECONDS) are kept
    tokens_per_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    backends: dict[str, float] = field(default_factory=dict)  # each backend's tokens/s, where both were timed
    seconds: float = 0.0  # the probe's wall time: its warm-up and timed slices (whose results are kept)
    rows: int = 0  # the chunk's items the probe ran
    winner: str = ""  # the chosen setting's key in tokens_per_s
    load: Load | None = None  # the machine's load while the probe timed (None off Linux)

    def describe(self) -> str:
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in self.tokens_per_s.items())
        return (
            f"batching: {self.strategy}, max_tokens {self.max_tokens}, backend {self.backend}"
            + (f" (tokens/s: {rates})" if rates else "")
            + "".join(f"; {note}" for note in self.notes)
        )


def gpu_budget(bytes_per_token: float, free_bytes: int) -> int:
    """The largest power-of-two budget whose activations fit in GPU_MEMORY_SHARE of free memory."""
    fits = GPU_MEMORY_SHARE * free_bytes / max(bytes_per_token, 1.0)
    budget = GPU_PROBE_TOKENS
    while budget * 2 <= min(fits, GPU_MAX_BUDGET):
        budget *= 2
    return budget


# run(batches, strategy, backend name) -> seconds: runs batches of positions and keeps their results.
RunBatches = Callable[[list[np.ndarray], str, str], float]
NOISE = 0.10  # rates closer than this are a tie: measured once more, and a tie that stays keeps the default
MIN_SECONDS = 0.05  # a slice done faster than this measures per-batch overheads, not the model: not compared
DOUBTFUL = 0.5  # of a backend's best known rate: a backend timed below it is timed again before the rate is kept


def probe(
    lengths: np.ndarray,
    run: RunBatches,
    max_tokens: int | str,
    strategy: str,
    max_rows: int,
    device: torch.device,
    backends: tuple[Candidate, ...],
    share: float | None = None,
) -> tuple[Tuning, np.ndarray]:
    """Settle `auto` in the backend, max_tokens and strategy on the first chunk's rows (their token `lengths`),
    among `backends` (the default first).

    Each candidate runs its own slice of about SAMPLE_TOKENS tokens, whose results are kept, so every row
    still runs exactly once; every slice holds the chunk's mix of lengths (Slices), so candidates compare
    equal work. In turn: the backend (each at the default budget, padded), the budget on
    that backend, then padded against packed (where it packs). A candidate replaces the default only when it is
    faster by more than NOISE; the two leaders are measured again when they are that close. `share`: the most
    of the chunk's tokens the slices may hold (None: up to SAMPLE_TOKENS a candidate); such a bounded probe does not
    run a budget search whose slices would fit one batch of every candidate budget, so that they all cut alike: the
    default stays, with a note; and with nothing else to compare it runs no row. Returns the choice and the
    positions not yet run."""
    strategies, slice_tokens = candidates(int(lengths.sum()), max_tokens, strategy, device, backends, share)
    started, window = time.perf_counter(), LoadWindow()
    tuning, rest = Probe(
        lengths, run, max_tokens, max_rows, device, backends, strategies, slice_tokens, share is not None
    ).settle()
    tuning.seconds, tuning.rows = round(time.perf_counter() - started, 3), len(lengths) - len(rest)
    tuning.load = window.stop()
    return tuning, rest


def candidates(
    chunk_tokens: int,
    max_tokens: int | str,
    strategy: str,
    device: torch.device,
    backends: tuple[Candidate, ...],
    share: float | None = None,
) -> tuple[list[str], int]:
    """The strategies the probe of a chunk of `chunk_tokens` tokens compares, and the tokens of each slice (at most
    `share` of the chunk's tokens in all, where the probe is bounded)."""
    packable = any(backend.packs for backend in backends)
    strategies = (
        ["padded", "packed"] if strategy == "auto" and packable else [strategy if strategy != "auto" else "padded"]
    )
    # A small first chunk (a short shard) still gets a slice per candidate (and two repeats), each noisier.
    budgets = 0 if max_tokens != "auto" else (1 if device.type == "cuda" else len(CPU_BUDGETS))
    count = budgets + len(strategies) + (len(backends) if len(backends) > 1 else 0) + 2
    slice_tokens = min(SAMPLE_TOKENS, chunk_tokens // (count + 1))
    if share is not None:
        slice_tokens = min(slice_tokens, int(share * chunk_tokens) // count)
    return strategies, slice_tokens


def overhead(tuning: Tuning, rate: float, slice_tokens: int) -> float:
    """Seconds a probe adds to its chunk's work, its slices being rows the chunk runs anyway: each losing
    candidate's slice (of `slice_tokens`, or the share of one its key names) at its measured rate rather than
    the winner's `rate` (tokens/s). Repeats of close calls cost close to nothing and are not counted."""
    return sum(
        slice_tokens / Probe.share(key) * max(0.0, 1 / measured - 1 / rate)
        for key, measured in tuning.tokens_per_s.items()
        if key != tuning.winner and measured > 0
    )


class Probe:
    """One probe over a chunk's rows. It owns what its measurements share: the rows not yet taken (`left`),
    the rates measured so far (`samples`: key -> tokens/s per slice) and what it notes for the user."""

    def __init__(
        self,
        lengths,
        run: RunBatches,
        max_tokens,
        max_rows,
        device,
        backends: tuple[Candidate, ...],
        strategies,
        slice_tokens,
        bounded,
    ):
        self.lengths, self.run, self.max_tokens, self.max_rows = lengths, run, max_tokens, max_rows
        self.device, self.backends, self.strategies = device, backends, strategies
        self.slice_tokens = slice_tokens  # tokens per candidate's slice
        self.bounded = bounded  # slices held to a share of the chunk: a budget search they cannot tell is skipped
        self.left = Slices(lengths)
        self.samples: dict[str, list[float]] = {}
        self.notes: list[str] = []
        # the backend comparison's keys -> the best rate each ran this model at here before (Candidate.known)
        self.known = {b.key("padded", self.default(b), 4): b.known for b in backends if b.known > 0}

    def settle(self) -> tuple[Tuning, np.ndarray]:
        """The backend, then the budget on it, then the strategy; and the positions not yet run. With nothing to
        compare (one backend, one strategy, the budget pinned or its candidates alike) nothing runs."""
        budgets = self.max_tokens == "auto" and (
            self.device.type == "cuda" or not (self.bounded and self.alike(min(CPU_BUDGETS)))
        )
        if self.max_tokens == "auto" and not budgets:
            self.notes.append(
                f"max_tokens: the probe's slices ({self.slice_tokens} tokens) would fit one batch of every "
                f"candidate, {self.default(self.backends[0])} kept"
            )
        if len(self.backends) == 1 and len(self.strategies) == 1 and not budgets:
            backend = self.backends[0]
            return Tuning(self.default(backend), self.strategies[0], backend.name, notes=self.notes), self.left.unused
        for backend in self.backends:  # warm-up (first-call allocations, kernel choice), kept like the rest
            self.run([self.left.take_rows(8)], self.first(backend), backend.name)
        backend, compared = self.backends[0], {}
        if len(self.backends) > 1:
            # Backends can differ several times over, and each slice of the slower one costs its share of the
            # chunk's time: a quarter slice tells them apart, a close call is measured again.
            options = {b.name: (b, "padded", self.default(b), 4) for b in self.backends}
            backend = options[self.pick(options, backend.name, "backend")][0]
            compared = self.rates(options)
        budget = self.default(backend)
        first = self.first(backend)
        if budgets and self.device.type == "cuda":
            import torch

            per_token = _bytes_per_token(lambda b, how: self.measure(backend, how, b))
            budget = gpu_budget(per_token, torch.cuda.mem_get_info(self.device)[0])
        elif budgets:
            budget = int(self.pick({str(b): (backend, first, b) for b in CPU_BUDGETS}, str(budget), "max_tokens"))
        best = first
        if backend.packs and len(self.strategies) > 1:
            best = self.pick({how: (backend, how, budget) for how in self.strategies}, "padded", "strategy")
        measured = {k: round(float(np.mean(v))) for k, v in self.samples.items()}
        backends = {b: round(r) for b, r in compared.items()}
        tuning = Tuning(budget, best, backend.name, measured, self.notes, backends, winner=backend.key(best, budget))
        return tuning, self.left.unused

    def first(self, backend: Candidate) -> str:
        """The strategy a backend runs before padded and packed are compared: padded unless only packed is open."""
        return self.strategies[0] if backend.packs else "padded"

    def alike(self, smallest: int) -> bool:
        """Whether a slice of the rows left, padded to the chunk's longest row, fits one batch of `smallest`:
        every candidate budget would cut it alike, and timing them would measure noise."""
        rows = max(1, round(self.slice_tokens / max(float(self.lengths.mean()), 1.0)))
        return rows * int(self.lengths.max()) <= smallest and rows <= self.max_rows

    @staticmethod
    def share(key: str) -> int:
        """The share of a slice a key was measured on: "openvino:padded@4096 (1/4 slice)" -> 4."""
        return int(key.rsplit("(1/", 1)[1].split()[0]) if key.endswith(" slice)") else 1

    def default(self, backend: Candidate) -> int:
        return self.max_tokens if self.max_tokens != "auto" else backend.budget

    def measure(self, backend: Candidate, how: str, budget: int, share: int = 1) -> None:
        """Run a fresh slice (1/share of one) with this setting; keep its rate if it took long enough to tell."""
        part = self.left.take(self.slice_tokens // share)
        if not len(part):
            return
        batches = cut_batches(self.lengths[part], budget, how, self.max_rows, self.device)
        seconds = self.run([part[b] for b in batches], how, backend.name)
        if seconds >= MIN_SECONDS:
            rate, key = float(self.lengths[part].sum() / seconds), backend.key(how, budget, share)
            best = self.known.pop(key, 0.0)  # asked once: a second low rate is kept, the machine being that slow now
            if rate < best * DOUBTFUL:
                self.notes.append(
                    f"backend: {backend.name} timed at {rate:,.0f} tokens/s, under half the {best:,.0f} it ran this "
                    "model at here before: timed again"
                )
                return self.measure(backend, how, budget, share)
            self.samples.setdefault(key, []).append(rate)

    def rates(self, options: dict[str, tuple]) -> dict[str, float]:
        found = {name: self.samples.get(setting[0].key(*setting[1:])) for name, setting in options.items()}
        return {name: float(np.mean(values)) for name, values in found.items() if values}

    def pick(self, options: dict[str, tuple], default: str, what: str) -> str:
        """The option (name -> (Candidate, how, budget[, share of a slice])) that is clearly fastest, else
        `default`."""
        for setting in options.values():
            if setting[0].key(*setting[1:]) not in self.samples:
                self.measure(*setting)
        measured = self.rates(options)
        ranked = sorted(measured, key=measured.get, reverse=True)
        if len(ranked) > 1 and measured[ranked[1]] > measured[ranked[0]] * (1 - NOISE):
            for name in ranked[:2]:  # within noise of each other: once more each
                self.measure(*options[name])
            measured = self.rates(options)
            ranked = sorted(measured, key=measured.get, reverse=True)
        if len(measured) < len(options):
            self.notes.append(f"{what}: too little work to measure every candidate, {default} kept")
            return default
        best = ranked[0]
        if best != default and measured[best] <= measured[default] * (1 + NOISE):
            self.notes.append(f"{what}: no candidate clearly faster than {default}, kept")
            return default
        return best


class Slices:
    """A chunk's rows handed out in slices that each hold the chunk's mix of lengths: a systematic sample of
    the rows not yet taken, in length order. Attention costs more per token on long rows, and the few longest
    rows cost most: random slices of a few hundred rows held different numbers of them and rated one kernel
    up to 1.2x apart from itself (lognormal lengths); these stay within 5%."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths
        self.unused = np.argsort(lengths, kind="stable")  # positions not yet taken, shortest first

    def take(self, tokens: int) -> np.ndarray:
        """About `tokens` tokens' worth of rows (at least one while any is left)."""
        if not len(self.unused):
            return self.unused
        return self.take_rows(max(1, round(tokens / float(self.lengths[self.unused].mean()))))

    def take_rows(self, count: int) -> np.ndarray:
        n = len(self.unused)
        count = min(count, n)
        picked = ((np.arange(count) + 0.5) * n / max(count, 1)).astype(np.int64)  # one row from each of `count` strata
        part = self.unused[picked]
        self.unused = np.delete(self.unused, picked)
        return part


def _bytes_per_token(measure: Callable[[int, str], None]) -> float:
    """Peak activation memory per padded token, from one padded slice cut at GPU_PROBE_TOKENS."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    measure(GPU_PROBE_TOKENS, "padded")
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / GPU_PROBE_TOKENS
