"""What every input format shares: shards, read specs, row blocks, and the column types of a job.

A format module defines a class with `suffixes`, `inspect(path, spec) -> ShardInfo` (rows, content
digest, columns, value types; run once per shard at discovery) and `reader(shard, spec)` (an object
with `read(start, stop) -> RowBlock` and `close()`).
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from dataclasses import dataclass, field
from typing import IO, Callable, Protocol

import pyarrow as pa

from ..errors import InputError
from ..reasons import Problem
from ..storage import file_stamp

FULL_HASH_BYTES = 64 << 20  # files up to this size are identified by all their bytes
KINDS_OF = {str: "str", bool: "bool", int: "int", float: "float", list: "list", dict: "dict"}
INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class Shard:
    path: str  # absolute
    name: str  # as shown to users and written to the `source` column
    format: str  # parquet | jsonl | hf | openai
    num_rows: int
    digest: str = ""  # identifies the content: a changed file is never mixed into a resume
    repeats: tuple[tuple[int, str], ...] = ()  # openai: (row, message) for a custom_id seen before
    # The file's version at discovery (storage.file_stamp; a Parquet footer's digest): checked before and
    # after every read, so a file changed while the job runs stops its rows instead of mixing versions.
    stamp: tuple[tuple[str, str], ...] = ()


def shard_contents(shards: list[Shard]) -> dict[str, str]:
    """Shard name -> "rows:digest": what each shard holds, as the job's fingerprint compares it."""
    return {s.name: f"{s.num_rows}:{s.digest}" for s in shards}


@dataclass(frozen=True)
class BadShard:
    name: str
    message: str


@dataclass
class RowBlock:
    """Rows [start, stop) of one shard: the needed columns, plus rows that could not be read at all."""

    table: pa.Table
    bad_rows: dict[int, Problem] = field(default_factory=dict)  # offset in block -> (reason, message)


@dataclass(frozen=True)
class ReadSpec:
    """What a job reads from every shard."""

    columns: tuple[str, ...]  # every column, in a stable order
    text: tuple[str, ...] = ()  # columns whose values must be text
    templated: tuple[str, ...] = ()  # text columns used only in templates: numbers and booleans welcome
    messages: tuple[str, ...] = ()  # columns of chat messages
    id_column: str | None = None
    max_line_bytes: int = 8 << 20
    types: dict[str, pa.DataType] = field(default_factory=dict)  # the job's type of every other column
    options: dict = field(default_factory=dict)  # storage options for URLs

    @property
    def typed(self) -> list[str]:
        """Columns whose type is fixed for the whole job: ids, kept columns, per-row settings."""
        return [c for c in self.columns if c not in self.text and c not in self.messages]


@dataclass
class ShardInfo:
    rows: int
    digest: str
    columns: list[str] | None  # None: rows are checked one by one (OpenAI requests)
    types: dict[str, pa.DataType] = field(default_factory=dict)  # typed columns found in this shard
    keys: list[tuple[int, int, str]] = field(default_factory=list)  # openai: (row, line number, custom_id)
    footer: str = ""  # Parquet: a digest of the footer, checked when a reader opens the file


class Reader(Protocol):
    def read(self, start: int, stop: int) -> RowBlock: ...
    def close(self) -> None: ...


class TableReader:
    """Rows of a typed format (Parquet, saved datasets): read(start, stop) -> table, in the job's types."""

    def __init__(self, read: Callable[[int, int], pa.Table], spec: ReadSpec):
        self._read, self.spec = read, spec

    def read(self, start: int, stop: int) -> RowBlock:
        return RowBlock(cast_columns(self._read(start, stop), self.spec.types))

    def close(self) -> None:
        pass


class ShardUnreadable(Exception):
    """A reader's own word that its shard cannot be read as its format (a damaged file, not a defect in the
    code): raised for the input problems a reader detects, so that such a shard can be skipped."""


class ShardChanged(ShardUnreadable):
    """A shard is not the file discovery saw: it was rewritten, replaced or removed while the job ran."""


