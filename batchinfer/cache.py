"""The per-user cache folder, and a memo in it of file digests: a file is hashed whole once, and again only when
its size, times or inode say it may have changed since.

The memo is an SQLite table (one row per absolute path: concurrent workers need no lock of their own). A
cache that cannot be written, or that another process holds locked, costs only the memo: the file is then
hashed.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

MEMO = "digests.sqlite"
# A file changed less than this long ago may change again within the same timestamp tick, unseen by its
# stat (git's "racy" files): it is hashed, but not remembered.
SETTLED_NS = 2_000_000_000
# How long a read or write of the memo waits for another process's lock on it (a write holds it for
# milliseconds): past it the memo is skipped and the file hashed, never a wait as long as the hash itself.
MEMO_WAIT_S = 0.25


def cache_root() -> Path:
    """$BATCHINFER_CACHE, else $XDG_CACHE_HOME/batchinfer, else ~/.cache/batchinfer."""
    if os.environ.get("BATCHINFER_CACHE"):
        return Path(os.environ["BATCHINFER_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "batchinfer"


def file_digest(path: Path) -> str:
    """ "<size>:<SHA-256 of every byte>" of a file, from the memo while its size, mtime, ctime and inode are
    those it was hashed at (ctime changes with any write, and no program can set it back)."""
    path = Path(path).resolve()
    key = _stat_key(path)
    memo = _memo()
    try:
        found = _recall(memo, key) if memo else None
        if found:
            return found
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        found = f"{key[1]}:{digest.hexdigest()}"
        settled = time.time_ns() - max(key[2], key[3]) > SETTLED_NS
        if memo and settled and _stat_key(path) == key:  # not changed while it was read
            _remember(memo, key, found)
        return found
    finally:
        if memo:
            memo.close()


def _stat_key(path: Path) -> tuple:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _memo() -> sqlite3.Connection | None:
    """The memo, or None where the cache cannot hold it (read-only, full, not a folder)."""
    try:
        root = cache_root()
        root.mkdir(parents=True, exist_ok=True)
        memo = sqlite3.connect(root / MEMO, timeout=MEMO_WAIT_S)
    except (OSError, sqlite3.Error):
        return None
    try:
        with memo:
            memo.execute(
                "CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                "ctime_ns INTEGER, inode INTEGER, digest TEXT)"
            )
    except sqlite3.Error:
        memo.close()
        return None
    return memo


def _recall(memo: sqlite3.Connection, key: tuple) -> str | None:
    try:
        row = memo.execute(
            "SELECT digest FROM digests WHERE path = ? AND size = ? AND mtime_ns = ? AND ctime_ns = ? AND inode = ?",
            key,
        ).fetchone()
    except sqlite3.Error:  # a damaged memo: hash again
        return None
    return row[0] if row else None


def _remember(memo: sqlite3.Connection, key: tuple, digest: str) -> None:
    try:
        with memo:
            memo.execute("INSERT OR REPLACE INTO digests VALUES (?, ?, ?, ?, ?, ?)", (*key, digest))
    except sqlite3.Error:  # read-only or full: the next run hashes again
        pass
