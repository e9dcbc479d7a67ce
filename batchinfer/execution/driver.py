"""The driver of a job: plan the chunks, open the output folder, settle `batching: auto` once, hand the
chunks to an executor, commit each record that comes back, write the report. It owns no format, model
or device logic, and it alone writes completion markers, so no two workers can commit the same chunk.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import pyarrow as pa

from ..backends import backend_is_open, precision_note, refuse_a_mixed_resume
from ..backends.model_size import model_size
from ..batching.budget import Batching, ProbeChoice
from ..batching.probe import DEFAULT_BUDGET
from ..control import Progress, Quiet, StopFlag
from ..errors import ConfigError
from ..job.config import JobConfig
from ..job.plan import Chunk, Work, cuts_of, planned_rows, retry_name, rows_of
from ..machine import Load, LoadWindow, process_age
from ..output.checkpoint import Checkpoint
from ..output.formats import output_format
from ..output.records import ChunkRecord
from ..reasons import RETRYABLE
from ..sources import read_spec
from .chunk_task import TaskInputs
from .executors import Executor, make_executor
from .job_plan import JobPlan
from .report import build_report

# What --retry-errors may change: the settings that decide whether a row fits, not what a row means. The
# error reasons such a change can cure are reasons.RETRYABLE; the others would only fail again.
RETRY_MAY_CHANGE = frozenset({"model.max_length", "model.truncation", "model.dtype"})


def run_job(
    job: JobConfig,
    *,
    restart: bool = False,
    retry_errors: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
    stop: StopFlag | None = None,
    command: str = "",
    on_runner: Callable | None = None,
) -> dict:
    """Run (or resume) a job to the end. Returns the report also saved as _report.json.

    retry_errors: afterwards, run the rows listed in _errors/ again (say, after raising max_length);
    those that now succeed move to a part file of their own, the rest stay in _errors/.
    limit: run only the first `limit` rows, as a job that a run with a larger limit, or none, continues.
    on_runner: wraps the loaded runner (tests use it to crash a run; in-process executor only)."""
    progress = progress or Quiet()
    stop = stop or StopFlag()
    started = time.perf_counter()
    plan = JobPlan.open(job, stop)
    (shards, bad_shards, types), model_path = plan.inputs, plan.model_path
    output = job.output
    if limit is not None and limit >= plan.rows:
        limit = None  # it reaches past the last row: the whole job, finished as one (_SUCCESS, the format's files)
    if retry_errors and restart:
        raise ConfigError(
            "--retry-errors and --restart together: --restart discards the errors to retry",
            "give one of them: --restart to start over, --retry-errors to run the rows in _errors/ again",
        )
    with Checkpoint.open(output.path, output.compression, output.storage_options, tuple(s.path for s in shards)) as out:
        if retry_errors and not out.holds_a_job:  # no errors to retry: it would run the whole job unasked
            raise ConfigError(
                f"{output.path} holds no run whose errors --retry-errors could run again",
                "run the job first, without --retry-errors: its failed rows land in _errors/",
            )
        limit = limit if restart else out.covering_limit(limit)
        fmt = output_format(job)
        chunks = _start(out, plan, limit, restart, command, fmt.files, retry_errors)
        done = out.done  # read only here: the checkpoint alone changes it
        for note in out.notes:
            progress.log(note)
        out.write_skipped_shards([(b.name, b.message) for b in bad_shards])
        for bad in bad_shards:
            progress.log(f"skipped shard {bad.name}: {bad.message}")
        todo = _todo(chunks, done, out.error_files() if retry_errors else None, progress)
        recorded = out.tuning  # a probe's choice, from an earlier run
        budget, auto = settle_budget(job, recorded)
        ran = Ran(budget)
        if todo:
            refuse_a_mixed_resume(job, recorded)
            spec = read_spec(job.input, job.columns, types)
            inputs = TaskInputs(job, model_path, shards, spec, out.writer(), budget, first_engine(done))
            ran = _run_chunks(inputs, out, todo, chunks, auto and recorded is None, stop, progress, on_runner, started)
        seconds = time.perf_counter() - started
        # the probe's choice: this run's, or the earlier one reused
        batching = _batching(job, out.tuning, ran.budget) if job.model.task != "generate" else None
        report = _report(job, chunks, done, ran, seconds, bad_shards, model_size(model_path), batching, limit)
        # the format's files (a complete job), the report, _SUCCESS; raises if committed parts vanished meanwhile
        return out.finish(report, fmt, final=limit is None, idle=not todo)


def _start(out, plan: JobPlan, limit, restart: bool, command: str, files, retry_errors: bool) -> list:
    """The chunks to run, planned, and the folder's job started on them (new, resumed or restarted)."""
    cuts = out.cuts()  # an earlier --limit's: the rows it ran are kept
    chunks = plan.chunks(limit, cuts)
    whole = chunks
    if limit is not None:  # the whole job as the next run plans it: this run's last chunk too, where the limit cut it
        ran = cuts_of({c.name: c.rows for c in chunks})
        whole = plan.chunks(None, {name: cuts.get(name, set()) | ran.get(name, set()) for name in cuts | ran})
    out.start(
        plan.fingerprint(limit),
        restart,
        command,
        (RETRY_MAY_CHANGE if retry_errors else frozenset()) | {"limit"},
        files=files,
        extent={
            "chunks": len(chunks),
            "rows": rows_of(chunks),
            **({"job_chunks": len(whole), "job_rows": rows_of(whole), "limit": limit} if limit else {}),
        },
        planned=planned_rows(chunks),
    )
    return chunks


