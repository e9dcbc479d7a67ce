"""Parquet shards: row counts from the footer, identity from the bytes, rows read one row group range at
a time."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from ..storage import modified, open_random
from .base import ReadSpec, Shard, ShardInfo, TableReader, content_digest


class ParquetFormat:
    suffixes = (".parquet", ".pq")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        with open_random(path, spec.options) as f:
            file = pq.ParquetFile(f)
            schema = file.schema_arrow
            types = {c: schema.field(c).type for c in spec.typed if c in schema.names}
            return ShardInfo(
                file.metadata.num_rows, content_digest(f, modified(path, spec.options)), schema.names, types
            )

    def reader(self, shard: Shard, spec: ReadSpec) -> TableReader:
        columns = list(spec.columns)
        return TableReader(lambda start, stop: read_rows(shard.path, start, stop, columns, spec.options), spec)


def read_rows(path: str, start: int, stop: int, columns: list[str], options: dict | None = None) -> pa.Table:
    """Read only the row groups that overlap [start, stop), then slice."""
    with open_random(path, options) as f:
        return _read_rows(pq.ParquetFile(f), start, stop, columns)


def _read_rows(file: pq.ParquetFile, start: int, stop: int, columns: list[str]) -> pa.Table:
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
