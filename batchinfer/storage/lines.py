"""JSON Lines read one line at a time, with limits, so that no single line can stop a job.

A line longer than the limit is never held whole: its first bytes are kept (to name its id) and the
rest is skipped. A line is parsed on its own; whatever is wrong with it (not UTF-8, not JSON, nested
too deeply, not an object) becomes a (reason, message) for that line alone.

No package imports: sources, the OpenAI request reader and the CLI all use these.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from dataclasses import dataclass
from typing import IO, Iterator

import numpy as np

from ..reasons import Problem, Reason
from . import open_binary

BOM = b"\xef\xbb\xbf"
BLANK = b" \t\r\n"  # JSON's whitespace: a line of nothing else is blank
MAX_DEPTH = 20  # nesting of objects and lists in one line; Parquet cannot read back much deeper schemas
HEAD = 4096  # bytes of an over-long line kept to name it
_SKIP = 1 << 20  # bytes read at a time while skipping the rest of an over-long line
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_MARKS = re.compile(r'[{}\[\],"]')
_COLON = re.compile(r"\s*:\s*")
# A whole JSON string or number and what must follow it in an object, so that a broken value (01, 1.,
# "unterminated) is not read as a shorter one (0, 1) that could be another row's id.
_SCALAR = re.compile(
    r'("(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)'
    r"[ \t\r\n]*[,}]"
)


@dataclass(frozen=True)
class Oversized:
    """A line over the limit: its first HEAD bytes and its full length."""

    head: bytes
    size: int


def open_lines(path: str, options: dict | None = None) -> IO[bytes]:
    """A file's bytes, local or remote (storage.open_binary), decompressed when its name ends in .gz."""
    return decompressed(open_binary(path, options), path)


def gzipped(path: str) -> bool:
    """Whether a shard's bytes are gzip's: every reader of them (Python's or pyarrow's) decides by this."""
    return path.lower().endswith(".gz")


def decompressed(raw: IO[bytes], path: str) -> IO[bytes]:
    """`raw`, read through gzip when `path` ends in .gz; closing it closes `raw`."""
    return _Gunzip(raw) if gzipped(path) else raw


class _Gunzip(gzip.GzipFile):
    """A GzipFile that closes the stream it reads from, too."""

    def __init__(self, raw: IO[bytes]):
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def read_lines(stream: IO[bytes], max_bytes: int) -> Iterator[bytes | Oversized]:
    """Every line of the stream that is not blank, without its line ending (see numbered_lines)."""
    return (line for _, line in numbered_lines(stream, max_bytes))


def numbered_lines(stream: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | Oversized]]:
    """(number, line) for every line of the stream, 1-based, without its line ending; a final newline does not
    start another line, and a UTF-8 byte-order mark before the first line is dropped. A blank line (JSON
    whitespace only) is no row, as in most JSON Lines readers (pandas, DuckDB, vLLM's run_batch): it is
    skipped, so rows are the lines that are not blank and a line's number can differ from its row."""
    number = 0
    while True:
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        if len(line) > max_bytes and not line.endswith(b"\n"):
            size, blank = len(line), not line.strip(BLANK)
            while True:  # skip to the end of the line without holding it
                rest = stream.readline(_SKIP)
                size, blank = size + len(rest), blank and not rest.strip(BLANK)
                if not rest or rest.endswith(b"\n"):
                    break
            if not blank:
                yield number, Oversized(line[:HEAD], size - (1 if rest.endswith(b"\n") else 0))
            continue
        line = line.rstrip(b"\r\n")
        if line.strip(BLANK):
            yield number, line


def count_lines(stream: IO[bytes], block_size: int = 1 << 20) -> int:
    """The lines numbered_lines yields from a stream, counted block by block without reading them one by one."""
    count, open_line = 0, False  # open_line: the line running on into the next block is not blank
    start = stream.read(len(BOM)).removeprefix(BOM)
    for block in itertools.chain([start], iter(lambda: stream.read(block_size), b"")):
        *ended, rest = block.split(b"\n")
        for k, line in enumerate(ended):
            count += bool(line.strip(BLANK)) or (k == 0 and open_line)
        open_line = bool(rest.strip(BLANK)) or (open_line and not ended)
    return count + open_line


def parse_object(line: bytes | Oversized, max_bytes: int) -> tuple[dict | None, Problem | None]:
    """One line → its JSON object, or the reason it is not one."""
    if isinstance(line, Oversized):
        return None, (Reason.TOO_LONG, f"line is {line.size:,} bytes, over input.max_line_bytes ({max_bytes:,})")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (Reason.BAD_UTF8, f"line is not UTF-8: {exc.reason} at byte {exc.start}")
    if not text.strip():
        return None, (Reason.BAD_JSON, "line is empty")
    if too_deep(line):
        return None, (Reason.BAD_JSON, f"line nests objects or lists more than {MAX_DEPTH} levels deep")
    try:
        record = json.loads(text)
    except RecursionError:
        return None, (Reason.BAD_JSON, f"line nests objects or lists more than {MAX_DEPTH} levels deep")
    except ValueError as exc:
        return None, (Reason.BAD_JSON, f"line is not JSON: {exc}")
    if not isinstance(record, dict):
        return None, (Reason.BAD_JSON, f"line is a JSON {type(record).__name__}, not an object")
    return record, None


def too_deep(line: bytes) -> bool:
    """Whether brackets outside strings nest deeper than MAX_DEPTH. Counting first keeps this free
    for ordinary lines: fewer opening brackets than the limit cannot nest past it."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False
    bare = np.frombuffer(_STRINGS.sub(b"", line), dtype=np.uint8)
    step = np.isin(bare, (ord("["), ord("{"))).astype(np.int32) - np.isin(bare, (ord("]"), ord("}")))
    return bool(len(step)) and int(np.cumsum(step).max()) > MAX_DEPTH


def sniff_field(line: bytes | Oversized, key: str) -> str | int | float | None:
    """The scalar value of a top-level `key` in a line that does not parse (too long, too deep,
    broken further on), when it stands in the first HEAD bytes, before the damage; else None."""
    text = (line.head if isinstance(line, Oversized) else line[:HEAD]).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    depth, expect_key = 0, False
    at = _MARKS.search(text)
    while at:
        ch, i = at.group(), at.start()
        if ch == '"':
            try:
                value, end = decoder.raw_decode(text, i)
            except ValueError:
                return None
            colon = _COLON.match(text, end)
            if expect_key and value == key and colon:
                scalar = _SCALAR.match(text, colon.end())
                return json.loads(scalar.group(1)) if scalar else None
            expect_key = False
            at = _MARKS.search(text, end)
            continue
        if ch in "{[":
            depth += 1
            expect_key = ch == "{" and depth == 1
        elif ch in "}]":
            depth -= 1
        else:  # a comma
            expect_key = depth == 1
        at = _MARKS.search(text, i + 1)
    return None