def first_engine(done: dict[str, ChunkRecord]) -> dict | None:
    """The generation engine the folder's first committed chunk ran on ({name, precision, ...}), or None."""
    return next((done[name].engine for name in sorted(done) if done[name].engine), None)


def _todo(chunks: list, done: dict, error_files: dict | None, progress: Progress) -> list[Work]:
    """The chunks not done, and with --retry-errors (error_files: the current error files) the error rows
    that a changed setting may cure."""
    todo = [Work(c, c.name) for c in chunks if c.name not in done]
    if error_files is not None:
        retries, kept = _retries(chunks, done, error_files)
        todo += retries
        if kept:
            reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(kept.items()))
            progress.log(f"not retried, since no setting changes them: {reasons} (they stay in _errors/)")
    return todo


def _report(
    job, chunks, done, ran: Ran, seconds: float, bad_shards, size: dict, batching: dict | None, limit: int | None
) -> dict:
    """The job's report (pure): its totals from the chunk records, and what this run did."""
    report = build_report(job, chunks, done, ran.stats, seconds, ran.device, ran.workers)
    if ran.machine is not None:  # how busy the machine was while this run measured its rates
        report["run"]["machine"] = ran.machine.as_dict()
    if ran.lost_workers:
        report["run"]["lost_workers"] = ran.lost_workers
    report["skipped_shards"] = [{"source": b.name, "message": b.message} for b in bad_shards]
    report["model_size"] = size
    if batching is not None:
        report["batching"] = batching
    if ran.startup:
        report["startup"] = ran.startup
    if ran.lowered:
        report["max_tokens_lowered"] = ran.lowered
    if limit is not None:
        report["limit"] = limit
    return report


def _batching(job, tuning: ProbeChoice | None, budget) -> dict:
    """The batching an encoder job ran with, and the probe that chose it."""
    note = precision_note(job.model, budget.backend, budget.precision)
    return {
        "max_tokens": budget.max_tokens,
        "strategy": budget.strategy,
        "backend": budget.backend,
        "precision": budget.precision,
        **({"precision_note": note} if note else {}),
        **({"probe": tuning.record()} if tuning else {}),
    }


@dataclass
class Ran:
    """What this run's chunks did: totals (run and per worker), the batching the workers ended with, each
    out-of-memory that lowered it, the device, the start-up figures, how busy the machine was and the workers
    lost on the way (with the chunks they had in flight, run again by the others)."""

    budget: Batching
    stats: Counter = field(default_factory=Counter)
    workers: dict[str, Counter] = field(default_factory=dict)
    lowered: list[str] = field(default_factory=list)
    device: str = "none"
    startup: dict = field(default_factory=dict)
    machine: Load | None = None
    lost_workers: dict = field(default_factory=dict)


