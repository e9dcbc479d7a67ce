"""CSV and TSV shards (.csv, .tsv, optionally gzipped), streamed through pyarrow's CSV reader.

Every column is read as bytes and decoded per field, so a column never changes type half-way through a
file and a field that is not UTF-8 costs its row alone (bad_utf8); discovery fixes the type of each kept
column for the whole job (whole numbers, numbers, or text) and keeps ids as their text. A record with
the wrong number of fields is left out by the parser and reported once, at discovery, as a `bad_csv`
error row naming it: every record is accounted for.
"""

from __future__ import annotations

import hashlib
from typing import IO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ..storage import open_binary
from .base import ReadSpec, RowBlock, Shard, ShardInfo, cast_columns, next_row
from .jsonl import _Gunzip

BLOCK = 1 << 20
_TEXT_HEAD = 200


class CsvFormat:
    suffixes = (".csv", ".tsv", ".csv.gz", ".tsv.gz")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        digest = hashlib.blake2b(digest_size=16)
        bad: list[tuple[int, str]] = []
        with _open(path, spec, digest) as stream:
            reader = _reader(stream, path, bad, spec)
            columns = reader.schema.names
            numeric = {c: [True, True] for c in spec.typed if c in columns and c != spec.id_column}  # [int, float]
            rows = 0
            for batch in reader:
                rows += batch.num_rows
                for column, fits in numeric.items():
                    values = _decode(batch.column(column), column, {})
                    for k, target in enumerate((pa.int64(), pa.float64())):
                        if fits[k]:
                            fits[k] = _casts(values, target)
        types = {c: pa.string() for c in spec.typed if c in columns}
        types.update(
            {c: pa.int64() if fits[0] else pa.float64() if fits[1] else pa.string() for c, fits in numeric.items()}
        )
        return ShardInfo(rows, digest.hexdigest(), columns, types, bad_records=bad)

    def reader(self, shard: Shard, spec: ReadSpec) -> "CsvReader":
        return CsvReader(shard, spec)


class CsvReader:
    """Row ranges of one shard; consecutive ranges continue one open stream."""

    def __init__(self, shard: Shard, spec: ReadSpec):
        self.shard, self.spec = shard, spec
        self._stream: IO[bytes] | None = None
        self._batches = None
        self._pending: pa.Table | None = None
        self._row = 0

    def read(self, start: int, stop: int) -> RowBlock:
        if self._stream is None or start < self._row:
            self.close()
            self._stream = _open(self.shard.path, self.spec)
            self._batches, self._row = iter(_reader(self._stream, self.shard.path, [], self.spec)), 0
            self._pending = None
        pieces, have = [], 0
        while self._row + have < stop:
            table = (
                self._pending
                if self._pending is not None
                else pa.Table.from_batches([next_row(self._batches, self.shard)])
            )
            self._pending = None
            skip = max(0, start - (self._row + have))
            if skip >= table.num_rows:
                self._row += table.num_rows
                continue
            take = min(table.num_rows - skip, stop - (self._row + have) - skip)
            pieces.append(table.slice(skip, take))
            if skip + take < table.num_rows:
                self._pending = table.slice(skip + take)
            self._row += skip
            have += take
        self._row += have
        raw = pa.concat_tables(pieces).select(list(self.spec.columns))
        bad: dict = {}
        table = pa.table({name: _decode(raw.column(name), name, bad) for name in raw.column_names})
        return RowBlock(cast_columns(_nulls_for_empty(table, self.spec), self.spec.types), bad)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = self._batches = self._pending = None


def _open(path: str, spec: ReadSpec, digest=None) -> IO[bytes]:
    raw = open_binary(path, spec.options)
    if digest is not None:
        raw = _Hashing(raw, digest)
    return _Gunzip(raw) if path.lower().endswith(".gz") else raw


def _reader(stream: IO[bytes], path: str, bad: list[tuple[int, str]], spec: ReadSpec) -> pcsv.CSVStreamingReader:
    def invalid(row) -> str:
        text = row.text if len(row.text) <= _TEXT_HEAD else row.text[:_TEXT_HEAD] + "..."
        bad.append(
            (
                row.number,
                f"record {row.number}: {row.actual_columns} fields where the header has {row.expected_columns}: "
                f"{text!r}",
            )
        )
        return "skip"

    delimiter = "\t" if path.lower().removesuffix(".gz").endswith(".tsv") else ","
    parse = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=invalid)
    read = pcsv.ReadOptions(use_threads=False, block_size=BLOCK)
    with _open(path, spec) as first:  # the header alone, to read every column as bytes
        quiet = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=lambda row: "skip")
        names = pcsv.open_csv(first, read_options=read, parse_options=quiet).schema.names
    # Bytes, not text: one field that is not UTF-8 must cost its row, not the shard (see _decode).
    raw = pcsv.ConvertOptions(column_types={name: pa.binary() for name in names}, strings_can_be_null=False)
    return pcsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=raw)


def _decode(values: pa.ChunkedArray, name: str, bad: dict) -> pa.Array:
    """A column of bytes as text; a field that is not UTF-8 makes its row a bad_utf8 error row."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        pass
    decoded = []
    for offset, value in enumerate(values.to_pylist()):
        try:
            decoded.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            decoded.append(None)
            bad.setdefault(offset, ("bad_utf8", f"field '{name}' is not UTF-8: {exc.reason} at byte {exc.start}"))
    return pa.array(decoded, pa.string())


def _casts(values: pa.ChunkedArray | pa.Array, target: pa.DataType) -> bool:
    present = pc.filter(values, pc.not_equal(values, ""))
    try:
        pc.cast(present, target)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def _nulls_for_empty(table: pa.Table, spec: ReadSpec) -> pa.Table:
    """An empty field of a number column is a missing value."""
    for i, name in enumerate(table.column_names):
        want = spec.types.get(name)
        if want is not None and not pa.types.is_string(want):
            column = table.column(i)
            table = table.set_column(i, name, pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column))
    return table


class _Hashing:
    def __init__(self, stream: IO[bytes], digest):
        self.stream, self.digest = stream, digest
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
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
