"""The digest memo: a file hashed once while unchanged, and never a stall when another process holds the memo."""

import hashlib
import os
import sqlite3
import time

from batchinfer.cache import MEMO, file_digest


def test_a_memo_another_process_holds_locked_is_skipped_not_waited_for(tmp_path, monkeypatch):
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 16))
    old = time.time() - 60  # settled: a digest the memo may keep
    os.utime(data, (old, old))
    expected = f"{1 << 16}:{hashlib.sha256(data.read_bytes()).hexdigest()}"
    assert file_digest(data) == expected  # the memo exists now
    holder = sqlite3.connect(tmp_path / "cache" / MEMO, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as a process stopped mid-write holds it
    try:
        started = time.perf_counter()
        for _ in range(4):
            assert file_digest(data) == expected
        assert time.perf_counter() - started < 4, "each hash waited for the memo's lock"  # was 30 s each
    finally:
        holder.rollback()
        holder.close()
