"""The loop over chunks. Wires source → prepare → batch → runner → sink; owns no format or model logic.

While the model runs chunk k, one background thread reads and tokenizes chunk k+1 (pyarrow and
the Rust tokenizer release the GIL), so the model rarely waits for input.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa

from .batching import padding_stats
from .config import JobConfig
from .heap import HeapGuard
from .models import model_identity, resolve_model_path
from .openai_batch import OPENAI_FILES
from .openai_batch import export as export_openai
from .packing import supports_packing
from .plan import Chunk, Work, fingerprint, plan_chunks, retry_name
from .prepare import Prepared, prepare_messages, prepare_openai, prepare_texts
from .runners import make_runner
from .runners.base import EncoderRunner, Tokens
from .runners.generate import Completions
from .sink import ERROR_SCHEMA, OutputDir, current_errors
from .sources.base import as_text
from .errors import ConfigError, InputError, ModelError
from .recovery import run_resilient
from .sources import READ_ERRORS, ReadSpec, RowBlock, Shard, describe_read_error, discover_shards, open_reader, read_spec
from .tune import DEFAULT_BUDGET, plan, probe


class Progress(Protocol):
    def start(self, total_rows: int, done_rows: int) -> None: ...
    def advance(self, rows: int, tokens: int) -> None: ...
    def log(self, message: str) -> None: ...


class _Quiet:
    def start(self, total_rows: int, done_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass

    def log(self, message: str) -> None:
        pass


@dataclass
class Budget:
    """How batches are cut: settled by the job, a recorded probe or a new one, and lowered for the
    rest of the run when a batch runs out of memory."""

    max_tokens: int
    strategy: str
    lowered: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, str]:
        return self.max_tokens, self.strategy


class Interrupted(Exception):
    """The run stopped on request (SIGINT/SIGTERM) after finishing the batch in flight."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class StopFlag:
    """Set from a signal handler; checked between batches."""

    signum: int = 0
    event: threading.Event = field(default_factory=threading.Event)

    def set(self, signum: int) -> None:
        self.signum = signum
        self.event.set()

    def check(self) -> None:
        if self.event.is_set():
            raise Interrupted(self.signum)


@dataclass
class Loaded:
    """A chunk read, prepared and tokenized: everything up to the model."""

    work: Work
    shard: Shard
    table: pa.Table
    row_ids: np.ndarray  # [table rows] each row's index in its shard
    prepared: Prepared
    tokens: Tokens
    index: np.ndarray  # positions in `tokens` that go to the model (the rest became errors)
    batches: list[np.ndarray]  # positions in `index`, as the model will see them
    planned: tuple[int, str]  # the Budget.key the batches were cut with
    seconds: float


# What --retry-errors may change: the settings that decide whether a row fits, not what a row means.
RETRY_MAY_CHANGE = frozenset({"model.max_length", "model.truncation", "model.dtype"})


