"""CSV and TSV shards (.csv, .tsv, optionally gzipped), streamed through pyarrow's CSV reader.

Every column is read as bytes and decoded per field, so a column never changes type half-way through a
file and a field that is not UTF-8 costs its row alone (bad_utf8); discovery fixes the type of each kept
column for the whole job (whole numbers, numbers, or text: numbers only where every field is the number as it
is written back, so 01234 or 1.50 keep their text) and keeps ids as their text.

Every record is accounted for. A row is a data record's 0-based place in the file (the header and blank
lines are not records; a quoted field spanning lines is one record). A record with the wrong number of
fields, which the parser leaves out, keeps its place as a `bad_csv` error row with its id when readable,
so no row after it shifts. A quoted field still open at the end of the file would hide every record
after its quote, and one left open mid-file those up to the next quote: discovery refuses such a file,
naming the line (_runaway_quote tells a quote left open from a field meant to span lines). A file with no
header at all (empty, or blank lines only) holds no rows, as an empty JSONL file does, and so does a file
that is its header alone, with or without a line end after it.
"""

from __future__ import annotations

import atexit
import csv as stdlib_csv
import gc
import hashlib
import io
import itertools
import re
import sys
import time
import traceback
import weakref
from typing import IO, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from ..errors import InputError
from ..reasons import Problem, Reason
from ..storage import open_binary, open_stream
from ..storage.lines import decompressed, gzipped
from .column_types import cast_columns
from .file_identity import Tap, next_row
from .shards import ReadSpec, RowBlock, Shard, ShardInfo

BLOCK = 1 << 20
_TEXT_HEAD = 200
BOM = b"\xef\xbb\xbf"
# The rest of a quoted field after its opening quote: "" is a quote inside it; the first lone quote closes it.
_CLOSE = rb'[^"]*(?:""[^"]*)*"'
_SCAN = 1 << 16  # bytes scanned for quotes in one regex match
_FIELD_LIMIT = 1 << 30  # characters in one field for Python's csv module: pyarrow sets no such limit
# A line that starts inside a quoted field: the field's rest ("" is a quote in it), its closing quote, what follows.
_AFTER_CLOSE = re.compile(r'(?:[^"]|"")*"(.*)', re.DOTALL)


class CsvFormat:
    suffixes = (".csv", ".tsv", ".csv.gz", ".tsv.gz")

    def inspect(self, path: str, spec: ReadSpec) -> ShardInfo:
        digest = hashlib.blake2b(digest_size=16)
        quotes = _QuoteScan(_delimiter(path))
        with _open(path, spec, digest, quotes.feed) as stream:  # a read of its own, not pyarrow's (_arrow_stream)
            while stream.read(BLOCK):
                pass
        try:
            columns, records = _reader(path, spec)
        except pa.ArrowInvalid:
            if _no_header(path, spec):
                return ShardInfo(0, digest.hexdigest(), None)  # no rows, so no column is missing
            if (names := _lone_header(path, spec)) is not None:
                return ShardInfo(0, digest.hexdigest(), names, {c: pa.string() for c in spec.typed if c in names})
            if quotes.open_line is None:
                raise
            columns, records = [], iter(())  # said below, by line
        numeric = {c: [True, True] for c in spec.typed if c in columns and c != spec.id_column}  # [int, float]
        rows = 0
        for table, problem in records:
            rows += table.num_rows
            if problem is not None:  # a stand-in for a bad record: no values to type
                continue
            for column, fits in numeric.items():
                values = _decode(table.column(column), column, {})
                for k, target in enumerate((pa.int64(), pa.float64())):
                    if fits[k]:
                        fits[k] = _written_back(values, target)
        if quotes.open_line is not None:
            record = f"row {rows - 1:,}" if rows else "the header"  # the field runs to the end: the last record
            raise InputError(
                f"shard {path} ends inside a quoted field that opens on line {quotes.open_line:,} ({record}): "
                "every line after that quote would be read as part of the field",
                f'close the quote on line {quotes.open_line:,}, or double a quote meant as text ("")',
            )
        runaway = _runaway_quote(path, spec) if quotes.quoted else None  # a second read, of files with quotes
        if runaway is not None:
            row, opens, closes = runaway
            raise InputError(
                f"shard {path} has a quote left open in {f'row {row:,}' if row >= 0 else 'the header'} (the record "
                f"on line {opens:,}): its quoted field runs on to line {closes:,}, where a quote closes it with "
                "text after it, so the records on the lines between would be read as part of that one field",
                f'close the quote in the record on line {opens:,}, or double a quote meant as text ("")',
            )
        types = {c: pa.string() for c in spec.typed if c in columns}
        types.update(
            {c: pa.int64() if fits[0] else pa.float64() if fits[1] else pa.string() for c, fits in numeric.items()}
        )
        return ShardInfo(rows, digest.hexdigest(), columns, types)

    def reader(self, shard: Shard, spec: ReadSpec) -> "CsvReader":
        return CsvReader(shard, spec)


