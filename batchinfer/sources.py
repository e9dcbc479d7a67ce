"""Shards on disk → row ranges as Arrow tables. Knows nothing of models.

Formats: Parquet (row groups read on demand), JSONL and JSONL.gz (streamed line by line, so a
gzip needs no seeking), and folders written by `datasets.Dataset.save_to_disk` (memory-mapped).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from .config import InputConfig
from .errors import InputError
from .openai_batch import parse_request
from .prepare import message_problem

SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".jsonl.gz": "jsonl"}
HF_MARKERS = ("dataset_info.json", "state.json")


@dataclass(frozen=True)
class Shard:
    path: str  # absolute
    name: str  # as shown to users and written to the `source` column
    format: str  # parquet | jsonl | hf
    num_rows: int


@dataclass
class RowBlock:
    """Rows [start, stop) of one shard: the needed columns, plus rows that could not be read at all."""

    table: pa.Table
    bad_rows: dict[int, tuple[str, str]] = field(default_factory=dict)  # offset in block -> (reason, message)


def shard_format(path: Path, declared: str = "auto") -> str | None:
    if path.is_dir():
        return "hf" if any((path / m).exists() for m in HF_MARKERS) else None
    if declared != "auto":
        return declared
    name = path.name.lower()
    return next((fmt for suffix, fmt in SUFFIXES.items() if name.endswith(suffix)), None)


@dataclass(frozen=True)
class BadShard:
    name: str
    message: str


def discover_shards(cfg: InputConfig, columns: list[str] | None = None) -> tuple[list[Shard], list[BadShard]]:
    """Expand input.path into shards in a stable order, with their row counts.

    Every shard is opened and checked for the needed columns here, so a corrupt or foreign file
    stops the job before any work (on_bad_shard: fail) or is left out and reported (skip).
    """
    paths = _expand(cfg.path, cfg.format)
    root = _common_root(paths)
    shards, bad = [], []
    for path in paths:
        fmt = shard_format(path, cfg.format)
        name = os.path.relpath(path, root) if root else path.name
        try:
            shard = Shard(str(path.resolve()), name, fmt, _count_rows(path, fmt))
            check_columns(shard, columns or cfg.columns)
        except InputError as exc:
            if cfg.on_bad_shard == "fail":
                raise InputError(exc.message, exc.hint + ("; or set input.on_bad_shard: skip to leave it out"
                                                          if len(paths) > 1 else ""))
            bad.append(BadShard(name, exc.message))
            continue
        shards.append(shard)
    if not shards:
        raise InputError(f"no readable shard: {bad[0].message}" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""),
                         "fix the input files or input.text / input.id / input.keep")
    return shards, bad


def _expand(pattern: str, declared: str) -> list[Path]:
    if any(ch in pattern for ch in "*?["):
        matches = [Path(p) for p in sorted(glob.glob(pattern, recursive=True))]
        where = f"the glob {pattern}"
    else:
        path = Path(pattern)
        if not path.exists():
            raise InputError(f"input.path {pattern} does not exist", "check the path; it is taken from the current directory")
        matches = [path] if path.is_file() or shard_format(path) == "hf" else sorted(
            p for p in path.rglob("*") if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
        )
        where = f"the folder {pattern}"
    shards = [p for p in matches if shard_format(p, declared)]
    if not shards:
        found = ", ".join(sorted({p.suffix or p.name for p in matches if p.is_file()})[:8]) or "nothing"
        raise InputError(
            f"{where} holds no .parquet, .jsonl, .jsonl.gz file or saved dataset folder (found: {found})",
            "point input.path at your shards, or set input.format for files with another extension",
        )
    return shards


def _common_root(paths: list[Path]) -> str | None:
    if len(paths) == 1:
        return None
    return os.path.commonpath([str(p.resolve().parent) for p in paths])


def _count_rows(path: Path, fmt: str) -> int:
    try:
        if fmt == "parquet":
            return pq.ParquetFile(path).metadata.num_rows
        if fmt == "hf":
            return len(_load_hf(path))
        with _open_lines(path) as stream:  # jsonl and openai
            return sum(1 for _ in _jsonl_lines(stream))
    except READ_ERRORS as exc:
        raise InputError(f"shard {path} cannot be read: {describe_read_error(exc)}", "replace or remove the file") from exc


# What a truncated, corrupt or foreign file raises from pyarrow, gzip, zlib or datasets.
READ_ERRORS = (OSError, EOFError, zlib.error, pa.ArrowException, ValueError, KeyError)


def describe_read_error(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the file ends early (truncated gzip)"
    return f"{type(exc).__name__}: {exc}".strip()


def check_columns(shard: Shard, columns: list[str]) -> None:
    """Fail early, listing what exists, when the first shard lacks a needed column."""
    present = shard_columns(shard)
    if present is None:
        return
    missing = [c for c in columns if c not in present]
    if missing:
        raise InputError(
            f"column {', '.join(repr(c) for c in missing)} not found in {shard.name}; it has: {', '.join(present)}",
            "fix input.text, input.id or input.keep to name existing columns, or remove the shard of another schema",
        )


def shard_columns(shard: Shard) -> list[str] | None:
    if shard.format == "openai":
        return None  # request lines are checked one by one; a bad one becomes an error line
    if shard.format == "parquet":
        return pq.ParquetFile(shard.path).schema_arrow.names
    if shard.format == "hf":
        return _load_hf(Path(shard.path)).column_names
    with _open_lines(Path(shard.path)) as stream:
        for line in _jsonl_lines(stream):
            try:
                first = json.loads(line)
            except ValueError:
                continue
            return list(first) if isinstance(first, dict) else None
    return None


# --- reading ------------------------------------------------------------------------------------------------


class ShardReader:
    """Reads row ranges of one shard. Sequential ranges of a JSONL shard continue one open stream."""

    def __init__(self, shard: Shard, columns: list[str], text_columns: list[str], message_columns: list[str] = ()):
        self.shard = shard
        self.columns = columns
        self.text_columns = set(text_columns)
        self.message_columns = set(message_columns)
        self._stream: IO[bytes] | None = None
        self._line = 0

    def read(self, start: int, stop: int) -> RowBlock:
        if self.shard.format == "parquet":
            return RowBlock(_read_parquet_rows(self.shard.path, start, stop, self.columns))
        if self.shard.format == "hf":
            return RowBlock(_load_hf(Path(self.shard.path)).data.table.select(self.columns).slice(start, stop - start))
        return self._read_jsonl(start, stop)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _read_jsonl(self, start: int, stop: int) -> RowBlock:
        if self._stream is None or start < self._line:
            self.close()
            self._stream, self._line = _open_lines(Path(self.shard.path)), 0
        lines = _jsonl_lines(self._stream)
        while self._line < start:
            next(lines)
            self._line += 1
        values: dict[str, list] = {c: [] for c in self.columns}
        bad: dict[int, tuple[str, str]] = {}
        for offset in range(stop - start):
            line = next(lines)
            self._line += 1
            record, problem = _parse_line(line)
            if problem is None and self.shard.format == "openai":
                record, problem = parse_request(record)
            if problem is None:
                for column in self.text_columns:
                    value = record.get(column)
                    if value is not None and not isinstance(value, str):
                        problem = ("not_text", f"field '{column}' is {type(value).__name__}, not text")
                        break
                for column in self.message_columns:
                    problem = problem or message_problem(record.get(column), f"field '{column}'")
            if problem:
                bad[offset] = problem
                record = {"custom_id": record.get("custom_id")} if self.shard.format == "openai" else {}
            for column in self.columns:
                values[column].append(record.get(column))
        return RowBlock(pa.table({c: _to_arrow(v) for c, v in values.items()}), bad)


def _parse_line(line: bytes) -> tuple[dict, tuple[str, str] | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return {}, ("bad_utf8", f"line is not UTF-8: {exc.reason} at byte {exc.start}")
    if not text.strip():
        return {}, ("bad_json", "line is empty")
    try:
        record = json.loads(text)
    except ValueError as exc:
        return {}, ("bad_json", f"line is not JSON: {exc}")
    if not isinstance(record, dict):
        return {}, ("bad_json", f"line is a JSON {type(record).__name__}, not an object")
    return record, None


def _to_arrow(values: list) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError):
        # Mixed types in a kept column: keep every value, as its JSON text.
        return pa.array([None if v is None else json.dumps(v, ensure_ascii=False) for v in values], pa.string())


def _read_parquet_rows(path: str, start: int, stop: int, columns: list[str]) -> pa.Table:
    """Read only the row groups that overlap [start, stop), then slice."""
    file = pq.ParquetFile(path)
    groups, first_row, row = [], None, 0
    for index in range(file.metadata.num_row_groups):
        count = file.metadata.row_group(index).num_rows
        if row + count > start and row < stop:
            groups.append(index)
            first_row = row if first_row is None else first_row
        row += count
    if not groups:
        return file.schema_arrow.empty_table().select(columns)
    table = file.read_row_groups(groups, columns=columns)
    return table.slice(start - first_row, stop - start)


def _open_lines(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _jsonl_lines(stream: IO[bytes]):
    """Every line is a row; a final newline does not start another. A UTF-8 byte-order mark is dropped."""
    for number, line in enumerate(stream):
        if number == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        yield line.rstrip(b"\r\n")


_HF_CACHE: dict[str, object] = {}


def _load_hf(path: Path):
    key = str(path.resolve())
    if key not in _HF_CACHE:
        import datasets

        loaded = datasets.load_from_disk(key)
        if isinstance(loaded, datasets.DatasetDict):
            raise InputError(
                f"{path} holds a DatasetDict with splits {', '.join(loaded)}",
                f"point input.path at one split, e.g. {path}/{next(iter(loaded))}",
            )
        _HF_CACHE[key] = loaded
    return _HF_CACHE[key]
