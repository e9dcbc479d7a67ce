"""What `batchinfer plan` and `batchinfer status` print: their lines, from the dry run's summary and a folder's
read-only status. Pure: values in, strings out; cli.py prints them."""

from __future__ import annotations

import shlex
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends.model_size import describe_size
from ..output.job_record import without_limit
from ..output.layout import REPORT
from ..output.records import ChunkRecord, error_counts
from ..output.verify import NOT_OURS

if TYPE_CHECKING:
    from ..job.config import JobConfig
    from ..output.status import FolderStatus


def plan_lines(config: JobConfig, summary: dict) -> list[str]:
    """plan: the input, its tokens, the batches, the time estimate and the output folder."""
    lines: list[str] = []
    lines.append(
        f"input    {summary['shards']} shard(s), {summary['rows']:,} rows, {summary['chunks']} chunk(s) "
        f"of {config.chunk_rows:,} rows"
        + (f" (--limit {summary['limit']:,}: the job's first rows)" if summary.get("limit") else "")
        + (f"; {summary['skipped_shards']} shard(s) skipped" if summary["skipped_shards"] else ""),
    )
    lines.append(f"model    {config.model.path}: {describe_size(summary['model_size'])}")
    if "tokens" in summary:
        t = summary["tokens_per_row"]
        lines.append(
            f"tokens   about {summary['tokens']:,} (from {summary['sampled_rows']:,} sampled rows: mean "
            f"{t['mean']:.0f}, median {t['p50']}, p95 {t['p95']}, max {t['max']} per row; "
            f"{summary['truncated_share']:.1%} cut at max_length, {summary['error_share']:.1%} error rows)",
        )
    if "prefix" in summary:
        # label scoring computes it once per chunk; generation reads it from the engine's cache pages
        reused = summary["prefix"]["saved_tokens"]
        lines.append(f"prefix   {prefix_line(summary['prefix'])}" + (", estimated on the sample" if reused else ""))
    if "batching" in summary:
        b = summary["batching"]
        lines.append(
            f"batches  {b['strategy']}, max_tokens {b['max_tokens']:,}: padding efficiency "
            f"{b['padding_efficiency']:.3f} on the sample ({BATCHING_SOURCE[b['source']]})",
        )
    if not summary["rows"]:  # as `run` says it; "nothing left" would read as rows an earlier run did
        lines.append(f"time     nothing to run: {no_rows(config)}")
    elif "estimate" in summary:
        lines += estimate_lines(summary)
    elif config.model.task == "generate":
        lines.append(
            "time     generation time depends on what the model writes: try `batchinfer run JOB --limit 100`",
        )
    folder = summary["output"]
    if not summary["rows"] and summary["new_folder"]:
        folder += ", which a run marks complete with none"
    lines.append(f"output   {config.output.path}: {folder}")
    return lines


def no_rows(config: JobConfig) -> str:
    """What plan and run say of an input with no rows."""
    return f"the input holds no rows (input.path: {config.input.path})"


NO_PREFIX = "none reused: the sampled prompts share no start long enough to reuse (put a shared instruction first)"


def prefix_line(prefix: dict) -> str:
    """A report's (or plan's) `prefix` figures in words, for either task: a prefix computed once (label
    scoring) or read from the engine's cache (generation), and its share of the prompt tokens in full."""
    if not prefix["saved_tokens"]:
        return NO_PREFIX
    return (
        f"{prefix['tokens']:,} tokens that the prompts start with, reused for {prefix['rows']:,} rows: "
        f"{prefix['saved_tokens']:,} prompt tokens not computed again "
        f"({prefix['saved_share']:.1%} of the prompt tokens)"
    )