class ShardShrank(ShardChanged):
    """A shard holds fewer rows than it did when the job was planned: it changed during the run."""


class CheckedReader:
    """A format's reader, with the shard's file checked against its stamp before and after every read:
    rows read from a file that changed are never returned, and the first read opens nothing changed."""

    def __init__(self, shard: Shard, spec: ReadSpec, reader: Reader):
        self.shard, self.spec, self.reader = shard, spec, reader

    def read(self, start: int, stop: int) -> RowBlock:
        check_unchanged(self.shard, self.spec.options)
        block = self.reader.read(start, stop)
        check_unchanged(self.shard, self.spec.options)
        return block

    def close(self) -> None:
        self.reader.close()


# What each key of a stamp says when it differs, in the order a message names them.
CHANGES = {
    "file": "another file was put in its place",
    "files": "the files in the folder changed",
    "size": "its size went from {was} to {now} bytes",
    "footer": "its Parquet footer changed",
    "modified": "it was modified",
}


def check_unchanged(shard: Shard, options: dict) -> None:
    """Raise ShardChanged when the shard's file is no longer the version discovery stamped."""
    if not shard.stamp:
        return
    was = {k: v for k, v in shard.stamp if k != "footer"}  # the footer is checked where it is read
    try:
        now = file_stamp(shard.path, options)
    except FileNotFoundError:
        raise ShardChanged("the file changed while the job ran: it is gone") from None
    if now != was:
        raise ShardChanged(describe_change(was, now))


def describe_change(was: dict[str, str], now: dict[str, str]) -> str:
    keys = sorted({*was, *now}, key=lambda k: (list(CHANGES).index(k) if k in CHANGES else len(CHANGES), k))
    changes = [
        CHANGES.get(key, f"its {key} changed").format(was=_number(was.get(key)), now=_number(now.get(key)))
        for key in keys
        if was.get(key) != now.get(key)
    ]
    return f"the file changed while the job ran: {', '.join(changes)}"


def _number(text: str | None) -> str:
    return f"{int(text):,}" if text and text.isdigit() else str(text)


def next_row(rows, shard: Shard):
    """The next row of a shard's stream; running out early means the file changed under the job."""
    try:
        return next(rows)
    except StopIteration:
        raise ShardShrank(f"the file now ends early: it held {shard.num_rows:,} rows when the job started") from None


# What says "this file cannot be read": pyarrow's ArrowInvalid for a damaged file (its ArrowIOError is an
# OSError), the errors of gzip and zlib, UnicodeDecodeError for bytes that are not text, and ShardUnreadable,
# which a reader raises for the input problems it finds. Anything else (a KeyError, a plain ValueError) is a
# defect in a reader or a library: it stops the job as an internal error and never skips a shard's rows as bad.
READ_ERRORS = (OSError, EOFError, zlib.error, pa.ArrowInvalid, UnicodeDecodeError, ShardUnreadable)


