"""What every input format shares: a shard, what a job reads from it (ReadSpec), what discovery learns of it
(ShardInfo) and the rows a read returns (RowBlock).

A format module defines a class with `suffixes`, `inspect(path, spec) -> ShardInfo` (rows, content
digest, columns, value types; run once per shard at discovery) and `reader(shard, spec)` (an object
with `read(start, stop) -> RowBlock` and `close()`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import pyarrow as pa

from ..reasons import Problem
from .column_types import cast_columns


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