def status_lines(state: FolderStatus) -> list[str]:
    """status: chunks, rows and errors done, the run holding the folder, what is damaged or lost, what to run next."""
    lines: list[str] = []
    done = state.done
    errors = error_counts(done)
    lost = state.lost()
    chunks, total = state.chunks_done(lost)
    holder = state.holder()
    stray, unmarked = state.stray_markers(), state.stray_parts()
    complete = state.succeeded() and not stray and not lost and not unmarked
    extent = state.extent
    limit, rows = extent.get("limit"), sum(r.rows for r in chunks)
    total_rows = extent.get("job_rows", extent.get("rows"))
    lines.append(
        f"chunks  {len(chunks)}/{total if total is not None else '?'} done"
        + (" (complete)" if complete else "")
        + (f" (--limit {limit:,}: {extent['chunks']} chunk(s), the first {extent['rows']:,} rows)" if limit else "")
    )
    share = f"/{total_rows:,} done ({rows / total_rows:.1%})" if total_rows else " done"
    passes = [r for r in done.values() if r.base not in lost]
    lines.append(f"rows    {rows:,}{share}, {sum(r.ok for r in passes):,} ok")
    lines.append(f"errors  {', '.join(f'{k} {v:,}' for k, v in sorted(errors.items())) or 'none'}")
    if skipped := state.skipped_shards():
        names = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        lines.append(f"skipped {len(skipped)} shard(s) (input.on_bad_shard: skip): {names}")
    lines.append(f"updated {datetime.fromtimestamp(state.updated()).isoformat(timespec='seconds')}")
    lines.append(f"active  {'yes, pid ' + str(holder['pid']) + ' on ' + holder['host'] if holder else 'no'}")
    if holder and isinstance(holder.get("started"), (int, float)):
        lines.append(running_rate(holder["started"], done, extent.get("rows", 0) - rows))
    if state.report_damaged():
        lines.append(
            f"report  {REPORT} is damaged, so batchinfer cannot tell it is its own: a run refuses the "
            "folder until you move that file away",
        )
    if stray:
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        lines.append(
            f"damaged {shown}: not a completion marker of this job, so its chunk counts as not done and a "
            "run refuses the folder until you move the file(s) away",
        )
    if unmarked:
        shown = ", ".join(unmarked[:3]) + (f" and {len(unmarked) - 3} more" if len(unmarked) > 3 else "")
        lines.append(
            f"stray   {shown}: part file(s) no completion marker names, whose rows a reader of the folder reads "
            "too; the next run removes them if they are this job's (a chunk in flight when a run stopped), and "
            "refuses the folder over another's until you move it away",
        )
    lines += lost_lines(lost, state.unsealed())
    command = aimed(state.command, state.path)
    if limit and not holder and len(chunks) >= extent["chunks"]:  # the limited run is done: go on past it
        lines.append(f"go on   {go_on(command)}")
    elif not complete and not holder:
        lines.append(f"resume  {command or SAME_RUN}")
    return lines


def lost_lines(lost: dict[str, str], unsealed: int) -> list[str]:
    """status: the finished chunks whose parts are not as committed, and how the others were checked."""
    lines = []
    if lost:
        shown = "; ".join(f"chunk {chunk}: {problem}" for chunk, problem in list(lost.items())[:3])
        foreign = sum(1 for problem in lost.values() if problem.endswith(NOT_OURS))
        one = len(lost) == 1
        lines.append(
            f"lost    {len(lost)} finished chunk(s) whose part is not as committed ({shown}"
            f"{' and more' if len(lost) > 3 else ''}): {'it counts' if one else 'they count'} as not done, and "
            f"the next run redoes {'it' if one else 'them'}"
            + (f", but refuses the folder until you move away the {foreign} file(s) not this job's" if foreign else "")
        )
    if unsealed:
        lines.append(
            f"checked {unsealed} part(s) by their footers alone (job, chunk, rows): their markers, written by "
            "an earlier batchinfer, hold no digest of their bytes"
        )
    return lines


# what status says where the folder records no command line: a run from Python (batchinfer.run)
SAME_RUN = "the same job again: batchinfer run with its job file and --set options, or batchinfer.run(...) from Python"


def aimed(command: str, path) -> str:
    """The folder's recorded command, its --output the folder status read (`path`): a folder copied or moved
    keeps the record, whose --output names where it was, which resuming would write to instead."""
    words = shlex.split(command)
    if "--output" not in words[:-1]:
        return command
    at = words.index("--output") + 1
    if _place(words[at]) != _place(str(path)):
        words[at] = str(path)
    return shlex.join(words)


def _place(path: str) -> str:
    return path.rstrip("/") if "://" in path else str(Path(path).resolve())


