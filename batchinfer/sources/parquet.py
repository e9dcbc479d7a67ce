"""Parquet shards: row counts and identity from the footer, rows read one row group range at a time."""

from __future__ import annotations

import hashlib
import os

import pyarrow as pa
import pyarrow.parquet as pq

from .base import ReadSpec, Shard, ShardInfo, TableReader


class ParquetFormat:
    suffixes = (".parquet", ".pq")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
        types = {c: schema.field(c).type for c in spec.typed if c in schema.names}
        return ShardInfo(file.metadata.num_rows, footer_digest(path), schema.names, types)

    def reader(self, shard: Shard, spec: ReadSpec) -> TableReader:
        return TableReader(lambda start, stop: read_rows(shard.path, start, stop, list(spec.columns)), spec)


def footer_digest(path: str) -> str:
    """The file's size and its footer (schema, row groups, their sizes and statistics): any rewrite of
    the data changes them, and reading them costs one small read however large the file is."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        digest.update(str(size).encode())
        if size >= 12:
            f.seek(size - 8)
            tail = f.read(8)
            length = int.from_bytes(tail[:4], "little")
            f.seek(max(0, size - 8 - length))
            digest.update(f.read(min(length, size - 8)))
    return digest.hexdigest()


def read_rows(path: str, start: int, stop: int, columns: list[str]) -> pa.Table:
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