def run_job(job: JobConfig, *, restart: bool = False, retry_errors: bool = False, progress: Progress | None = None,
            stop: StopFlag | None = None, command: str = "",
            on_runner: Callable[[EncoderRunner], EncoderRunner] | None = None) -> dict:
    """Run (or resume) a job to the end. Returns the report also saved as _report.json.

    retry_errors: afterwards, run the rows listed in _errors/ again (say, after raising max_length);
    those that now succeed move to a part file of their own, the rest stay in _errors/."""
    progress = progress or _Quiet()
    stop = stop or StopFlag()
    started = time.perf_counter()
    shards, bad_shards, types = discover_shards(job.input, job.columns, output=job.output.path)
    model_path = resolve_model_path(job.model.path)
    chunks = plan_chunks([s.num_rows for s in shards], job.batching.chunk_rows)
    out = OutputDir(job.output.path, job.output.compression)
    done = out.open(fingerprint(job, model_identity(model_path), shards), restart, command,
                    RETRY_MAY_CHANGE if retry_errors else frozenset(), inputs=tuple(s.path for s in shards),
                    files=tuple(OPENAI_FILES) if job.output.format == "openai" else (),
                    plan={"chunks": len(chunks), "rows": sum(s.num_rows for s in shards)})
    try:
        out.write_skipped_shards([(b.name, b.message) for b in bad_shards])
        for bad in bad_shards:
            progress.log(f"skipped shard {bad.name}: {bad.message}")
        todo = [Work(c, c.name) for c in chunks if c.name not in done]
        if retry_errors:
            todo += _retries(chunks, done, out)
        device = "none"
        run_stats = Counter()
        budget, auto = _budget(job, out.tuning())
        if todo:
            runner = make_runner(job, model_path)
            device = runner.device
            _check_strategy(job, runner)
            if on_runner:
                runner = on_runner(runner)
            progress.start(sum(s.num_rows for s in shards) + sum(w.rows for w in todo if w.retry_of),
                           sum(r["rows"] for r in done.values()))
            loop_started = time.perf_counter()
            heap = HeapGuard()
            for loaded in _prefetch(job, shards, read_spec(job.input, job.columns, types), todo, runner, budget):
                replaced = current_errors(done).get(loaded.work.retry_of) if loaded.work.retry_of else None
                # Until a probe is recorded (a chunk with no rows to run leaves it to the next one).
                probe_here = auto and out.tuning() is None
                record = _process(job, loaded, runner, out, stop, budget, progress, probe_here, heap)
                done[record["chunk"]] = record
                if replaced:  # after the commit: a crash before this line is mended on the next open
                    out.drop_errors(replaced)
                run_stats.update(rows=record["rows"], tokens=record["tokens"], busy=record["model_seconds"],
                                 generated=record.get("generated_tokens", 0))
                progress.advance(record["rows"], record["tokens"])
                heap.trim()
            run_stats["loop"] = time.perf_counter() - loop_started
        report = build_report(job, chunks, done, run_stats, time.perf_counter() - started, str(device))
        report["skipped_shards"] = [{"source": b.name, "message": b.message} for b in bad_shards]
        if job.model.task != "generate":
            report["batching"] = {"max_tokens": budget.max_tokens, "strategy": budget.strategy,
                                  **({"probe": out.tuning()} if out.tuning() else {})}
        if budget.lowered:
            report["max_tokens_lowered"] = budget.lowered
        if report["complete"] and job.output.format == "openai":
            report["openai"] = export_openai(out, job.model.path, job.model.task)
        out.write_report(report, success=report["complete"])
        return report
    finally:
        out.unlock()


def _budget(job: JobConfig, recorded: dict | None) -> tuple[Budget, bool]:
    """The batching settings to start with, and whether the job leaves any of them to a probe.

    A probe's choice is recorded in the output folder, so a resumed run cuts batches as the first did."""
    batching = job.batching
    if job.model.task == "generate":
        return Budget(DEFAULT_BUDGET, "padded"), False
    auto = batching.max_tokens == "auto" or batching.strategy == "auto"
    recorded = recorded or {}
    max_tokens = batching.max_tokens if batching.max_tokens != "auto" else recorded.get("max_tokens", DEFAULT_BUDGET)
    strategy = batching.strategy if batching.strategy != "auto" else recorded.get("strategy", "padded")
    return Budget(max_tokens, strategy), auto


def _check_strategy(job: JobConfig, runner) -> None:
    if job.batching.strategy == "packed" and job.model.task != "generate":
        reason = supports_packing(runner.model)
        if reason:
            raise ConfigError(f"batching.strategy: packed does not work with this model: {reason}",
                              "set batching.strategy: padded (or auto)")


def _retries(chunks: list[Chunk], done: dict[str, dict], out: OutputDir) -> list[Work]:
    """A retry pass for every chunk whose current error file lists rows."""
    by_name = {c.name: c for c in chunks}
    work = []
    for chunk_name, latest in current_errors(done).items():
        errors = out.error_rows(latest)
        if errors is None or chunk_name not in by_name:
            continue
        chunk = by_name[chunk_name]
        offsets = sorted(r - chunk.start for r in errors.column("row").to_pylist() if r is not None)
        generation = sum(1 for r in done.values() if r.get("retry_of") == chunk_name) + 1
        if offsets:
            work.append(Work(chunk, retry_name(chunk_name, generation), offsets, retry_of=chunk_name))
    return work