def _unraisable(shown=sys.unraisablehook):
    """sys.unraisablehook, quiet for one case: pyarrow decodes a record with the wrong number of fields as UTF-8
    before it calls invalid_row_handler, and a record that is not UTF-8 raises there, where Python can only print
    it ('Exception ignored', a traceback); pyarrow then fails the read with the record, which is reported as the
    shard's problem, by name."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, UnicodeDecodeError) and any(
            frame.name.endswith("_handle_invalid_row") for frame in traceback.extract_tb(unraisable.exc_traceback)
        ):
            return
        shown(unraisable)

    return hook


sys.unraisablehook = _unraisable()

# Invalid-row handlers given to pyarrow readers. A reader dropped before its end (a record it refused, a
# range read) lives on in its read-ahead on pyarrow's threads, and the last of them to let go releases the
# handler, which takes the GIL: at exit Python ends that thread, and the process aborts ("terminate called
# without an active exception", pyarrow 24). Exit waits for them.
_HANDLERS: weakref.WeakSet = weakref.WeakSet()


def _handler(handle):
    _HANDLERS.add(handle)
    return handle


@atexit.register
def _let_go(timeout: float = 2.0) -> None:
    if _HANDLERS:
        gc.collect()  # a handler still in a cycle of dead objects (a whole collection: 0.2 s beside torch)
    deadline = time.monotonic() + timeout
    while _HANDLERS and time.monotonic() < deadline:
        time.sleep(0.005)  # the GIL to pyarrow's thread


class CsvReader:
    """Row ranges of one shard; consecutive ranges continue one open stream."""

    def __init__(self, shard: Shard, spec: ReadSpec):
        self.shard, self.spec = shard, spec
        self._records: Iterator[tuple[pa.Table, Problem | None]] | None = None
        self._pending: tuple[pa.Table, Problem | None] | None = None
        self._row = 0

    def read(self, start: int, stop: int) -> RowBlock:
        if self._records is None or start < self._row:
            self.close()
            self._records, self._row = _reader(self.shard.path, self.spec)[1], 0
        pieces, have, bad = [], 0, {}
        while self._row + have < stop:
            table, problem = self._pending or next_row(self._records, self.shard)
            self._pending = None
            skip = max(0, start - (self._row + have))
            if skip >= table.num_rows:
                self._row += table.num_rows
                continue
            take = min(table.num_rows - skip, stop - (self._row + have) - skip)
            if problem is not None:  # a stand-in is one row
                bad[have] = problem
            pieces.append(table.slice(skip, take))
            if skip + take < table.num_rows:
                self._pending = (table.slice(skip + take), problem)
            self._row += skip
            have += take
        self._row += have
        raw = pa.concat_tables(pieces).select(list(self.spec.columns))
        table = pa.table({name: _decode(raw.column(name), name, bad) for name in raw.column_names})
        return RowBlock(cast_columns(_nulls_for_empty(table, self.spec), self.spec.types), bad)

    def close(self) -> None:
        # No close() of the stream: pyarrow may still be reading ahead in it, on its own thread; the last
        # reference to it, the reader's or ours, closes it.
        self._records = self._pending = None


def _open(path: str, spec: ReadSpec, digest=None, see=None) -> IO[bytes]:
    """A shard's bytes, decompressed; `digest` sees the file's bytes, `see` the decompressed ones."""
    raw = open_binary(path, spec.options)
    if digest is not None:
        raw = Tap(raw, digest.update)
    stream = decompressed(raw, path)
    return Tap(stream, see) if see is not None else stream


def _arrow_stream(path: str, spec: ReadSpec) -> pa.NativeFile:
    """A shard's bytes, decompressed, for pyarrow's CSV reader, which reads ahead on threads of its own: a
    Python file there would take the GIL for every block, race a read of ours after a refused record, and be
    released on that thread, as a handler is (see _HANDLERS)."""
    raw = open_stream(path, spec.options)
    return pa.CompressedInputStream(raw, "gzip") if gzipped(path) else raw


def _delimiter(path: str) -> str:
    return "\t" if path.lower().removesuffix(".gz").endswith(".tsv") else ","


class _LeftOut(NamedTuple):
    """A record the parser left out for its number of fields."""

    row: int  # its place among the data records
    message: str
    id: str | None  # its id field, when the record has one


def _reader(path: str, spec: ReadSpec) -> tuple[list[str], Iterator[tuple[pa.Table, Problem | None]]]:
    """The header's column names, and every data record in file order: pieces of (rows, None), and
    (stand-in row, bad_csv problem) for each record with the wrong number of fields."""
    delimiter = _delimiter(path)
    read = pcsv.ReadOptions(use_threads=False, block_size=BLOCK)
    skip = _handler(lambda row: "skip")
    quiet = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=skip)
    # the header alone, to read every column as bytes
    names = pcsv.open_csv(_arrow_stream(path, spec), read_options=read, parse_options=quiet).schema.names
    id_at = names.index(spec.id_column) if spec.id_column in names else None
    left_out: list[_LeftOut] = []

    def invalid(row) -> str:
        if row.number < 2:  # its place is unknown (-1): stop rather than shift every later row
            return "error"
        try:  # its id, as Python's csv module reads the record: best effort, the record is broken
            fields = next(stdlib_csv.reader(io.StringIO(row.text, newline=""), delimiter=delimiter), [])
        except stdlib_csv.Error:
            fields = []
        text = row.text if len(row.text) <= _TEXT_HEAD else row.text[:_TEXT_HEAD] + "..."
        message = f"{row.actual_columns} fields where the header has {row.expected_columns}: {text!r}"
        # Only a first field stays in place whatever stray delimiter broke the record; any other may be shifted.
        record_id = fields[0] if id_at == 0 and fields else None
        left_out.append(_LeftOut(row.number - 2, message, record_id))  # record 1 is the header
        return "skip"

    def stand_in(record: _LeftOut) -> pa.Table:
        value = record.id.encode() if record.id is not None else None
        return pa.table({n: pa.array([value if n == spec.id_column else None], pa.binary()) for n in names})

    parse = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True, invalid_row_handler=_handler(invalid))
    # Bytes, not text: one field that is not UTF-8 must cost its row, not the shard (see _decode).
    raw = pcsv.ConvertOptions(column_types={name: pa.binary() for name in names}, strings_can_be_null=False)
    batches = pcsv.open_csv(_arrow_stream(path, spec), read_options=read, parse_options=parse, convert_options=raw)
    return names, _records(batches, left_out, stand_in)


def _records(batches, left_out: list[_LeftOut], stand_in) -> Iterator[tuple[pa.Table, Problem | None]]:
    """The parser's rows with a stand-in put back at the place of each record it left out. The parser
    reports a bad record while it parses the record's block, before it yields that block's rows, so
    `left_out` is complete up to the end of each batch taken here; a report out of order stops the read."""
    at, k = 0, 0  # the next record's row; left_out[k] is the next bad record to place
    for batch in itertools.chain(batches, [None]):  # None: bad records after the last good one
        rows = pa.Table.from_batches([batch]) if batch is not None else None
        while True:
            while k < len(left_out) and left_out[k].row <= at:
                if left_out[k].row < at:
                    raise ValueError(f"the CSV parser reported record {left_out[k].row + 2} out of order")
                yield stand_in(left_out[k]), (Reason.BAD_CSV, left_out[k].message)
                at, k = at + 1, k + 1
            if rows is None or not rows.num_rows:
                break
            take = min(rows.num_rows, left_out[k].row - at) if k < len(left_out) else rows.num_rows
            yield rows.slice(0, take), None
            rows, at = rows.slice(take), at + take
    if k < len(left_out):
        raise ValueError(f"the CSV parser reported record {left_out[k].row + 2} past the end of the file")


def _runaway_quote(path: str, spec: ReadSpec) -> tuple[int, int, int] | None:
    """(row, line it starts on, line its field closes on) of the first record with a quoted field that runs over
    a line break and whose closing quote has text after it, read by Python's csv module in strict mode (quotes
    open a field only at its start, as pyarrow reads them). That is a quote left open: it swallows the lines
    after it up to the next quote, which opens another field and so is followed by text. A field meant to hold
    line breaks closes as every quoted field does, before a delimiter or a line end (spaces aside). None: no
    such record (a quote closed with text after it on one line joins no record; pyarrow reads it as one field)."""
    stdlib_csv.field_size_limit(max(stdlib_csv.field_size_limit(), _FIELD_LIMIT))  # 128 KiB by default
    delimiter = _delimiter(path)
    with _open(path, spec) as raw:
        lines = _Lines(raw)
        reader = stdlib_csv.reader(lines, delimiter=delimiter, strict=True)
        records, line = 0, 0  # records read (blank lines are none), and the lines they took
        while True:
            try:
                if next(reader):
                    records += 1
            except StopIteration:
                return None
            except stdlib_csv.Error:
                if reader.line_num > line + 1 and _text_after_close(lines.last, delimiter):
                    return records - 1, line + 1, reader.line_num  # record 0 is the header
                records += 1  # the rest of the line is dropped: the record ends there, as it does for pyarrow
            line = reader.line_num


class _Lines:
    """A shard's lines as text, each whole (a line break never falls inside a UTF-8 character), remembering
    the last one handed out: the line a csv error is on."""

    def __init__(self, stream: IO[bytes]):
        self.stream, self.last = stream, ""

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(iter(self.stream.readline, b"")):
            self.last = (line.removeprefix(BOM) if number == 0 else line).decode("utf-8", "replace")
            yield self.last


def _text_after_close(line: str, delimiter: str) -> bool:
    """Whether a line that starts inside a quoted field has more than spaces between the quote that closes the
    field and the next delimiter or line end."""
    closed = _AFTER_CLOSE.match(line)
    return closed is not None and bool(closed.group(1).split(delimiter, 1)[0].strip())


def _no_header(path: str, spec: ReadSpec) -> bool:
    """Whether a file pyarrow finds no header in has none: nothing but a byte-order mark and blank lines."""
    with _open(path, spec) as stream:
        first = True
        while block := stream.read(BLOCK):
            if (block.removeprefix(BOM) if first else block).strip(b"\r\n"):
                return False
            first = False
    return True


def _lone_header(path: str, spec: ReadSpec) -> list[str] | None:
    """The column names of a file that is one header line with no line end after it (pyarrow finds no
    columns in it: "Empty CSV file"), read as Python's csv module reads them; None for any other file."""
    with _open(path, spec) as stream:
        head = stream.read(BLOCK + 1)
    delimiter = _delimiter(path)
    if len(head) > BLOCK or b"\n" in head or b"\r" in head:
        return None
    try:
        return next(stdlib_csv.reader([head.removeprefix(BOM).decode("utf-8")], delimiter=delimiter))
    except (UnicodeDecodeError, stdlib_csv.Error):
        return None


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
            bad.setdefault(offset, (Reason.BAD_UTF8, f"field '{name}' is not UTF-8: {exc.reason} at byte {exc.start}"))
    return pa.array(decoded, pa.string())


