"""Parquet shards: row counts from the footer, identity from the bytes, rows streamed as record batches.

A reader keeps the file open and one stream of record batches on it, so consecutive chunks continue
where the last one stopped: each row group is decoded once however many chunks it holds, and memory
holds a chunk and one batch, never a whole row group (the pandas and pyarrow default is up to a
million rows in one). A range before the stream's place, or in a later row group, starts the stream
again at the row group that holds it.
"""

from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..storage import modified, open_random
from .column_types import cast_columns
from .file_identity import ShardChanged, content_digest, footer_digest, next_row
from .shards import ReadSpec, RowBlock, Shard, ShardInfo

BUFFER = 1 << 20  # bytes read from the file at a time: column chunks are streamed, not loaded whole
MAX_BATCH = 1 << 10  # rows per record batch at most: small batches keep the peak down, whatever the chunk


class ParquetFormat:
    suffixes = (".parquet", ".pq")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        with open_random(path, spec.options) as f:
            file = pq.ParquetFile(f)
            schema = file.schema_arrow
            types = {c: schema.field(c).type for c in spec.typed if c in schema.names}
            digest = content_digest(f, modified(path, spec.options))
            return ShardInfo(file.metadata.num_rows, digest, schema.names, types, footer=footer_digest(f))

    def reader(self, shard: Shard, spec: ReadSpec) -> "ParquetReader":
        return ParquetReader(shard, spec)


class ParquetReader:
    """Row ranges of one shard from one open file and one stream of record batches on it."""

    def __init__(self, shard: Shard, spec: ReadSpec):
        self.shard, self.spec, self.columns = shard, spec, list(spec.columns)
        self._handle: pa.NativeFile | None = None
        self._file: pq.ParquetFile | None = None
        self._starts: list[int] = []  # the first row of every row group, and the row count at the end
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._pending: pa.RecordBatch | None = None  # the rest of the last batch taken from the stream
        self._row = 0  # the stream's place: the shard row its next row is

    def read(self, start: int, stop: int) -> RowBlock:
        if self._file is None:
            self._open()
        group = bisect.bisect_right(self._starts, start) - 1
        if self._batches is None or start < self._row or group > bisect.bisect_right(self._starts, self._row) - 1:
            self._restart(group, stop - start)
        for _ in self._take(start - self._row):  # rows of the row group before the range: decoded, dropped
            pass
        batches = list(self._take(stop - start))
        table = pa.Table.from_batches(batches) if batches else self._file.schema_arrow.empty_table()
        return RowBlock(cast_columns(table.select(self.columns), self.spec.types))

    def _open(self) -> None:
        self._handle = open_random(self.shard.path, self.spec.options)
        expected = dict(self.shard.stamp).get("footer")
        if expected and footer_digest(self._handle) != expected:
            self.close()
            raise ShardChanged("the file changed while the job ran: its Parquet footer changed")
        self._file = pq.ParquetFile(self._handle, pre_buffer=False, buffer_size=BUFFER)
        metadata = self._file.metadata
        self._starts = [0, *accumulate(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))]

    def _restart(self, group: int, rows: int) -> None:
        """The stream from the first row of row group `group`, in batches of about a chunk."""
        groups = range(max(group, 0), len(self._starts) - 1)
        self._batches = self._file.iter_batches(
            batch_size=max(1, min(rows, MAX_BATCH)), row_groups=groups, columns=self.columns
        )
        self._row, self._pending = self._starts[groups.start] if groups else self._starts[-1], None

    def _take(self, count: int) -> Iterator[pa.RecordBatch]:
        """The stream's next `count` rows, as batches (the last one cut, its rest kept for the next read)."""
        while count > 0:
            batch, self._pending = self._pending or next_row(self._batches, self.shard), None
            if batch.num_rows > count:
                batch, self._pending = batch.slice(0, count), batch.slice(count)
            self._row += batch.num_rows
            count -= batch.num_rows
            yield batch

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle = self._file = self._batches = self._pending = None