def describe_read_error(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the file ends early (truncated gzip)"
    if isinstance(exc, ShardUnreadable):
        return str(exc)
    return f"{type(exc).__name__}: {exc}".strip()


def footer(f, size: int) -> bytes:
    """A Parquet file's footer (schema, row groups, their sizes and statistics) from its last bytes."""
    f.seek(size - 8)
    length = int.from_bytes(f.read(4), "little")
    f.seek(max(0, size - 8 - length))
    return f.read(min(length, size - 8))


def footer_digest(f) -> str:
    return hashlib.blake2b(footer(f, f.seek(0, os.SEEK_END)), digest_size=16).hexdigest()


def content_digest(f, modified: float | None = None) -> str:
    """What a file (open for reads at any offset) holds: every byte up to FULL_HASH_BYTES (a same-length
    edit can leave a Parquet footer's sizes and statistics unchanged); beyond, its size, its footer (for
    Parquet: schema, row groups, their sizes and statistics) and its modification time, one small read
    however large the file."""
    digest = hashlib.blake2b(digest_size=16)
    size = f.seek(0, os.SEEK_END)
    digest.update(str(size).encode())
    if size <= FULL_HASH_BYTES:
        f.seek(0)
        while block := f.read(1 << 20):
            digest.update(block)
        return digest.hexdigest()
    digest.update(footer(f, size))
    digest.update(str(modified).encode())
    return digest.hexdigest()


# --- column types -----------------------------------------------------------------------------------------


class Kinds:
    """The kinds of JSON value one column holds across a shard, to fix its Arrow type before reading."""

    def __init__(self):
        self.seen: set[str] = set()
        self.nested: set[pa.DataType] = set()

    def add(self, value) -> None:
        if value is None:
            return
        kind = KINDS_OF.get(type(value), "other")
        if kind == "int" and not INT64[0] <= value <= INT64[1]:
            kind = "bigint"
        self.seen.add(kind)
        if kind in ("list", "dict") and len(self.nested) < 64:
            try:
                self.nested.add(pa.array([value]).type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError):
                self.seen.add("other")  # read row by row later; the bad value becomes that row's error

    def arrow_type(self, is_id: bool) -> pa.DataType:
        """One kind keeps its type; numbers that mix int and float are float (ids excepted); any
        other mix is text, each value written as it stands in the file (strings unquoted)."""
        seen = self.seen
        simple = {
            frozenset({"str"}): pa.string(),
            frozenset({"int"}): pa.int64(),
            frozenset({"float"}): pa.float64(),
            frozenset({"bool"}): pa.bool_(),
        }
        if not seen:
            return pa.null()  # no value here: the other shards decide
        if frozenset(seen) in simple:
            return simple[frozenset(seen)]
        if seen == {"int", "float"} and not is_id:
            return pa.float64()
        if len(seen) == 1 and seen <= {"list", "dict"} and self.nested:
            unified = unify(list(self.nested))
            if unified is not None:
                return unified
        return pa.string()


def unify(types: list[pa.DataType]) -> pa.DataType | None:
    """The one type all of `types` fit in, or None."""
    try:
        schema = pa.unify_schemas([pa.schema([("v", t)]) for t in types], promote_options="permissive")
    except (pa.ArrowException, TypeError):
        return None
    return schema.field("v").type


def job_type(column: str, found: dict[str, pa.DataType], is_id: bool = False) -> pa.DataType:
    """The type of a column across shards (shard name -> type there): the common one, numbers widened
    (integers and floats to float64, but ids to text: an id is never rounded), text when the shards
    disagree otherwise; refused only when a value could not be written as text."""
    types = list(dict.fromkeys(found.values()))
    real = [t for t in types if not pa.types.is_null(t)]
    if len(real) <= 1:
        return real[0] if real else pa.string()
    if all(pa.types.is_integer(t) for t in real):
        return pa.int64()
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in real) and not is_id:
        return pa.float64()
    if all(_text_castable(t) for t in real):
        return pa.string()
    unified = unify(real)
    if unified is None:
        shown = "; ".join(f"{name}: {t}" for name, t in list(found.items())[:4])
        raise InputError(
            f"column '{column}' has types that do not combine across shards ({shown})",
            f"give every shard the same type for '{column}', or leave it out of input.keep",
        )
    return unified


def _text_castable(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_temporal(t)
        or pa.types.is_decimal(t)
    )


def as_text(value) -> str | None:
    """A value of a mixed column as text: strings as they are, anything else as its JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def cast_columns(table: pa.Table, types: dict[str, pa.DataType]) -> pa.Table:
    """A block of a typed format (Parquet, saved datasets) in the job's column types."""
    for i, name in enumerate(table.column_names):
        want = types.get(name)
        if want is not None and table.column(i).type != want:
            # Integers widened to float64 may round past 2**53: a number column, never an id (see job_type).
            table = table.set_column(i, name, table.column(i).cast(want, safe=not pa.types.is_floating(want)))
    return table


class Tap:
    """A stream that shows every block read through it to `see`."""

    def __init__(self, stream: IO[bytes], see):
        self.stream, self.see = stream, see
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.see(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data = self.stream.readline(size)
        self.see(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.stream.close()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
