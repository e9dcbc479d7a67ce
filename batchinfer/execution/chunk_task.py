"""One chunk, start to end: read → prepare → tokenize → batch → run → write its part files → its record.

A ChunkTask holds a loaded runner and plain, picklable inputs (the job, the shards, the read spec,
where the output goes); it knows nothing of who calls it, nor which task runs: what differs between tasks
is the runner's to say (runners/protocol.py). `load` does everything up to the model and
`run` the rest, so an executor can load the next chunk while this one computes. The record it
returns is committed by the driver, which alone writes completion markers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from ..batching.budget import Batching, ProbeChoice
from ..control import StopFlag
from ..errors import ConfigError, InputError
from ..heap import HeapGuard
from ..job.config import JobConfig
from ..job.plan import Chunk, Work
from ..output.layout import ERROR_SCHEMA
from ..output.parts import PartWriter
from ..output.records import ChunkRecord, ChunkResult
from ..reasons import Reason
from ..runners.protocol import ChunkInput, Runner
from ..sources import READ_ERRORS, ReadSpec, RowBlock, Shard, describe_read_error, open_reader
from ..sources.column_types import as_text
from ..sources.file_identity import ShardChanged
from .run_rows import RowRun, name_scores


@dataclass(kw_only=True)
class Loaded(ChunkInput):
    """A chunk read, prepared and tokenized: everything up to the model, and where its rows came from."""

    work: Work
    shard: Shard
    row_ids: np.ndarray  # [table rows] each row's index in its shard
    seconds: float


@dataclass
class TaskInputs:
    """What every chunk task of a job is built from: plain, picklable values (Ray ships them to workers)."""

    job: JobConfig
    model_path: Path
    shards: list[Shard]
    spec: ReadSpec
    writer: PartWriter
    budget: Batching
    engine: dict | None = None  # generate: the engine the folder's first chunks ran on (their records' `engine`)

    def on_first_engine(self) -> JobConfig:
        """The job, its generation.engine auto kept to a torch engine the folder's first chunks ran on (auto chose
        it then, say where OpenVINO GenAI was missing or bf16 not native), so that the folder holds one engine's
        answers; a resume that auto would now put on OpenVINO GenAI goes on where it started."""
        from ..backends.models import device_type
        from ..runners.engine import AUTO_AFTER

        gen = self.job.generation
        if self.engine is None or gen.engine != "auto" or self.engine["name"] not in AUTO_AFTER:
            return self.job
        if device_type(self.job.model.device) == "cuda":  # the GPU's engine probe keeps the first run's choice itself
            return self.job
        return self.job.model_copy(update={"generation": gen.model_copy(update={"engine": self.engine["name"]})})

    def task(self, stop: StopFlag, worker: str = "local", wrap: Callable | None = None) -> ChunkTask:
        """A ChunkTask with its runner loaded in this process; `wrap` wraps the runner (tests crash a run)."""
        from ..runners import make_runner

        runner = make_runner(self.on_first_engine(), self.model_path, self.budget)
        if self.engine is not None:  # a generation folder's: imports torch, as its runner did
            from ..runners.generate import refuse_a_mixed_engine

            refuse_a_mixed_engine(self.engine, runner)
        runner = wrap(runner) if wrap else runner
        return ChunkTask(self.job, self.shards, self.spec, runner, self.writer, self.budget, stop, worker)


class ChunkTask:
    def __init__(
        self,
        job: JobConfig,
        shards: list[Shard],
        spec: ReadSpec,
        runner: Runner,
        writer: PartWriter,
        budget: Batching,
        stop: StopFlag,
        worker: str = "local",
    ):
        self.job, self.shards, self.spec, self.runner, self.writer = job, shards, spec, runner, writer
        self.stop, self.worker = stop, worker
        self.rows = RowRun(job, runner, budget, stop, HeapGuard())
        self._readers: dict[int, object] = {}
        check_strategy(job, runner)

    def take(self, tuning: ProbeChoice) -> None:
        """Run the next chunks with a probe's choice made elsewhere (another worker's first chunk): its
        budget, and its backend and precision where this worker loaded that backend."""
        self.rows.adopt(tuning.max_tokens, tuning.strategy)
        if tuning.backend in self.runner.backends:
            self.runner.keep(tuning.backend, tuning.precision)

    # --- up to the model --------------------------------------------------------------------------------------

    def load(self, work: Work) -> Loaded:
        t0 = time.perf_counter()
        job, chunk = self.job, work.chunk
        shard = self.shards[chunk.shard]
        if chunk.shard not in self._readers:  # one open reader, kept while its shard's chunks run
            self.close()
            self._readers[chunk.shard] = open_reader(shard, self.spec)
        self.stop.check()
        try:
            block = self._readers[chunk.shard].read(chunk.start, chunk.stop)
        except READ_ERRORS as exc:
            self._readers.pop(chunk.shard).close()
            block = unreadable(job, self.spec.columns, shard, chunk, exc)
        row_ids = np.arange(chunk.start, chunk.stop)
        if work.offsets is not None:
            block = RowBlock(
                block.table.take(pa.array(work.offsets, pa.int64())),
                {i: block.bad_rows[o] for i, o in enumerate(work.offsets) if o in block.bad_rows},
            )
            row_ids = row_ids[work.offsets]
        self.stop.check()
        rows = self.rows.load(block.table, block.bad_rows)
        return Loaded(**vars(rows), work=work, shard=shard, row_ids=row_ids, seconds=time.perf_counter() - t0)

    # --- the model and the part files ------------------------------------------------------------------------

    def run(
        self,
        loaded: Loaded,
        probe: bool = False,
        log: Callable[[str], None] = lambda message: None,
        partial: Callable[[int, int], None] | None = None,
    ) -> ChunkResult:
        """Run one loaded chunk through the model and write its part files; return its ChunkResult.

        probe: settle `batching: auto` on this chunk first (see batching/probe.py); ChunkResult.tuning carries
        the choice.
        partial(rows, tokens): called after each batch with the chunk's rows and tokens run so far."""
        t0 = time.perf_counter()
        job = self.job
        prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
        on_batch = _rows_so_far(loaded.work.rows, len(index), partial) if partial else None
        done = self.rows.run(loaded, f"chunk {loaded.work.name}", probe, log, on_batch)
        out = done.output
        table = name_scores(result_table(job, loaded, done.rows, out.columns, done.truncated), self.runner)
        errors, carried = error_table(job, loaded), loaded.work.carry
        if carried is not None and carried.num_rows:  # a retry keeps the error rows it did not run again
            errors = carried if errors is None else pa.concat_tables([errors, carried]).sort_by("row")
        files = self.writer.write_chunk(loaded.work.name, table, errors)
        self.rows.heap.trim()
        record = ChunkRecord(
            chunk=loaded.work.name,
            retry_of=loaded.work.retry_of,
            carried=carried.num_rows if carried is not None and carried.num_rows else None,
            rows=loaded.work.rows,
            ok=table.num_rows,
            errors=dict(
                Counter(reason for reason, _ in prepared.errors.values())
                + Counter(carried.column("reason").to_pylist() if carried is not None else [])
            ),
            truncated=int(done.truncated.sum()) if job.model.truncation is True else 0,
            tokens=int(tokens.lengths[index].sum()),
            padded_tokens=out.padded_tokens,
            model_seconds=out.model_seconds,
            # label scoring's prefix computed once; a runner's own figures (generation's cache pages) take its place
            **{"prefix": tokens.prefix_reused(index, out.kept), **out.figures},
            seconds=round(loaded.seconds + time.perf_counter() - t0, 4),
            worker=self.worker,
            max_tokens_lowered=out.lowered,
            files=files,
        )
        return ChunkResult(record, self.rows.budget, out.tuning)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


