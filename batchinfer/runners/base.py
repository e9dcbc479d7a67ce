"""What every encoder task shares (its runner contract is protocol.py's Runner): batch tokenization,
one Batch per batch of items run on a Backend (backends/base.py), split-and-retry, the probe.

A runner turns texts into items (token ids: one per row, or several, as zero-shot makes one per
candidate label), runs batches of items, and turns each row's item results into result columns
(Arrow arrays of any type). Batching, out-of-memory splitting, packing, the probe and the error
accounting work on items, so every task gets them without code of its own.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..backends.base import Backend, Pair, batch_of
from ..backends.models import position_limit
from ..backends.precision import PRECISION_SAMPLE, SETTLE_SAMPLE, check_conversion, check_precision, describe_check
from ..batching.budget import ProbeChoice
from ..batching.cut import computed_tokens, cut_batches
from ..batching.probe import Candidate, probe
from .protocol import ChunkContext, ChunkInput, ChunkOutput, Tokens
from .recovery import run_resilient

if TYPE_CHECKING:  # torch is imported where a model runs on it (backends/torch.py): see numpy_head
    import torch


class EncoderRunner:
    """Subclasses define `head(out, batch)` (one result per item from what the backend's forward returned for a
    Batch) and `columns(results, texts, loaded)` (result columns from each row's item results, [rows][items]).

    `packed` (per batch, set by `lay_out`) runs a batch as one unpadded sequence, on a backend that packs."""

    packed = False
    packs = True  # whether the task's batches may run packed (where the backend packs the model)
    pairs = False  # items are (text, text_pair): the converted model takes token type ids
    agreement = "argmax"  # how a lower precision is checked against f32: argmax (labels) | cosine | close
    score_labels: list[str] | None = None  # what each entry of a `scores` column stands for
    # head() reads numpy (every backend's forward returns it): a run on OpenVINO alone imports no torch where the
    # rest of the runner needs none either (embed, classify, score); token-classify groups entities with
    # transformers' pipeline code (its module imports torch), zero-shot reads its config's label2id through
    # transformers.
    numpy_head = False
    probe_share: float | None = None  # the most of a first chunk's tokens its probe runs (batching/probe.py)

    @classmethod
    def load(cls, job, model_path, budget=None):
        """The runner for `job`, with its model loaded from `model_path` on every backend it may use; a
        budget that settled the backend and precision (a recorded probe) loads only that one."""
        from ..backends import candidates, load_encoders
        from ..backends.models import device_type
        from ..job.tasks import TASKS

        names = candidates(job.model, device_type(job.model.device), job.batching.strategy == "packed")
        if budget is not None and budget.backend in names:
            names = [budget.backend]
        tokenizer, backends, device, seconds = load_encoders(
            job.model,
            model_path,
            names,
            TASKS[job.model.task].auto_class,
            cls.pairs,
            cls.converted_output(model_path),
            cls.numpy_head,
        )
        first = next(iter(backends.values()))  # without torch where OpenVINO is known to be far faster here
        if budget is not None and budget.precision in first.precisions:
            first.keep(budget.precision)
        runner = cls(tokenizer, first, device, job, model_path)
        runner.loaded(backends, seconds)
        return runner

    def __init__(self, tokenizer, backend: Backend, device: torch.device, job, model_path=None):
        """backend: the first loaded (its config is the model's)."""
        self.backends: dict[str, Backend] = {}
        self.load_seconds: dict[str, float] = {}
        self.device = device
        # The Rust tokenizer, truncating but never padding: padding happens per batch, after sorting.
        self.tokenizer = copy.deepcopy(tokenizer.backend_tokenizer)
        self.tokenizer.no_padding()
        self.truncation_side = getattr(tokenizer, "truncation_side", "right")  # the tokenizer's own: right or left
        self.truncate(min(job.model.max_length, position_limit(backend.config)))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def truncate(self, max_length: int) -> None:
        """Cut items to `max_length` tokens, from the side the tokenizer cuts."""
        self.max_length = max_length
        self.tokenizer.enable_truncation(max_length, direction=self.truncation_side)

    def encode(self, texts: list, **options) -> list:
        """The tokenizer's encodings of `texts` (or pairs), truncated."""
        return encode_capped(self.tokenizer, texts, self.max_length, self.truncation_side == "left", **options)

    @classmethod
    def converted_output(cls, model_path) -> tuple[str, object]:
        """What every backend's forward returns: the name of the model output the task's head reads, and a function
        (of the torch device's name) that builds a torch module of (hidden states, mask) computed on them instead
        (inside the graph, on OpenVINO), or None."""
        return "logits", None

    def loaded(self, backends: dict[str, Backend], seconds: dict) -> None:
        """The backends load() loaded by name (the first runs), and the seconds loading took."""
        self.backends, self.load_seconds = backends, seconds
        self.use(next(iter(backends)))

    @property
    def backend(self) -> str:
        return self._running.name

    @property
    def precision(self) -> str | None:
        return self._running.precision

    @property
    def default_budget(self) -> int:
        """The running backend's max_tokens where the probe cannot measure."""
        return self._running.default_budget

    def use(self, backend: str, precision: str | None = None) -> None:
        """Run the next batches on `backend` (one of those loaded), in `precision` (default: its first)."""
        self._running = self.backends[backend]
        self._running.use(precision or self._running.precisions[0])

    def keep(self, backend: str, precision: str | None = None) -> None:
        """Settle on `backend` and `precision` (default: its first) and free every other model."""
        self.use(backend, precision)
        self.backends = {backend: self._running}
        self._running.keep(self.precision)

    def check_precision(self, ids: list) -> tuple[str | None, dict]:
        """The first of this backend's precisions that gives this task's answers on the items `ids`, against
        the last (f32), with the check's figures (backends/precision.py); f32 when none does. Ends with the
        chosen one in use."""
        options, backend = self._running.precisions, self.backend
        if len(options) < 2:
            return options[0], {}

        def run_in(precision: str, batch: list) -> list:
            self.use(backend, precision)
            return self.run(batch)

        precision, check = check_precision(run_in, options, self.agreement, ids)
        self.use(backend, precision)
        return precision, check

    def check_conversion(self, ids: list) -> dict | None:
        """Where the reference backend (torch) and a conversion (OpenVINO's) are both loaded and run f32: the
        conversion checked against the reference on the items `ids` (backends/precision.py), its figures returned;
        one that disagrees is freed, with a note in load_seconds, and the reference runs. None where there is
        nothing to check."""
        reference = next((b for b in self.backends.values() if b.reference and b.f32), None)
        converted = next((b for b in self.backends.values() if not b.reference and b.f32), None)
        if reference is None or converted is None:
            return None

        def run_on(backend: str, batch: list) -> list:
            self.use(backend, "f32")
            return self.run(batch)

        ok, check = check_conversion(run_on, self.agreement, ids, reference.name, converted.name)
        if not ok:
            self.load_seconds["note"] = f"OpenVINO not used, torch runs the job: conversion {describe_check(check)}"
            del self.backends[converted.name]
        self.use(next(iter(self.backends)))
        return check

    def lay_out(self, strategy: str) -> None:
        """Run the next batches padded or packed (batching.strategy, settled)."""
        self.packed = strategy == "packed"

    def tokenize(self, texts: list) -> Tokens:
        return tokens_of(self.encode(texts))

    def run(self, ids: list[list[int]]) -> list:
        """One batch of items → one result per item, in the same order."""
        batch = batch_of(ids, self.pad_id, self.packed)
        return self.head(self._running.forward(batch), batch)

    def row_settings(self, job, table: pa.Table, prepared) -> None:
        return None  # encoder tasks read no per-row settings

    def cut(self, lengths: np.ndarray, budget: tuple[int, str], max_rows: int) -> list[np.ndarray]:
        return cut_batches(lengths, *budget, max_rows, self.device)

    def packing_problem(self) -> str | None:
        """Why the running backend cannot run this task's batches packed, or None."""
        return self.packing_problem_on(self._running)

    def packing_problem_on(self, backend: Backend) -> str | None:
        problem = backend.packing_problem
        if problem is None and not self.packs:
            return f"{type(self).__name__} pads every batch under its own attention masks"
        return problem

    def candidates(self) -> tuple[Candidate, ...]:
        """The loaded backends as the probe weighs them, the default first, each with the best rate it ran this
        model at here before."""
        best = {name: rate for b in self.backends.values() for name, rate in b.best_rates().items()}
        return tuple(
            Candidate(b.name, self.packing_problem_on(b) is None, b.default_budget, b.reference, best.get(b.name, 0.0))
            for b in self.backends.values()
        )

    def run_chunk(self, loaded: ChunkInput, ctx: ChunkContext) -> ChunkOutput:
        """A loaded chunk's cut batches of items, each split and retried on failure → the result columns
        of the rows whose every item ran. With ctx.probe, a probe first settles `batching: auto` on slices
        of this chunk; the output carries its choice."""
        tokens, index, rows = loaded.tokens, loaded.index, ctx.job.batching.max_rows
        loop = BatchLoop(self, loaded, ctx)
        tuning = None
        if (ctx.probe or self.unsettled) and len(index):
            tuning, rest = self.settle(loop.lengths, [tokens.ids[i] for i in index.tolist()], loop.run, ctx)
            if loop.fits is not None:  # a budget that ran out of memory while the probe timed it is not chosen
                tuning = tuning.model_copy(update={"max_tokens": min(tuning.max_tokens, loop.fits)})
            loop.budget = replace(loop.budget, max_tokens=tuning.max_tokens, strategy=tuning.strategy)
            loop.run([rest[b] for b in self.cut(loop.lengths[rest], loop.budget.key, rows)], loop.budget.strategy)
        else:  # cut again when a probe or an out-of-memory changed the budget after this chunk was read ahead
            same = loaded.cut_with == loop.budget.key
            loop.run(loaded.batches if same else self.cut(loop.lengths, loop.budget.key, rows), loop.budget.strategy)
        ctx.stop.check()
        items = loop.items()
        kept = np.fromiter(items, dtype=np.int64, count=len(items))
        return ChunkOutput(
            self.columns(list(items.values()), kept, loaded),
            kept,
            round(loop.seconds, 4),
            loop.padded,
            tuning=tuning,
            budget=replace(loop.budget, backend=self.backend, precision=self.precision),
            lowered=loop.lowered,
        )

    def settle_default(self) -> dict:
        """Where no chunk is there to probe (serve): the default backend (OpenVINO's conversion checked against
        torch where both are loaded), its precision checked on a few sentences of SETTLE_SAMPLE. Returns the
        precision check's figures."""
        sample = self.tokenize(self.sample_inputs()).ids if len(self.backends) > 1 else None
        if sample is not None:
            self.check_conversion(sample)
        backend = next(iter(self.backends))
        check = self.settle_precisions(sample).get(backend, {})
        self.keep(backend)
        return check

    def settle_precisions(self, ids: list | None = None) -> dict[str, dict]:
        """Settle each loaded backend's precision where it has a choice, checked on the items `ids` (default:
        SETTLE_SAMPLE's); returns each check's figures by backend."""
        checks = {}
        for backend in list(self.backends.values()):
            if len(backend.precisions) > 1:
                self.use(backend.name)
                ids = self.tokenize(self.sample_inputs()).ids if ids is None else ids
                precision, checks[backend.name] = self.check_precision(ids)
                backend.keep(precision)
        return checks

    def sample_inputs(self) -> list:
        return list(SETTLE_SAMPLE)

    @property
    def unsettled(self) -> bool:
        """More than one backend or precision still loaded (a folder whose recorded probe predates backends)."""
        return len(self.backends) > 1 or len(self._running.precisions) > 1

    def settle(self, lengths: np.ndarray, ids: list, run, ctx) -> tuple[ProbeChoice, np.ndarray]:
        """Settle on the first chunk what the job leaves open: each backend's precision (checked against f32
        on a sample of items), then the backend and batching (the probe, batching/probe.py), and free what lost.
        lengths, ids: the chunk's items to run. Returns the choice, for the record, and the positions not
        run yet."""
        job, budget = ctx.job, ctx.budget
        sample = [ids[i] for i in np.random.default_rng(1).permutation(len(ids))[:PRECISION_SAMPLE].tolist()]
        conversion = self.check_conversion(sample)
        checks = self.settle_precisions(sample)
        # A recorded probe settled batching already; only the backend is open then.
        tuning, rest = probe(
            lengths,
            run,
            job.batching.max_tokens if ctx.probe else budget.max_tokens,
            job.batching.strategy if ctx.probe else budget.strategy,
            job.batching.max_rows,
            self.device,
            self.candidates(),
            self.probe_share,
        )
        if len(tuning.backends) > 1:
            for backend in self.backends.values():
                backend.remember(tuning.backends, tuning.load.as_dict() if tuning.load else None)
        if "note" in self.load_seconds:
            tuning.notes.append(self.load_seconds["note"])
        self.keep(tuning.backend)
        check = checks.get(tuning.backend)
        ctx.log(
            tuning.describe()
            + (f"; precision {describe_check(check)}" if check else "")
            + (f"; OpenVINO conversion {describe_check(conversion)}" if conversion else "")
        )
        choice = ProbeChoice(
            max_tokens=tuning.max_tokens,
            strategy=tuning.strategy,
            backend=tuning.backend,
            precision=self.precision,
            tokens_per_s=tuning.tokens_per_s,
            seconds=tuning.seconds,
            rows=tuning.rows,
            notes=tuning.notes or None,
            precision_check=check or None,
            conversion_check=conversion or None,
        )
        return choice, rest

    def head(self, out, batch) -> list:
        """out: what the backend's forward returned for `batch` (backends/base.py: the task's output, [b, ...] in
        the padded layout whether the batch ran padded or packed; a float32 numpy array)."""
        raise NotImplementedError

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        """results: each row's item results, for the rows at `texts` (positions in loaded.prepared.texts)."""
        raise NotImplementedError


class BatchLoop:
    """One chunk's batches of items, run one after another (the probe's timed slices, then the rest). It owns
    what they change: each item's result, the rows that failed, the budget an out-of-memory lowers for the
    rest of the run, and the seconds and padded tokens spent."""

    def __init__(self, runner: EncoderRunner, loaded: ChunkInput, ctx: ChunkContext):
        self.runner, self.loaded, self.ctx = runner, loaded, ctx
        index = loaded.index
        self.budget = ctx.budget
        self.fits: int | None = None  # half the fewest padded tokens that ran out of memory in this chunk
        self.lengths = loaded.tokens.lengths[index]
        self.owners = loaded.tokens.owners()[index]
        self.results: list = [None] * len(index)
        self.ok = np.ones(len(index), dtype=bool)
        self.seconds, self.padded = 0.0, 0
        self.lowered: list[str] = []  # what each out-of-memory lowered, for the record

    def run(self, batches: list[np.ndarray], strategy: str, backend: str | None = None) -> float:
        """Run batches of positions in the chunk's index (on `backend`: the probe's candidates); keep results
        and errors; return the seconds taken."""
        if backend is not None:
            self.runner.use(backend)
        self.runner.lay_out(strategy)
        batches = [b for b in batches if len(b)]
        t0 = time.perf_counter()
        for batch in batches:
            self.ctx.stop.check()
            self.run_one(batch)
            self.ctx.heap.check()
            self.ctx.on_batch(len(batch), int(self.lengths[batch].sum()))
        seconds = time.perf_counter() - t0
        self.padded += computed_tokens(self.lengths, batches, strategy)
        self.seconds += seconds
        return seconds

    def run_one(self, batch: np.ndarray) -> None:
        """One batch, split and retried on failure (runners/recovery.py): its results, its failed rows, and the budget
        lowered below what ran out of memory; the probe's choice is held under it too."""
        tokens, index, prepared = self.loaded.tokens, self.loaded.index, self.loaded.prepared
        outcome = run_resilient(self.runner.run, [tokens.ids[index[i]] for i in batch.tolist()])
        for k, position in enumerate(batch.tolist()):
            self.results[position] = outcome.results[k]
        for k, problem in outcome.failed.items():
            self.ok[batch[k]] = False
            prepared.errors.setdefault(int(prepared.rows[self.owners[batch[k]]]), problem)
        if outcome.oom_tokens:
            self.fits = min(self.fits or outcome.oom_tokens, max(1, outcome.oom_tokens // 2))
            if self.fits < self.budget.max_tokens:
                note = f"out of memory at {outcome.oom_tokens} padded tokens: "
                note += f"max_tokens {self.budget.max_tokens} -> {self.fits}"
                self.budget = replace(self.budget, max_tokens=self.fits)
                self.lowered.append(note)
                self.ctx.log(note + " for the rest of the run")

    def items(self) -> dict[int, list]:
        """Each row whose every item ran (its position in the prepared texts) -> its items' results."""
        failed = set(self.owners[~self.ok].tolist())
        items: dict[int, list] = {}
        for position, text in enumerate(self.owners.tolist()):
            if text not in failed:
                items.setdefault(text, []).append(self.results[position])
        return items


def tokens_of(encodings: list, owner: np.ndarray | None = None, pairs: bool = False) -> Tokens:
    """Tokens from the Rust tokenizer's encodings."""
    ids = [Pair(e.ids, e.type_ids) for e in encodings] if pairs else [e.ids for e in encodings]
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(ids))
    return Tokens(ids, lengths, truncated, owner, encodings)


def head_labels(config) -> list[str]:
    """The names of a classification head's outputs, as its config gives them."""
    return [str(config.id2label.get(i, f"LABEL_{i}")) for i in range(config.num_labels)]


def rows_of(results: list[list]) -> np.ndarray:
    """Single-item rows' results stacked: [rows, ...]."""
    return np.stack([items[0] for items in results]) if results else np.zeros((0, 0), dtype=np.float32)


CHARS_PER_TOKEN = 64  # more than any vocabulary's longest token


def encode_capped(tokenizer, texts: list[str], max_length: int, from_end: bool = False, **options) -> list:
    """The tokenizer's truncated encodings of `texts`, without tokenizing what truncation drops anyway.

    A text longer than max_length x CHARS_PER_TOKEN characters is cut to that length first (its end
    kept when `from_end`). When the cut text still overflows max_length tokens, its kept tokens are
    those of the whole text: the cut changes at most the last word, far past them. Otherwise (a text of
    invisible characters, one enormous word) the whole text is tokenized after all. An 8 MB line costs
    milliseconds this way instead of 14 s and 1.8 GB of overflow encodings."""
    limit = max_length * CHARS_PER_TOKEN

    def shorten(text: str) -> str:
        return text[-limit:] if from_end else text[:limit]

    long = [
        i for i, text in enumerate(texts) if max(map(len, text) if isinstance(text, tuple) else [len(text)]) > limit
    ]
    if not long:
        return tokenizer.encode_batch(texts, **options)
    cut = list(texts)
    for i in long:  # a pair: each side
        cut[i] = tuple(map(shorten, texts[i])) if isinstance(texts[i], tuple) else shorten(texts[i])
    encodings = tokenizer.encode_batch(cut, **options)
    whole = [i for i in long if not encodings[i].overflowing]
    for i, encoding in zip(whole, tokenizer.encode_batch([texts[i] for i in whole], **options) if whole else []):
        encodings[i] = encoding
    return encodings


def softmax(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, as torch's softmax(dim=-1)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -logits))  # 1 / (1 + e^-x), without overflow where x is far below 0


def fixed_size_list(values: np.ndarray) -> pa.FixedSizeListArray:
    """[n, d] float32 → fixed_size_list<float32>[d] without a per-row loop."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