def go_on(command: str) -> str:
    """How a finished --limit run goes on to the whole job: its command without --limit, or in words where the
    folder records none (a run from Python)."""
    if not command:
        return (
            "the same job without its limit: batchinfer run with its job file and --set options and no --limit, "
            "or batchinfer.run(...) without limit= from Python (or with a larger limit)"
        )
    return f"{without_limit(command)} (the whole job), or the same with a larger --limit"


BATCHING_SOURCE = {
    "recorded": "the probe's choice, recorded in the output folder",
    "probe": "the probe's choice on the sample; the run probes its first chunk",
    "job": "as the job sets it",
}


def estimate_lines(summary: dict) -> list[str]:
    """plan's time estimate: for the rows left, start-up and probe included, and how busy the machine was."""
    e, left = summary["estimate"], summary["rows_left"]
    if not left:
        return ["time     nothing left to run: the output folder holds every row of this job"]
    what = f"{left:,} rows" + (" left" if left < summary["rows"] else "")
    converted = (
        f"; not the {_duration(e['converted_s'])} it spent converting the model for OpenVINO, which a run reads back"
        if e.get("converted_s")
        else ""
    )
    parts = [
        f"{_duration(e['startup_s'])} start-up (imports, discovery and model load, as this process took them"
        f"{converted})"
    ]
    if e["probe_s"] is not None:
        parts.append(f"{_duration(e['probe_s'])} for the batching probe")
    if e["rate_from"] == "completions":
        per_row = e["generated_tokens_per_row"]
        parts.append(
            f"{_duration(e['work_s'])} at {e['rows_per_s']:,.2f} rows/s on {e['device']} (the completions of "
            f"{e['timed_rows']} rows of the sample, run as a run's chunks run them"
            + (
                " in three passes: a first chunk's set-up, then a chunk's fixed time and a token's"
                if e.get("timed_passes") == 3
                else ""
            )
            + (f", {per_row:,.0f} new tokens a row" if per_row is not None else "")
            + f"; their mean length, and so the work, known to ±{e['uncertainty']:.0%})"
        )
    elif e["rate_from"] == "folder":
        finished = datetime.fromtimestamp(e["folder_finished"]).isoformat(timespec="minutes")
        parts.append(
            f"{_duration(e['work_s'])} at {e['rows_per_s']:,.1f} rows/s, the compute rate the folder's last run "
            f"measured (up to {finished})"
        )
    else:
        parts.append(
            f"{_duration(e['work_s'])} of work at {e['tokens_per_s']:,.0f} tokens/s on {e['device']} "
            f"(the model on {e['timed_tokens']:,} tokens of the sample after a warm-up batch"
            + (f" of {e['warmup_tokens']:,}" if e["warmup_tokens"] else "")
            + (
                f", as two batches that give its rate at a run's batch of {e['run_batch_tokens']:,.0f} tokens"
                if e.get("run_batch_tokens")
                else ""
            )
            + "; reading and tokenizing at "
            f"{e['read_tokens_per_s']:,.0f} tokens/s)"
        )
    lines = [f"time     about {_duration(e['seconds'])} for {what}: " + ", ".join(parts)]
    for label, load in (("this estimate", e["load"]), ("the folder's rate", e.get("folder_load"))):
        if load is not None and load.busy() and (label == "this estimate" or e["rate_from"] == "folder"):
            lines.append(
                f"note     the machine was busy while {label} was measured: {load.describe()}; on a quiet "
                f"machine the work may run up to {load.slowdown():.1f}x faster"
            )
    return lines


def _duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    if hours:
        return f"{hours} h {rest // 60:02d} min"
    return f"{rest // 60} min {rest % 60:02d} s" if rest >= 60 else f"{rest} s"


def running_rate(started: float, done: dict[str, ChunkRecord], rows_left: int) -> str:
    """status of a running job: its rate since it started, from the markers it committed, and the time left."""
    since = datetime.fromtimestamp(started).isoformat(timespec="seconds")
    mine = [r for r in done.values() if (r.finished or 0.0) >= started]
    if not mine:
        return f"rate    no chunk committed yet by the run that started at {since}"
    rows = sum(r.rows for r in mine)
    rate = rows / max(max(r.finished for r in mine) - started, 1e-9)
    return (
        f"rate    {rate:,.1f} rows/s since the run started at {since} ({rows:,} rows committed); "
        f"about {_duration(max(rows_left, 0) / rate)} left"
    )
