"""A shard's file identified (every byte of a small file; the size, Parquet footer and modification time of a large
one), held to that version while it is read, and what says a file cannot be read at all."""

from __future__ import annotations

import hashlib
import os
import zlib
from typing import IO

import pyarrow as pa

from ..storage import file_stamp
from .shards import Reader, ReadSpec, RowBlock, Shard

FULL_HASH_BYTES = 64 << 20  # files up to this size are identified by all their bytes


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
    # a parser quotes the bytes it choked on: a binary file read as text puts NULs and escapes on the terminal
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(exc).strip())
    return f"{type(exc).__name__}: {text[:SHOWN]}{'...' if len(text) > SHOWN else ''}"


SHOWN = 300  # characters of a reader's error shown


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