def _rows_so_far(rows: int, items: int, partial: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """Per-batch (items, tokens) → partial(the chunk's rows so far, its tokens so far). A row may be several
    items (zero-shot: one per label), so rows count in proportion to the chunk's items run."""
    done = [0, 0]

    def on_batch(batch_items: int, batch_tokens: int) -> None:
        done[0] += batch_items
        done[1] += batch_tokens
        partial(rows * done[0] // max(items, 1), done[1])

    return on_batch


def check_strategy(job: JobConfig, runner: Runner) -> None:
    if job.batching.strategy == "packed":
        reason = runner.packing_problem()
        if reason:
            raise ConfigError(
                f"batching.strategy: packed does not work with this model: {reason}",
                "set batching.strategy: padded (or auto)",
            )


def unreadable(job: JobConfig, columns: tuple[str, ...], shard: Shard, chunk: Chunk, exc: BaseException) -> RowBlock:
    """A chunk whose rows cannot be read: stop (on_bad_shard: fail) or account every row as bad_shard, in
    a table of the columns its reader would have given."""
    message = f"rows {chunk.start}-{chunk.stop - 1} of {shard.name} cannot be read: {describe_read_error(exc)}"
    if job.input.on_bad_shard == "fail":
        fix = (
            "the finished chunks hold rows of the file as it was: once it stays put, rerun with --restart to run "
            "the job on it as it is now"
            if isinstance(exc, ShardChanged)
            else "replace the file and rerun to resume"
        )
        raise InputError(message, f"{fix}, or set input.on_bad_shard: skip") from exc
    table = pa.table({c: pa.nulls(chunk.rows, pa.string()) for c in columns})
    return RowBlock(table, {offset: (Reason.BAD_SHARD, message) for offset in range(chunk.rows)})


def result_table(
    job: JobConfig, loaded: Loaded, rows: np.ndarray, task_columns: dict, truncated: np.ndarray
) -> pa.Table:
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


def error_table(job: JobConfig, loaded: Loaded) -> pa.Table | None:
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