def _written_back(values: pa.ChunkedArray | pa.Array, target: pa.DataType) -> bool:
    """Whether every field that is not empty reads as a `target` number whose text, written back, is the field's:
    42, -3, 1.5, 2.0 (a whole float as Python writes it; Arrow writes 2), never 01234, +5, 1.50, 1e3 or 0x10,
    which a number column would hand on changed."""
    present = pc.filter(values, pc.not_equal(values, ""))
    try:
        written = pc.cast(pc.cast(present, target), pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    same = pc.equal(written, present)
    if pa.types.is_floating(target):
        whole = pc.match_substring_regex(written, r"^-?[0-9]+$")
        same = pc.or_(same, pc.and_(whole, pc.equal(pc.binary_join_element_wise(written, ".0", ""), present)))
    return pc.all(same).as_py() is not False


def _nulls_for_empty(table: pa.Table, spec: ReadSpec) -> pa.Table:
    """An empty field of a number column is a missing value."""
    for i, name in enumerate(table.column_names):
        want = spec.types.get(name)
        if want is not None and not pa.types.is_string(want):
            column = table.column(i)
            table = table.set_column(i, name, pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column))
    return table


class _QuoteScan:
    """Whether a file's bytes, seen in order, end inside a quoted field, read as pyarrow reads them: a
    quote opens a field only at the field's start, and "" inside the field is a quote. pyarrow reads
    such a file without complaint, every record after the quote swallowed by that one field."""

    def __init__(self, delimiter: str):
        starts = rb"[\r\n" + re.escape(delimiter.encode()) + rb"]"  # what a field's first byte follows
        self._close = re.compile(_CLOSE + rb'(?!")')
        # Bytes outside quotes and whole quoted fields, up to the opening quote of a field that does not
        # close before the last byte (which could be half of ""). One match: no Python loop per field.
        self._skip = re.compile(rb'(?:[^"]+|(?<=' + starts + rb')"' + _CLOSE + rb'(?=[^"])|(?<!' + starts + rb')")*')
        self._carry = b"\n"  # the bytes before the next block: a line start, the first time
        self._inside, self._first = False, True
        self._lines = 0  # line endings before the next block
        self._line = 0  # the line of the quote that opened the field we are inside
        self.quoted = False  # whether the file holds a quote at all

    def feed(self, data: bytes) -> None:
        self.quoted = self.quoted or b'"' in data
        if self._first and data:
            data, self._first = data.removeprefix(BOM), False
        for i in range(0, len(data), _SCAN):  # the regex engine holds memory per field matched: bound it
            self._scan(data[i : i + _SCAN])

    def _scan(self, block: bytes) -> None:
        data = self._carry + block
        at = 0 if self._inside else len(self._carry)  # a carried byte is a quote to match again, or context
        if self._inside:
            closed = self._close.match(data, at)
            at = closed.end() if closed else len(data)
        if not self._inside or at < len(data):  # outside quotes at `at`
            at = self._skip.match(data, at).end()
            if at < len(data):  # the opening quote of a field still open
                self._line = self._lines + block.count(b"\n", 0, at - (len(data) - len(block))) + 1
                closed = self._close.match(data, at + 1)
            self._inside = at < len(data)
        # What the next block needs: the byte before it, or a last quote that may close the open field.
        self._carry = data[-1:] if not self._inside or closed else b""
        self._lines += block.count(b"\n")

    @property
    def open_line(self) -> int | None:
        """At the end of the file: the line of the quote that opened a field still open, else None."""
        return self._line if self._inside and self._carry != b'"' else None
