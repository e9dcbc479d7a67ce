"""JSON Lines shards (.jsonl, .ndjson, optionally gzipped): every line a row, parsed on its own.

Discovery reads each shard once: it counts the lines, hashes the bytes (the shard's identity) and
notes which kinds of value the id and kept columns hold, so their Arrow type is fixed for the whole
job before the first chunk is read. Reading then streams the lines, continuing one open stream
across consecutive chunks (a gzip needs no seeking).
"""

from __future__ import annotations

import hashlib
from typing import IO

import pyarrow as pa

from ..openai_compat.fields import read_messages
from ..reasons import Problem, Reason
from ..storage.lines import Oversized, count_lines, numbered_lines, open_lines, parse_object, read_lines, sniff_field
from .column_types import Kinds, as_text
from .file_identity import ShardUnreadable, Tap, next_row
from .shards import ReadSpec, RowBlock, Shard, ShardInfo

_BLOCK = 1 << 20


class JsonlFormat:
    suffixes = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        digest = hashlib.blake2b(digest_size=16)
        kinds = {c: Kinds() for c in self.typed_columns(spec)}
        columns, keys, rows = None, [], 0
        with open_lines(path, spec.options) as raw:
            stream = Tap(raw, digest.update)
            if not kinds and not self.unique_key:
                columns = self.first_columns(path, spec)
                rows = count_lines(stream, _BLOCK)
            else:
                for rows, (number, line) in enumerate(numbered_lines(stream, spec.max_line_bytes), start=1):
                    record, _ = parse_object(line, spec.max_line_bytes)
                    if record is None:
                        if rows == 1:
                            refuse_binary(line)
                        continue
                    columns = (columns or {}) | dict.fromkeys(record)  # a key one line leaves out is still a column
                    for column, seen in kinds.items():
                        seen.add(record.get(column))
                    key = record.get(self.unique_key) if self.unique_key else None
                    if isinstance(key, str):
                        keys.append((rows - 1, number, key))
        types = {c: k.arrow_type(c == spec.id_column) for c, k in kinds.items()}
        return ShardInfo(
            rows, digest.hexdigest(), self.shown_columns(list(columns) if columns is not None else None), types, keys
        )

    # What the OpenAI request format changes (see openai.py).
    unique_key: str | None = None

    def typed_columns(self, spec: ReadSpec) -> list[str]:
        return spec.typed

    def shown_columns(self, columns: list[str] | None) -> list[str] | None:
        return columns

    def first_columns(self, path: str, spec: ReadSpec, lines: int = 1000) -> list[str] | None:
        """The keys found in the first `lines` lines that are JSON objects (a line may leave a key out)."""
        found: dict | None = None
        with open_lines(path, spec.options) as stream:
            for number, line in enumerate(read_lines(stream, spec.max_line_bytes)):
                record, _ = parse_object(line, spec.max_line_bytes)
                if record is not None:
                    found = (found or {}) | dict.fromkeys(record)
                elif not number:
                    refuse_binary(line)
                if number >= lines:
                    break
        return list(found) if found is not None else None

    def reader(self, shard: Shard, spec: ReadSpec) -> "JsonlReader":
        return JsonlReader(shard, spec, self)

    def record(
        self, line: bytes | Oversized, spec: ReadSpec, row: int, repeats: dict[int, str], where: str
    ) -> tuple[dict, Problem | None]:
        """One line → the row's values, or the reason it cannot run (with its id when readable). row: its row
        (blank lines are no rows); where: its line as an editor numbers it, `line 3 of requests.jsonl`."""
        record, problem = parse_object(line, spec.max_line_bytes)
        if problem:
            return ({spec.id_column: sniff_field(line, spec.id_column)} if spec.id_column else {}), problem
        for column in spec.text:
            value = record.get(column)
            if isinstance(value, (int, float)) and column in spec.templated:  # bool is an int too
                record[column] = as_text(value)  # as JSON spells it: 3, 1.5, true
            elif value is not None and not isinstance(value, str):
                problem = (Reason.NOT_TEXT, f"field '{column}' is {type(value).__name__}, not text")
                break
        for column in spec.messages:
            if not problem:
                record[column], problem = read_messages(record.get(column), f"field '{column}'")
        if problem:
            return ({spec.id_column: record.get(spec.id_column)} if spec.id_column else {}), problem
        return record, None


def refuse_binary(first) -> None:
    """A first line that is no JSON and holds NUL bytes, which JSON text never does: the file is binary (a
    Parquet file read as JSON Lines) or UTF-16, and every line of it would be an error row."""
    if isinstance(first, bytes) and b"\x00" in first:
        raise ShardUnreadable(
            "it is not JSON Lines: its first line holds NUL bytes (a binary file such as Parquet, or text in UTF-16); "
            "check input.format, or save the file as UTF-8"
        )


class JsonlReader:
    """Reads row ranges of one shard. Sequential ranges continue one open stream."""

    def __init__(self, shard: Shard, spec: ReadSpec, fmt: JsonlFormat):
        self.shard, self.spec, self.format = shard, spec, fmt
        self.repeats = dict(shard.repeats)
        self._stream: IO[bytes] | None = None
        self._lines = None
        self._line = 0

    def read(self, start: int, stop: int) -> RowBlock:
        if self._stream is None or start < self._line:
            self.close()
            self._stream, self._line = open_lines(self.shard.path, self.spec.options), 0
            self._lines = numbered_lines(self._stream, self.spec.max_line_bytes)
        while self._line < start:
            next_row(self._lines, self.shard)
            self._line += 1
        values: dict[str, list] = {c: [] for c in self.spec.columns}
        bad: dict[int, Problem] = {}
        for offset in range(stop - start):
            number, line = next_row(self._lines, self.shard)
            where = f"line {number:,} of {self.shard.name}"
            record, problem = self.format.record(line, self.spec, self._line, self.repeats, where)
            self._line += 1
            if problem:
                bad[offset] = problem
            for column in self.spec.columns:
                values[column].append(record.get(column))
        arrays = {}
        for column, column_values in values.items():
            arrays[column] = _to_arrow(column, column_values, self._type(column), bad)
        return RowBlock(pa.table(arrays), bad)

    def _type(self, column: str) -> pa.DataType | None:
        if column in self.spec.text:
            return pa.string()
        return self.spec.types.get(column)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream, self._lines = None, None


def _to_arrow(column: str, values: list, type_: pa.DataType | None, bad: dict[int, Problem]) -> pa.Array:
    """A column of one block in its job type. A value that does not convert (a lone surrogate, a shape
    the type cannot hold) makes its row an error and is left out; the rest of the block is kept."""
    if type_ is not None and pa.types.is_string(type_):
        values = [as_text(v) for v in values]
    try:
        return pa.array(values, type_)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    for offset, value in enumerate(values):
        try:
            pa.array([value], type_)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            values[offset] = None
            bad.setdefault(offset, _value_problem(column, value, exc))
    return pa.array(values, type_)


def _value_problem(column: str, value, exc: BaseException) -> Problem:
    if isinstance(exc, UnicodeEncodeError):
        return (
            Reason.BAD_UTF8,
            f"field '{column}' holds a lone UTF-16 surrogate ({exc.object[exc.start : exc.end]!a}), "
            "which is not valid text",
        )
    return (Reason.BAD_JSON, f"field '{column}' does not fit the column's type: {type(exc).__name__}: {str(exc)[:200]}")