def _prefetch(job: JobConfig, shards: list[Shard], spec: ReadSpec, todo: list[Work], runner: EncoderRunner,
              budget: Budget) -> Iterator[Loaded]:
    """Yield loaded chunks in order, loading the next one while the caller computes."""
    readers: dict = {}

    def load(work: Work) -> Loaded:
        t0 = time.perf_counter()
        chunk = work.chunk
        shard = shards[chunk.shard]
        if chunk.shard not in readers:
            for old in readers.values():
                old.close()
            readers.clear()
            readers[chunk.shard] = open_reader(shard, spec)
        try:
            block = readers[chunk.shard].read(chunk.start, chunk.stop)
        except READ_ERRORS as exc:
            readers.pop(chunk.shard).close()
            block = _unreadable(job, shard, chunk, exc)
        row_ids = np.arange(chunk.start, chunk.stop)
        if work.offsets is not None:
            block = RowBlock(block.table.take(pa.array(work.offsets, pa.int64())),
                             {i: block.bad_rows[o] for i, o in enumerate(work.offsets) if o in block.bad_rows})
            row_ids = row_ids[work.offsets]
        if job.input.format == "openai":
            prepared = prepare_openai(block.table, job.model.task, block.bad_rows)
        elif job.input.messages:
            prepared = prepare_messages(block.table, job.input.messages, block.bad_rows)
        else:
            prepared = prepare_texts(block.table, job.input.text, block.bad_rows)
        tokens = runner.tokenize(prepared.texts)
        keep = np.ones(len(tokens.ids), dtype=bool)
        if job.model.truncation == "error":
            for i in np.flatnonzero(tokens.truncated).tolist():
                prepared.errors[int(prepared.rows[i])] = ("too_long", f"text is longer than max_length={runner.max_length} tokens")
            keep &= ~tokens.truncated
        index = np.flatnonzero(keep)
        planned = budget.key
        if job.model.task == "generate":  # static batches are the baseline: input order, max_rows each
            batches = [np.arange(i, min(i + job.batching.max_rows, len(index))) for i in range(0, len(index), job.batching.max_rows)]
        else:
            batches = plan(tokens.lengths[index], *planned, job.batching.max_rows, runner.device)
        return Loaded(work, shard, block.table, row_ids, prepared, tokens, index, batches, planned,
                      time.perf_counter() - t0)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchinfer-load")
    try:
        pending: Future | None = pool.submit(load, todo[0])
        for following in [*todo[1:], None]:
            loaded = pending.result()
            pending = pool.submit(load, following) if following else None
            yield loaded
    finally:
        if pending is not None:
            pending.cancel()
        pool.shutdown(wait=True)
        for reader in readers.values():
            reader.close()


def _unreadable(job: JobConfig, shard: Shard, chunk: Chunk, exc: BaseException) -> RowBlock:
    """A chunk whose rows cannot be read: stop (on_bad_shard: fail) or account every row as bad_shard."""
    message = f"rows {chunk.start}-{chunk.stop - 1} of {shard.name} cannot be read: {describe_read_error(exc)}"
    if job.input.on_bad_shard == "fail":
        raise InputError(message, "replace the file and rerun to resume, or set input.on_bad_shard: skip") from exc
    table = pa.table({c: pa.nulls(chunk.rows, pa.string()) for c in job.columns})
    return RowBlock(table, {offset: ("bad_shard", message) for offset in range(chunk.rows)})


def _process(job: JobConfig, loaded: Loaded, runner: EncoderRunner, out: OutputDir, stop: StopFlag,
             budget: Budget, progress: Progress, tune: bool, heap: HeapGuard) -> dict:
    """Run one loaded chunk through the model, write its part file and commit it.

    tune: settle `batching: auto` on this chunk first (see tune.py) and record the choice."""
    t0 = time.perf_counter()
    prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
    if job.model.task == "generate":
        task_columns, ok, extra = _generate(job, loaded, runner, stop)
    else:
        task_columns, ok, extra = _encode(job, loaded, runner, stop, budget, progress, out if tune else None, heap)
    model_errors = [prepared.errors[int(prepared.rows[i])][1] for i in index[~ok]
                    if prepared.errors[int(prepared.rows[i])][0] == "model_error"]
    if len(index) > 1 and len(model_errors) == len(index):
        raise ModelError(f"the model failed on every row of chunk {loaded.work.name}: {model_errors[0]}",
                         "this is no problem of single rows; check model.device, model.dtype and the model folder")
    real, padded = int(tokens.lengths[index].sum()), extra.pop("padded_tokens")
    index = index[ok]
    rows = prepared.rows[index]
    if job.output.format == "openai" and "prompt_tokens" not in task_columns:
        task_columns["prompt_tokens"] = pa.array(tokens.lengths[index], pa.int32())
    table = _result_table(job, loaded, rows, task_columns, tokens.truncated[index])
    errors = _error_table(job, loaded)
    out.write_chunk(loaded.work.name, table, errors)
    record = {
        "chunk": loaded.work.name,
        **({"retry_of": loaded.work.retry_of} if loaded.work.retry_of else {}),
        "rows": loaded.work.rows,
        "ok": table.num_rows,
        "errors": dict(Counter(reason for reason, _ in prepared.errors.values())),
        "truncated": int(tokens.truncated[index].sum()) if job.model.truncation is True else 0,
        "tokens": real,
        "padded_tokens": padded,
        **extra,
        "seconds": round(loaded.seconds + time.perf_counter() - t0, 4),
    }
    out.commit(record)
    return record


