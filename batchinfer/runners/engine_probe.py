"""generation.engine auto on a CUDA GPU: vLLM where it is installed; else transformers' continuous batching or
static batches, whichever generates more tokens per second on the job's own first rows.

The first H200 run found transformers' continuous batching at 0.39x the static baseline with 32 sequences in
flight and 0.74x with 256: auto must never pick the slower. As the encoders' probe does (batching/probe.py), the
first pass's rows are split into two slices that alternate along it (each with the pass's mix of prompt lengths
and budgets), each engine runs one, timed in generated tokens per second, and the rest of the pass, and the job,
run with the faster. Nothing is computed twice: the slices' completions are the rows' completions. The choice is
the chunk's tuning (the output folder's _batchinfer.json), so a resumed run keeps it, and the report's engine
entry carries the two rates.
"""

from __future__ import annotations

import time
from typing import Callable

from .engine import Engine, PassOutput, PassRows, with_note

CONTINUOUS, STATIC = "transformers", "static"
MEASURED_ON = "cuda"  # the device type (models.device_type) on which engine auto measures the two
PROBE_SHARE = 0.25  # of the first pass's rows, per engine
MIN_PROBE_ROWS = 4  # per engine: fewer rows measure start-up, not generation


def probe_split(count: int, max_rows: int) -> tuple[list[int], list[int]]:
    """The positions of a pass of `count` rows that continuous batching and static batches run in the probe:
    alternate rows, at most max_rows (one static batch) and PROBE_SHARE of the pass each; empty when too few."""
    per = min(max_rows, int(count * PROBE_SHARE))
    if per < MIN_PROBE_ROWS:
        return [], []
    return list(range(0, 2 * per, 2)), list(range(1, 2 * per, 2))


def faster(rates: dict[str, float]) -> str:
    """The engine to keep: continuous batching only where it generated more tokens per second than static batches,
    the baseline; a tie, or no measurement, keeps the baseline."""
    return CONTINUOUS if rates.get(CONTINUOUS, 0.0) > rates.get(STATIC, 0.0) else STATIC


def generated(out: PassOutput, max_new: list[int]) -> int:
    """Tokens a pass generated: each row's, up to its own limit."""
    return sum(min(len(tokens), limit) for (tokens, _), limit in zip(out.raw, max_new))


def pick_rows(rows: PassRows, positions: list[int]) -> PassRows:
    return PassRows(*[[values[p] for p in positions] for values in vars(rows).values()])


def merged(parts: list[tuple[list[int], PassOutput]], count: int) -> PassOutput:
    """Passes over disjoint positions of one pass, back in its order."""
    raw: list = [None] * count
    hits: list[int] | None = None
    first: list[float] = []
    for positions, out in parts:
        first += out.first_token_seconds
        if out.prefix_hits is not None:
            hits = hits or [0] * count
        for k, p in enumerate(positions):
            raw[p] = out.raw[k]
            if out.prefix_hits is not None:
                hits[p] = out.prefix_hits[k]
    return PassOutput(raw, first, hits)


class FasterEngine:
    """Continuous batching or static batches, whichever the job's first pass measures faster (or the choice an
    earlier run of the job recorded). Until it has chosen it groups rows as static batches need (seeds apart),
    a grouping that continuous batching takes too; serve always runs continuous batching, static batches
    serving nothing."""

    def __init__(self, engines: dict[str, Engine], recorded: str | None = None):
        self.engines = engines  # CONTINUOUS and STATIC
        self.chosen: str | None = None
        self.described: dict = {"name": "auto"}
        self.probed: dict | None = None  # the probe's record, until the chunk that ran it hands it on (settled)
        if recorded in engines:
            self.keep(recorded, "engine auto: as the output folder's first run chose (its _batchinfer.json)")

    @property
    def name(self) -> str:
        return self.chosen or STATIC

    @property
    def shared_page(self) -> int | None:
        return self.engines[self.name].shared_page

    @property
    def pads(self) -> bool:
        return self.engines[self.name].pads

    def keep(self, name: str, why: str) -> None:
        self.chosen = name
        self.described = with_note(self.engines[name].described, why)

    def passes(self, settings, skip=()) -> list[list[int]]:
        return self.engines[self.name].passes(settings, skip)

    def note(self, note: str) -> None:
        self.described = with_note(self.described, note)
        for engine in self.engines.values():
            engine.note(note)

    def settled(self) -> dict | None:
        """The probe's choice and rates, once, from the chunk that measured them; None otherwise."""
        probed, self.probed = self.probed, None
        return probed

    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        if self.chosen is not None:
            return self.engines[self.chosen].run(rows, max_rows, check)
        count = len(rows.prompts)
        slices = dict(zip((CONTINUOUS, STATIC), probe_split(count, max_rows)))
        if not slices[CONTINUOUS]:  # recorded all the same: a resume with more rows must not measure and differ
            self.keep(STATIC, f"engine auto on a GPU: static, the baseline ({count} rows are too few to measure)")
            self.probed = {"engine": STATIC, "tokens_per_s": {}}
            return self.engines[STATIC].run(rows, max_rows, check)
        self._warm(rows, max_rows, check)
        parts, rates = [], {}
        for name, positions in slices.items():
            part = pick_rows(rows, positions)
            started = time.perf_counter()
            out = self.engines[name].run(part, max_rows, check)
            rates[name] = generated(out, part.max_new) / max(time.perf_counter() - started, 1e-9)
            parts.append((positions, out))
        chosen = faster(rates)
        probed = len(slices[CONTINUOUS])
        ratio = rates[CONTINUOUS] / max(rates[STATIC], 1e-9)
        self.keep(
            chosen,
            f"engine auto on a GPU: {chosen}, measured on {2 * probed} of the first {count} rows: transformers' "
            f"continuous batching at {ratio:.2f}x the tokens/s of static batches",
        )
        self.described = {**self.described, "probe": {k: round(v, 1) for k, v in rates.items()} | {"rows": probed}}
        self.probed = {"engine": chosen, "tokens_per_s": self.described["probe"]}
        rest = sorted(set(range(count)) - set(slices[CONTINUOUS]) - set(slices[STATIC]))
        if rest:
            parts.append((rest, self.engines[chosen].run(pick_rows(rows, rest), max_rows, check)))
        return merged(parts, count)

    def _warm(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> None:
        """One row, two tokens, on each engine, thrown away: the first call's kernel loading and cache set-up
        would otherwise count against whichever engine the probe timed first."""
        one = PassRows(rows.settings[:1], rows.prompts[:1], [min(2, rows.max_new[0])], [None])
        for engine in self.engines.values():
            engine.run(one, max_rows, check)

    def serve(self, gen, max_rows: int, max_length: int):
        return self.engines[CONTINUOUS].serve(gen, max_rows, max_length)