def _run_chunks(
    inputs: TaskInputs,
    out: Checkpoint,
    todo: list[Work],
    chunks: list[Chunk],
    probe: bool,
    stop: StopFlag,
    progress: Progress,
    on_runner: Callable | None,
    started: float,
) -> Ran:
    """Hand `todo` to an executor and commit each chunk that comes back, in the order they finish."""
    ran, done, planned = Ran(inputs.budget), out.done, {c.name for c in chunks}
    opened = time.perf_counter()
    executor: Executor
    with make_executor(inputs, stop, progress, on_runner) as executor:
        ran.device = str(executor.device)
        ran.startup = startup_figures(started, opened, executor.load_seconds)
        if not probe and "note" in ran.startup["load"]:  # a probe's line says it (runners/base.py settle)
            progress.log(ran.startup["load"]["note"])
        retried = rows_of([w for w in todo if w.retry_of])
        if retried == rows_of(todo):  # only error rows run again: count those alone
            progress.start(retried, 0, started)
        else:  # finished chunks only: rows an earlier retry pass ran again are inside them already
            progress.start(rows_of(chunks) + retried, sum(r.rows for r in done.values() if r.chunk in planned), started)
        loop_started = time.perf_counter()
        # in-process only: Ray's workers are other processes, so their CPU would read as the machine's load
        window = LoadWindow() if inputs.job.runtime.executor == "local" else None
        for result in executor.run(todo, probe=probe):
            out.commit(result.record, result.tuning)
            ran.budget = result.budget  # the worker's: a probe's choice, or lowered after an out-of-memory
            ran.lowered += result.record.max_tokens_lowered
            _count(result.record, ran.stats, ran.workers)
            progress.advance(result.record.rows, result.record.tokens)
        ran.stats["loop"] = time.perf_counter() - loop_started
        ran.machine = window.stop() if window else None
        ran.lost_workers = executor.lost_workers
    return ran


def _count(record: ChunkRecord, run_stats: Counter, workers: dict[str, Counter]) -> None:
    """This run's totals, and each worker's, after a committed chunk."""
    stats = {
        "rows": record.rows,
        "tokens": record.tokens,
        "busy": record.model_seconds,
        "generated": record.generated_tokens or 0,
    }
    run_stats.update(stats)
    workers.setdefault(record.worker, Counter()).update(chunks=1, **stats)


def startup_figures(started: float, opened: float, load: dict) -> dict:
    """Seconds spent before the first chunk runs: from batchinfer's import to run_job (imports), finding the
    shards and opening the output, loading the model (converting and compiling it: `load`)."""
    now, age = time.perf_counter(), process_age()
    return {
        "discover_open_s": round(opened - started, 3),
        "load_s": round(now - opened, 3),
        "load": load,
        "imports_s": round(age - (now - started), 3),
        "to_first_chunk_s": round(age, 3),
    }


def settle_budget(job: JobConfig, recorded: ProbeChoice | None) -> tuple[Batching, bool]:
    """The batching settings to start with, and whether the job leaves any of them to a probe.

    A probe's choice is recorded in the output folder, so a resumed run cuts batches as the first did."""
    batching = job.batching
    found = recorded.batching if recorded else Batching(DEFAULT_BUDGET, "padded")
    if job.model.task == "generate":  # the engine that engine auto's probe chose on a GPU, where one did
        return Batching(DEFAULT_BUDGET, "padded", backend=found.backend), False
    auto = batching.max_tokens == "auto" or batching.strategy == "auto" or backend_is_open(job)
    max_tokens = batching.max_tokens if batching.max_tokens != "auto" else found.max_tokens
    strategy = batching.strategy if batching.strategy != "auto" else found.strategy
    return replace(found, max_tokens=max_tokens, strategy=strategy), auto


def _retries(chunks: list[Chunk], done: dict[str, ChunkRecord], error_files) -> tuple[list[Work], Counter]:
    """A retry pass for every chunk whose current error file lists rows a changed setting may cure (RETRYABLE);
    its other error rows ride along into the pass's error file. Also: the error rows not run, by reason.
    error_files: (chunk, its current error rows) for each chunk with error rows."""
    import pyarrow.compute as pc

    by_name = {c.name: c for c in chunks}
    work, kept = [], Counter()
    for chunk_name, errors in error_files:
        if chunk_name not in by_name:
            continue
        chunk = by_name[chunk_name]
        again = pc.is_in(errors.column("reason"), value_set=pa.array(sorted(RETRYABLE))).to_numpy(zero_copy_only=False)
        rows = errors.column("row").to_numpy(zero_copy_only=False)
        offsets = sorted(int(r) - chunk.start for r in rows[again & ~np.isnan(rows.astype(float))])
        carry = errors.filter(pa.array(~again))
        kept.update(carry.column("reason").to_pylist())
        generation = sum(1 for r in done.values() if r.retry_of == chunk_name) + 1
        if offsets:
            work.append(Work(chunk, retry_name(chunk_name, generation), offsets, retry_of=chunk_name, carry=carry))
    return work, kept
