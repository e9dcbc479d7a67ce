"""The rich progress bar, the plain progress lines and the final summary: what a run shows while it works.
Only these and cli.py (messages, errors) print; the rest of the package returns what it has to say."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .backends.model_size import describe_size
from .commands.show import prefix_line


@dataclass(frozen=True)
class Kept:
    """Where a stopped run leaves its job: rows committed (earlier runs' too) of the total, and the rows
    run in the chunk in flight, which are not committed and which the resume runs again."""

    committed: int
    total: int
    inflight: int

    def line(self, folder: str) -> str:
        kept = f"{self.committed:,} of {self.total:,} rows are committed (kept) in {folder}"
        if not self.inflight:
            return kept + "."
        return f"{kept}; the {self.inflight:,} rows in flight are dropped and will be recomputed on resume."


class _Rate(ProgressColumn):
    """rows/s and tokens/s over this run's wall seconds (start-up included, as the summary's `this run` line
    counts them), not counting rows done by an earlier run."""

    def __init__(self, bar: "RunProgress"):
        super().__init__()
        self.bar = bar

    def render(self, task) -> Text:
        elapsed = max(time.perf_counter() - self.bar.t0, 1e-9)
        rows, tokens = self.bar.rows + self.bar.inflight[0], self.bar.tokens + self.bar.inflight[1]
        return Text(f"{rows / elapsed:,.0f} rows/s  {tokens / elapsed:,.0f} tok/s", style="cyan")


def labelled(label: str, style: str, text: str) -> Text:
    """A styled label before plain text: what the text holds ([brackets] in a path) is never read as markup."""
    return Text.assemble((label, style), " ", text)


class RunProgress:
    """Rows done out of total, rates and ETA. On resume the bar starts at the rows already done."""

    def __init__(self, console: Console):
        self.console = console
        self.rows = self.tokens = self.before = self.total = 0
        self.inflight = (0, 0)  # rows and tokens run so far in the chunk not yet committed
        self.shown = 0  # the highest count shown: a chunk's rows in flight dropped never take the bar back
        self.t0 = time.perf_counter()
        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _Rate(self),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task = None

    def start(self, total_rows: int, done_rows: int, since: float) -> None:
        self.t0, self.before, self.total, self.shown = since, done_rows, total_rows, done_rows
        self._task = self._bar.add_task("rows", total=total_rows, completed=done_rows)
        self._bar.start()

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        self.partial(0, 0)

    def partial(self, rows: int, tokens: int) -> None:
        self.inflight = (rows, tokens)
        self.shown = max(self.shown, self.before + self.rows + rows)
        self._bar.update(self._task, completed=self.shown)

    def kept(self) -> Kept | None:
        return Kept(self.before + self.rows, self.total, self.inflight[0]) if self._task is not None else None

    def log(self, message: str) -> None:
        self._bar.console.print(labelled("note:", "yellow", message), highlight=False)

    def stop(self) -> None:
        self._bar.stop()


class LineProgress:
    """Plain lines for logs (nohup, cron, a scheduler): one when the run starts, one every `every`
    seconds (counted batch by batch, so a long chunk, the probe's first one too, is no silence), one at
    the end: rows done of total, rows/s since the run started (the summary's `this run` rate), and the time
    left at the rate since the first chunk started (start-up is not spent again)."""

    def __init__(self, console: Console, every: float = 30.0):
        self.console, self.every = console, every
        self.rows = self.tokens = self.total = self.before = self.shown = 0
        self.inflight = (0, 0)  # rows and tokens run so far in the chunk not yet committed
        self.started = False
        self.t0 = self.computing = self.last = time.perf_counter()

    def start(self, total_rows: int, done_rows: int, since: float) -> None:
        self.total, self.before, self.started = total_rows, done_rows, True
        self.t0, self.computing = since, time.perf_counter()
        self.last = self.computing
        self._print(
            f"started: {total_rows - done_rows:,} rows to run" + (f" ({done_rows:,} done before)" if done_rows else "")
        )

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        self.partial(0, 0)

    def partial(self, rows: int, tokens: int) -> None:
        self.inflight = (rows, tokens)
        if time.perf_counter() - self.last >= self.every:
            self._line()

    def log(self, message: str) -> None:
        self._print(f"note: {message}")

    def kept(self) -> Kept | None:
        return Kept(self.before + self.rows, self.total, self.inflight[0]) if self.started else None

    def stop(self) -> None:
        self._line()  # rows in flight included, as the lines before: what a stop keeps is said by kept()

    def _line(self) -> None:
        rows, tokens = self.rows + self.inflight[0], self.tokens + self.inflight[1]
        # nothing new since the last line (the end, said by its last batch), or fewer: a count never goes back
        if rows <= self.shown:
            return
        self.last, self.shown = time.perf_counter(), rows
        elapsed = max(self.last - self.t0, 1e-9)
        done = self.before + rows
        left = max(self.total - done, 0)
        computing = rows / max(self.last - self.computing, 1e-9)
        eta = _duration(left / computing) if rows else "?"
        share = f" ({done / self.total:.1%})" if self.total else ""
        self._print(
            f"{done:,}/{self.total:,} rows{share}, {rows / elapsed:,.1f} rows/s and "
            f"{tokens / elapsed:,.0f} input tokens/s since the run started, {eta} left"
        )

    def _print(self, text: str) -> None:
        self.console.print(
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", highlight=False, markup=False, soft_wrap=True
        )


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def compute_line(run: dict) -> str:
    """A report's compute rate in words: rows over the processing loop's seconds, start-up left out."""
    compute = run["compute"]
    return (
        f"{compute['rows_per_s']:,.1f} rows/s over the {compute['seconds']:.1f} s from the first chunk to the last "
        f"(the {max(run['seconds'] - compute['seconds'], 0):.1f} s of start-up and finish not counted)"
    )


def summary_table(report: dict) -> Table:
    table = Table(title=f"batchinfer {report['task']} → {report['output']}", show_header=False, box=None)
    run = report["run"]
    errors = ", ".join(f"{k} {v:,}" for k, v in report["errors_by_reason"].items()) or "none"
    limit = report.get("limit")
    status = "complete" if report["complete"] else f"{report['chunks_done']}/{report['chunks_total']} chunks"
    bad, job = report["rows_error"], report.get("job") or {}
    # the job's rows and rate over every run that committed its chunks, after a Ctrl-C and a resume
    whole = f"{job.get('rows', 0):,} rows in {job.get('seconds', 0):.1f} s of {job.get('runs', 0)} runs"
    rows = [
        ("status", f"{status}: the first {limit:,} rows (--limit)" if limit else status),
        ("rows", f"{report['rows']:,} ({report['rows_ok']:,} ok, {bad:,} error{'s' * (bad != 1)})"),
        ("errors", errors),
        ("truncated", f"{report['truncated']:,}"),
        (
            "this run",
            f"{run['rows']:,} rows in {run['seconds']:.1f} s on {report['device']}: {run['rows_per_s']:,.1f} rows/s, "
            f"{run['tokens_per_s']:,.0f} input tokens/s",
        ),
        ("computing", compute_line(run)),
        *([("whole job", f"{whole}, {job['rows_per_s']:,.1f} rows/s")] if job.get("runs", 0) > 1 else []),
        *([("model", describe_size(report["model_size"]))] if "model_size" in report else []),
        ("padding efficiency", f"{report['padding_efficiency']:.3f} (real / padded tokens)"),
        ("model busy", f"{run['model_busy']:.0%} of the processing loop"),
    ]
    if "generated_tokens" in report:
        ttft = run.get("time_to_first_token_s")
        rows.append(
            (
                "generated",
                f"{report['generated_tokens']:,} tokens, {run['generated_tokens_per_s']:,.1f} tokens/s over the run "
                f"({run['compute']['generated_tokens_per_s']:,.1f} computing)"
                + (f", median time to first token {ttft:.2f} s" if ttft is not None else ""),
            )
        )
    prefix = report.get("prefix")
    if prefix and prefix["saved_tokens"]:
        rows.append(("shared prefix", prefix_line(prefix)))
    skipped = report.get("skipped_shards") or []
    if skipped:  # said here too, since -q hides the notes that named them as the run began
        names = ", ".join(s["source"] for s in skipped[:3]) + (
            f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        )
        rows.append(("skipped", f"{len(skipped)} shard(s) (input.on_bad_shard: skip): {names}; see _errors/"))
    for key, value in rows:
        table.add_row(key, value)
    return table
