"""`batchinfer export OUT --format parquet|jsonl|csv -o FILE`: a finished output folder as one file, in input
order, for users who want a single file. Reads the folder only; writes FILE whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .errors import OutputError
from .output.failures import reach_error
from .output.formats import json_lines
from .output.layout import SUCCESS
from .output.status import FolderStatus
from .storage import LocalFolder

FORMATS = ("parquet", "jsonl", "csv")


def export_folder(folder: str, fmt: str, target: Path, force: bool = False) -> int:
    """Every result row of the finished job in `folder` into `target`; returns the rows written."""
    if fmt not in FORMATS:
        raise OutputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", "write e.g. --format parquet")
    if target.is_dir():
        raise OutputError(f"-o {target} is a folder", f"give a file path, e.g. -o {target / f'results.{fmt}'}")
    try:
        state = FolderStatus.read(folder)
    except OSError as exc:
        raise reach_error(folder, exc, "read", "check the path or URL and the credentials") from exc
    if state is None:
        raise OutputError(f"{folder} holds no batchinfer run", "give the output.path of a finished job")
    if not state.succeeded() or state.stray_markers():
        chunks = sum(1 for r in state.done.values() if not r.retry_of)
        total = state.extent.get("job_chunks", state.extent.get("chunks", "?"))
        raise OutputError(
            f"{folder} is not a finished job ({chunks}/{total} chunks done, no {SUCCESS}): an export would miss rows",
            f"finish it first ({state.command or 'batchinfer run JOB.yaml'}, without --limit), then export",
        )
    if target.exists() and not force:  # before the work; create_with below still guards a race
        raise OutputError(f"{target} exists", "give another -o path, or add --force to replace it")
    parts = state.parts()
    if not parts:
        raise OutputError(f"{folder} holds no result rows (every row is in _errors/)", "see batchinfer status")
    rows = 0

    def tables():
        nonlocal rows
        for part in parts:
            table = state.read_table(part).replace_schema_metadata(None)  # the job id marks the folder's files only
            rows += table.num_rows
            yield table

    fill = {"parquet": _parquet, "jsonl": _jsonl, "csv": _csv}[fmt]
    out = LocalFolder(str(target.parent.resolve()))
    out.make()
    try:
        if force:
            out.write_with(target.name, lambda f: fill(tables(), f))
        elif not out.create_with(target.name, lambda f: fill(tables(), f)):
            raise OutputError(f"{target} exists", "give another -o path, or add --force to replace it")
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}", "choose a writable -o path") from exc
    return rows


def _parquet(tables, f) -> None:
    writer = None
    for table in tables:
        writer = writer or pq.ParquetWriter(f, table.schema, compression="zstd")
        writer.write_table(table)
    writer.close()


def _jsonl(tables, f) -> None:
    for table in tables:
        f.write("".join(line + "\n" for line in json_lines(table)).encode())


def _csv(tables, f) -> None:
    """Lists and structs (embeddings, scores, entities) as JSON text: CSV has no nested values."""
    for i, table in enumerate(tables):
        for k, field in enumerate(table.schema):
            if pa.types.is_nested(field.type):
                values = [json.dumps(v, ensure_ascii=False) for v in table.column(k).to_pylist()]
                table = table.set_column(k, field.name, pa.array(values, pa.string()))
        pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=i == 0))
