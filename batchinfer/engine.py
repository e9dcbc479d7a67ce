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

from .batching import OVERHEAD_TOKENS, padding_stats, plan_batches
from .config import JobConfig, template_fields
from .models import load_model, model_identity, resolve_model_path
from .plan import Chunk, fingerprint, plan_chunks
from .prepare import Prepared, prepare_texts
from .runners import make_runner
from .runners.base import EncoderRunner, Tokens
from .sink import ERROR_SCHEMA, OutputDir
from .sources import Shard, ShardReader, discover_shards


class Progress(Protocol):
    def start(self, total_rows: int, done_rows: int) -> None: ...
    def advance(self, rows: int, tokens: int) -> None: ...


class _Quiet:
    def start(self, total_rows: int, done_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass


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

    chunk: Chunk
    shard: Shard
    table: pa.Table
    prepared: Prepared
    tokens: Tokens
    index: np.ndarray  # positions in `tokens` that go to the model (the rest became errors)
    batches: list[np.ndarray]  # positions in `index`, as the model will see them
    seconds: float


def run_job(job: JobConfig, *, restart: bool = False, progress: Progress | None = None,
            stop: StopFlag | None = None, command: str = "", on_runner: Callable[[EncoderRunner], EncoderRunner] | None = None) -> dict:
    """Run (or resume) a job to the end. Returns the report also saved as _report.json."""
    progress = progress or _Quiet()
    stop = stop or StopFlag()
    started = time.perf_counter()
    shards = discover_shards(job.input)
    model_path = resolve_model_path(job.model.path)
    chunks = plan_chunks([s.num_rows for s in shards], job.batching.chunk_rows)
    out = OutputDir(job.output.path, job.output.compression)
    done = out.open(fingerprint(job, model_identity(model_path), [(s.name, s.num_rows) for s in shards]), restart, command)
    try:
        todo = [c for c in chunks if c.name not in done]
        device = "none"
        run_stats = Counter()
        if todo:
            tokenizer, model, device = load_model(job.model, model_path)
            runner = make_runner(job, tokenizer, model, device, model_path)
            if on_runner:
                runner = on_runner(runner)
            progress.start(sum(s.num_rows for s in shards), sum(r["rows"] for r in done.values()))
            loop_started = time.perf_counter()
            for loaded in _prefetch(job, shards, todo, runner):
                record = _process(job, loaded, runner, out, stop)
                done[record["chunk"]] = record
                run_stats.update(rows=record["rows"], tokens=record["tokens"], busy=record["model_seconds"])
                progress.advance(record["rows"], record["tokens"])
            run_stats["loop"] = time.perf_counter() - loop_started
        report = build_report(job, chunks, done, run_stats, time.perf_counter() - started, str(device))
        out.write_report(report, success=len(done) == len(chunks))
        return report
    finally:
        out.unlock()


def _prefetch(job: JobConfig, shards: list[Shard], todo: list[Chunk], runner: EncoderRunner) -> Iterator[Loaded]:
    """Yield loaded chunks in order, loading the next one while the caller computes."""
    text_columns = template_fields(job.input.text)
    overhead = OVERHEAD_TOKENS.get(runner.device.type, OVERHEAD_TOKENS["cuda"])
    readers: dict[int, ShardReader] = {}

    def load(chunk: Chunk) -> Loaded:
        t0 = time.perf_counter()
        shard = shards[chunk.shard]
        if chunk.shard not in readers:
            for old in readers.values():
                old.close()
            readers.clear()
            readers[chunk.shard] = ShardReader(shard, job.input.columns, text_columns)
        block = readers[chunk.shard].read(chunk.start, chunk.stop)
        prepared = prepare_texts(block.table, job.input.text, block.bad_rows)
        tokens = runner.tokenize(prepared.texts)
        keep = np.ones(len(tokens.ids), dtype=bool)
        if job.model.truncation == "error":
            for i in np.flatnonzero(tokens.truncated).tolist():
                prepared.errors[int(prepared.rows[i])] = ("too_long", f"text is longer than max_length={runner.max_length} tokens")
            keep &= ~tokens.truncated
        index = np.flatnonzero(keep)
        batches = plan_batches(tokens.lengths[index], job.batching.max_tokens, job.batching.max_rows, overhead)
        return Loaded(chunk, shard, block.table, prepared, tokens, index, batches, time.perf_counter() - t0)

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


def _process(job: JobConfig, loaded: Loaded, runner: EncoderRunner, out: OutputDir, stop: StopFlag) -> dict:
    """Run one loaded chunk through the model, write its part file and commit it."""
    t0 = time.perf_counter()
    prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
    results = np.empty((len(index), runner.width), dtype=np.float32)
    model_seconds = 0.0
    for batch in loaded.batches:
        stop.check()
        b0 = time.perf_counter()
        results[batch] = runner.run([tokens.ids[index[i]] for i in batch.tolist()])
        model_seconds += time.perf_counter() - b0
    stop.check()
    real, padded = padding_stats(tokens.lengths[index], loaded.batches)
    rows = prepared.rows[index]
    table = _result_table(job, loaded, rows, runner.columns(results), tokens.truncated[index])
    errors = _error_table(job, loaded)
    out.write_chunk(loaded.chunk.name, table, errors)
    record = {
        "chunk": loaded.chunk.name,
        "rows": loaded.chunk.rows,
        "ok": table.num_rows,
        "errors": dict(Counter(reason for reason, _ in prepared.errors.values())),
        "truncated": int(tokens.truncated[index].sum()),
        "tokens": real,
        "padded_tokens": padded,
        "model_seconds": round(model_seconds, 4),
        "seconds": round(loaded.seconds + time.perf_counter() - t0, 4),
    }
    out.commit(record)
    return record


def _result_table(job: JobConfig, loaded: Loaded, rows: np.ndarray, task_columns: dict, truncated: np.ndarray) -> pa.Table:
    take = pa.array(rows, pa.int64())
    columns = {
        "source": pa.repeat(pa.scalar(loaded.shard.name), len(rows)),
        "row": pa.array(rows + loaded.chunk.start, pa.int64()),
    }
    if job.input.id:
        columns[job.input.id] = loaded.table.column(job.input.id).take(take)
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
    if job.input.id:
        ids = loaded.table.column(job.input.id).take(pa.array(offsets, pa.int64())).cast(pa.string(), safe=False)
    return pa.table(
        {
            "id": ids if ids is not None else pa.nulls(len(offsets), pa.string()),
            "source": pa.repeat(pa.scalar(loaded.shard.name), len(offsets)),
            "row": pa.array([o + loaded.chunk.start for o in offsets], pa.int64()),
            "reason": pa.array([errors[o][0] for o in offsets], pa.string()),
            "message": pa.array([errors[o][1] for o in offsets], pa.string()),
        },
        schema=ERROR_SCHEMA,
    )


def build_report(job: JobConfig, chunks: list[Chunk], done: dict[str, dict], run: Counter, seconds: float, device: str) -> dict:
    """Totals over every finished chunk; rates over the chunks this run processed."""
    records = list(done.values())
    errors = Counter()
    for r in records:
        errors.update(r["errors"])
    tokens = sum(r["tokens"] for r in records)
    padded = sum(r["padded_tokens"] for r in records)
    loop = run.get("loop", 0.0)
    return {
        "output": job.output.path,
        "task": job.model.task,
        "model": job.model.path,
        "device": device,
        "complete": len(done) == len(chunks),
        "chunks_done": len(done),
        "chunks_total": len(chunks),
        "rows": sum(r["rows"] for r in records),
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