def _encode(job: JobConfig, loaded: Loaded, runner: EncoderRunner, stop: StopFlag, budget: Budget,
            progress: Progress, tune_into: OutputDir | None, heap: HeapGuard):
    """classify / embed: the planned batches, each split and retried on failure. With `tune_into`,
    a probe first settles `batching: auto` on slices of this chunk and records its choice there."""
    prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
    lengths = tokens.lengths[index]
    results = np.empty((len(index), runner.width), dtype=np.float32)
    ok = np.ones(len(index), dtype=bool)
    totals = Counter()

    def run(batches: list[np.ndarray], strategy: str) -> float:
        """Run batches of positions in `index`; keep results and errors; return the seconds taken."""
        runner.packed = strategy == "packed"
        batches = [b for b in batches if len(b)]
        t0 = time.perf_counter()
        for batch in batches:
            stop.check()
            outcome = run_resilient(runner.run, [tokens.ids[index[i]] for i in batch.tolist()], runner.width)
            results[batch] = outcome.results
            for position, problem in outcome.failed.items():
                ok[batch[position]] = False
                prepared.errors[int(prepared.rows[index[batch[position]]])] = problem
            if outcome.oom_tokens and outcome.oom_tokens // 2 < budget.max_tokens:
                lowered = max(1, outcome.oom_tokens // 2)
                note = f"out of memory at {outcome.oom_tokens} padded tokens: max_tokens {budget.max_tokens} -> {lowered}"
                budget.max_tokens = lowered
                budget.lowered.append(note)
                progress.log(note + " for the rest of the run")
            heap.check()
        seconds = time.perf_counter() - t0
        # Packed batches compute no padding in linear layers (attention re-pads, see packing.py).
        if batches:
            totals["padded"] += (int(lengths[np.concatenate(batches)].sum()) if strategy == "packed"
                                 else padding_stats(lengths, batches)[1])
        totals["seconds"] += seconds
        return seconds

    if tune_into is not None and len(index):
        tuning, rest = probe(lengths, run, job.batching.max_tokens, job.batching.strategy, job.batching.max_rows,
                             runner.device, supports_packing(runner.model) is None)
        budget.max_tokens, budget.strategy = tuning.max_tokens, tuning.strategy
        tune_into.record_tuning({"max_tokens": tuning.max_tokens, "strategy": tuning.strategy,
                                 "tokens_per_s": {k: round(v) for k, v in tuning.tokens_per_s.items()}})
        progress.log(tuning.describe())
        run([rest[b] for b in plan(lengths[rest], *budget.key, job.batching.max_rows, runner.device)], budget.strategy)
    else:  # replanned when a probe or an out-of-memory changed the budget after this chunk was read ahead
        run(loaded.batches if loaded.planned == budget.key else plan(lengths, *budget.key, job.batching.max_rows,
                                                                     runner.device), budget.strategy)
    stop.check()
    return runner.columns(results[ok]), ok, {"model_seconds": round(totals["seconds"], 4),
                                              "padded_tokens": totals["padded"]}


def _generate(job: JobConfig, loaded: Loaded, runner, stop: StopFlag):
    """generate: the whole chunk goes to the engine, which schedules it (continuous batching)."""
    prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
    stop.check()
    max_new = _max_new_tokens(job, loaded)
    t0 = time.perf_counter()
    overrides = None
    if job.input.format == "openai":
        take = pa.array(prepared.rows[index], pa.int64())
        columns = {c: loaded.table.column(c).take(take).to_pylist() for c in ("temperature", "top_p", "seed", "stop")}
        overrides = [dict(zip(columns, values)) for values in zip(*columns.values())]
    completions = runner.generate([tokens.ids[i] for i in index.tolist()], max_new, job.batching.max_rows, overrides,
                                  check=stop.check)
    model_seconds = time.perf_counter() - t0
    stop.check()
    ok = np.ones(len(index), dtype=bool)
    for position, problem in completions.failed.items():
        ok[position] = False
        prepared.errors[int(prepared.rows[index[position]])] = problem
    keep = np.flatnonzero(ok).tolist()
    kept = Completions([completions.ids[i] for i in keep], [completions.text[i] for i in keep],
                       [completions.finish_reason[i] for i in keep])
    first = sorted(completions.first_token_seconds)
    lengths = tokens.lengths[index]
    # Continuous batching computes no padding; static batches pad to their longest prompt.
    padded = padding_stats(lengths, loaded.batches)[1] if job.generation.engine == "static" else int(lengths.sum())
    return runner.columns(kept, tokens.lengths[index[ok]]), ok, {
        "model_seconds": round(model_seconds, 4),
        "padded_tokens": padded,
        "generated_tokens": sum(len(i) for i in kept.ids),
        "first_token_seconds": round(first[len(first) // 2], 4) if first else None,
    }


def _max_new_tokens(job: JobConfig, loaded: Loaded) -> list[int]:
    """Per row: the max_new_tokens_column value where it is a positive integer, else the job's default."""
    default = job.generation.max_new_tokens
    rows = loaded.prepared.rows[loaded.index]
    column = job.max_new_tokens_column
    if not column:
        return [default] * len(rows)
    values = loaded.table.column(column).take(pa.array(rows, pa.int64())).to_pylist()
    return [v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default for v in values]


def _result_table(job: JobConfig, loaded: Loaded, rows: np.ndarray, task_columns: dict, truncated: np.ndarray) -> pa.Table:
    take = pa.array(rows, pa.int64())
    columns = {
        "source": pa.repeat(pa.scalar(loaded.shard.name), len(rows)),
        "row": pa.array(loaded.row_ids[rows], pa.int64()),
    }
    if job.input.id_column:
        columns[job.input.id_column] = loaded.table.column(job.input.id_column).take(take)
    for name, as_name in job.input.kept.items():
        columns[as_name] = loaded.table.column(name).take(take)
    columns.update(task_columns)
    if job.model.truncation is True:
        columns["truncated"] = pa.array(truncated, pa.bool_())
    return pa.table(columns)


def _error_table(job: JobConfig, loaded: Loaded) -> pa.Table | None:
    errors = loaded.prepared.errors
    if not errors:
        return None
    offsets = sorted(errors)
    ids = None
    if job.input.id_column:
        ids = id_text(loaded.table.column(job.input.id_column).take(pa.array(offsets, pa.int64())))
    return pa.table(
        {
            "id": ids if ids is not None else pa.nulls(len(offsets), pa.string()),
            "source": pa.repeat(pa.scalar(loaded.shard.name), len(offsets)),
            "row": pa.array(loaded.row_ids[offsets], pa.int64()),
            "reason": pa.array([errors[o][0] for o in offsets], pa.string()),
            "message": pa.array([errors[o][1] for o in offsets], pa.string()),
        },
        schema=ERROR_SCHEMA,
    )


def id_text(ids: pa.ChunkedArray) -> pa.Array:
    """Ids for the error table's text column, each exactly as the input gives it."""
    try:
        return ids.cast(pa.string())
    except (pa.ArrowException, TypeError):  # a list or object column used as id
        return pa.array([as_text(v) for v in ids.to_pylist()], pa.string())


def build_report(job: JobConfig, chunks: list[Chunk], done: dict[str, dict], run: Counter, seconds: float, device: str) -> dict:
    """Totals over every finished chunk and retry; rates over what this run processed."""
    records = list(done.values())
    chunk_records = [r for r in records if "retry_of" not in r]
    errors = Counter()
    for name in current_errors(done).values():
        errors.update(done[name]["errors"])
    tokens = sum(r["tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    loop = run.get("loop", 0.0)
    report = {
        "output": job.output.path,
        "task": job.model.task,
        "model": job.model.path,
        "device": device,
        "complete": len(chunk_records) == len(chunks),
        "chunks_done": len(chunk_records),
        "chunks_total": len(chunks),
        "rows": sum(r["rows"] for r in chunk_records),
        "rows_ok": sum(r["ok"] for r in records),
        "rows_error": sum(errors.values()),
        "errors_by_reason": dict(sorted(errors.items())),
        "truncated": sum(r["truncated"] for r in records),
        "tokens": tokens,
        "padding_efficiency": round(tokens / padded, 4) if padded else 1.0,
        "run": {
            "rows": run.get("rows", 0),
            "seconds": round(seconds, 3),
            "rows_per_s": round(run.get("rows", 0) / loop, 1) if loop else 0.0,
            "tokens_per_s": round(run.get("tokens", 0) / loop, 1) if loop else 0.0,
            "model_busy": round(run.get("busy", 0.0) / loop, 3) if loop else 0.0,
        },
    }
    if job.model.task == "generate":
        first = sorted(r["first_token_seconds"] for r in records if r.get("first_token_seconds") is not None)
        report["generated_tokens"] = sum(r.get("generated_tokens", 0) for r in records)
        report["run"]["generated_tokens_per_s"] = round(run.get("generated", 0) / loop, 1) if loop else 0.0
        report["run"]["time_to_first_token_s"] = first[len(first) // 2] if first else None
    return report
