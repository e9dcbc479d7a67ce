"""`batchinfer export OUT --format parquet|jsonl|csv -o FILE`: a finished output folder as one file, in input
order, for users who want a single file. Reads the folder only; writes FILE whole or not at all, never inside
an output folder, and replaces (--force) only a file an export wrote."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..errors import OutputError
from ..output.failures import reach_error
from ..output.formats import json_lines
from ..output.job_record import without_limit
from ..output.layout import SUCCESS
from ..output.parts import tables_in_input_order
from ..output.records import error_counts
from ..output.status import FolderStatus
from ..storage import JOB_RECORD, LocalFolder
from .delivery import place

FORMATS = ("parquet", "jsonl", "csv")
EXPORT_KEY = b"batchinfer.export"  # a Parquet export's footer: the job it holds; what lets --force replace it
PARTIAL_KEY = b"batchinfer.export.partial"  # beside it in an export of an unfinished folder: "2/6 chunks"
TMP_PREFIX = ".tmp-export-"  # FILE is written as .tmp-export-XXXXXXXX-FILE beside it, then renamed


@dataclass(frozen=True)
class Exported:
    rows: int
    partial: str | None = None  # what an export of an unfinished folder holds, e.g. "2/6 chunks"; None: all
    errors: int = 0  # rows of the folder in _errors/, which an export does not hold


def export_folder(folder: str, fmt: str, target: Path, force: bool = False, partial: bool = False) -> Exported:
    """Every result row of the finished job in `folder` into `target`. partial: of an unfinished one (a trial
    run with --limit, or a run stopped), the chunks it finished, said in the result and a Parquet footer."""
    if fmt not in FORMATS:
        raise OutputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}", "write e.g. --format parquet")
    check_target(target, fmt, force)
    try:
        state = FolderStatus.of_run(folder)
        lost = state.lost(digests=False)  # the bytes are checked as they are read, below
    except OSError as exc:
        raise reach_error(folder, exc, "read", "check the path or URL and the credentials") from exc
    command = state.command or "batchinfer run JOB.yaml"
    chunks = sum(1 for r in state.done.values() if not r.retry_of)
    total = state.extent.get("job_chunks", state.extent.get("chunks", "?"))
    held = None
    if stray := state.stray_markers():
        raise _stray(folder, stray)
    if not state.succeeded():
        if not partial:
            raise OutputError(
                f"{folder} is not a finished job ({chunks}/{total} chunks done, no {SUCCESS} for the whole job): "
                "an export would miss rows",
                f"finish it ({without_limit(command)}), then export; or export what it holds now with --partial",
            )
        held = f"{chunks}/{total} chunks"
    if lost:  # the check a run makes when it opens the folder: every committed part there, this job's, whole
        raise _lost(folder, lost, command)
    parts = state.parts()
    if not chunks:
        raise OutputError(
            f"{folder}: no chunk has finished yet (0/{total} chunks done), so there is nothing to export",
            f"let the run finish a chunk (batchinfer status {folder} shows how far it is), or resume it: {command}",
        )
    if not parts:
        raise OutputError(f"{folder} holds no result rows (every row is in _errors/)", "see batchinfer status")
    rows = 0

    def tables():
        nonlocal rows
        for table in tables_in_input_order(parts, functools.partial(_read, state, command)):
            rows += table.num_rows
            yield table

    marks = {EXPORT_KEY: state.job["job_id"].encode(), **({PARTIAL_KEY: held.encode()} if held else {})}
    fill = {"parquet": functools.partial(_parquet, metadata=marks), "jsonl": _jsonl, "csv": _csv}[fmt]
    out = LocalFolder(str(target.parent.resolve()))
    try:
        out.make()
        for stale in out.temps_of(target.name, tmp=TMP_PREFIX):  # an export killed mid-write (kill -9 runs no cleanup)
            out.delete(stale)
        if not place(target, lambda f: fill(tables(), f), tmp=TMP_PREFIX, replace=force):
            raise OutputError(f"{target} exists", "give another -o path, or add --force to replace it")
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {exc.strerror or exc}", "choose a writable -o path") from exc
    return Exported(rows, held, sum(error_counts(state.done).values()))


def _read(state: FolderStatus, command: str, part: str) -> pa.Table:
    """A committed part's rows, checked against its seal as they are read."""
    table, problem = state.read_part(part)
    if problem:  # the file under construction goes: it is written whole or not at all
        raise _lost(state.path, {state.committed[part].chunk: problem}, command)
    return table.replace_schema_metadata(None)  # the job id marks the folder's files only


def _stray(folder: str, stray: list[str]) -> OutputError:
    """Markers of another job, or unreadable: which rows they stand for is unknown, so no export is whole."""
    return OutputError(
        f"{folder} holds completion markers that are not this job's: {', '.join(stray[:3])}"
        + (f" and {len(stray) - 3} more" if len(stray) > 3 else ""),
        "move them out of the folder (a run refuses it too; batchinfer status names them), then export",
    )


def _lost(folder: str, lost: dict[str, str], command: str) -> OutputError:
    """Finished chunks whose parts do not hold what they committed (chunk -> what is wrong): an export would
    miss or damage their rows."""
    problems = list(dict.fromkeys(lost.values()))
    return OutputError(
        f"{folder} lost rows of {len(lost)} finished chunk(s): {'; '.join(problems[:3])}"
        f"{' and more' if len(problems) > 3 else ''}; an export would miss or damage them",
        f"rerun {command}: it runs those chunks again; then export",
    )


def check_target(target: Path, fmt: str, force: bool) -> None:
    """Before any work: -o names a file outside every output folder, absent, or (--force) one an export wrote."""
    if target.is_dir():
        raise OutputError(f"-o {target} is a folder", f"give a file path, e.g. -o {target / f'results.{fmt}'}")
    where = target.resolve()  # a link into an output folder leads inside it
    for parent in where.parents:
        if (parent / JOB_RECORD).is_file():
            raise OutputError(
                f"-o {target} lies inside {parent}, a batchinfer output folder: the folder's readers (and a run) "
                "would take the file for part of the job",
                f"write it outside that folder, e.g. -o {parent.parent / where.name}",
            )
    if not (target.exists() or target.is_symlink()):
        return
    if not force:  # create_with below still guards a race
        raise OutputError(f"{target} exists", "give another -o path, or add --force to replace it")
    if target.is_symlink() or not exported(target):
        raise OutputError(
            f"{target} exists and batchinfer cannot tell that an export wrote it: --force replaces only a Parquet "
            f"file of batchinfer export (its footer says so){'; it is a symbolic link' if target.is_symlink() else ''}",
            "give another -o path, or move the file away yourself",
        )


def exported(path: Path) -> bool:
    """Whether `path` is a Parquet file that batchinfer export wrote (a JSONL or CSV file cannot say so)."""
    try:
        metadata = pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return False
    return EXPORT_KEY in (metadata.metadata or {})


def _parquet(tables, f, metadata: dict[bytes, bytes]) -> None:
    writer = None
    try:
        for table in tables:
            table = table.replace_schema_metadata(metadata)
            writer = writer or pq.ParquetWriter(f, table.schema, compression="zstd")
            writer.write_table(table)
    finally:  # also when a part read fails: the writer never outlives the file it writes to
        if writer is not None:
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
