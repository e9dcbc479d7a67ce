"""The output folder: atomic part files, error rows, the manifest, the lock and the report.

A chunk is done when its manifest line is on disk. The part file (and error file) are renamed
into place before that line is written, so after a crash a chunk is either in the manifest with
all its files, or absent and its leftovers are removed on resume.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import OutputError, ResumeError
from .plan import changed_keys

MANIFEST = "_manifest.jsonl"
ERRORS = "_errors"
REPORT = "_report.json"
SUCCESS = "_SUCCESS"
LOCK = "_lock"
SKIPPED = "skipped-shards.parquet"
ERROR_SCHEMA = pa.schema(
    [("id", pa.string()), ("source", pa.string()), ("row", pa.int64()), ("reason", pa.string()), ("message", pa.string())]
)


class OutputDir:
    def __init__(self, path: str | Path, compression: str = "zstd"):
        self.path = Path(path)
        self.compression = None if compression == "none" else compression
        self.command = ""
        self._fingerprint: dict = {}
        self._tuning: dict | None = None

    # --- opening ---------------------------------------------------------------------------------------------

    def open(self, fingerprint: dict, restart: bool, command: str = "", may_change: frozenset = frozenset()) -> dict[str, dict]:
        """Lock the folder, check it holds this job (or nothing), clear leftovers; return finished chunks.

        Keys in `may_change` may differ from the recorded job (--retry-errors after raising max_length);
        the new values are recorded for the runs that follow."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create output folder {self.path}: {exc.strerror}",
                              "choose a writable output.path") from exc
        self._lock()
        if restart:
            self._clear()
        done = self.read_manifest()
        if done is None:
            self._check_foreign_files()
            self._append({"fingerprint": fingerprint, "command": command})
            done = {}
        else:
            old = self.fingerprint()
            changed = changed_keys(old, fingerprint)
            if changed and set(changed) <= may_change:
                self._append({"fingerprint": fingerprint})
                self._fingerprint = fingerprint
            elif changed:
                lines = "; ".join(f"{k}: {old.get(k)!r} -> {fingerprint.get(k)!r}" for k in changed)
                raise ResumeError(
                    f"{self.path} holds results of a different job ({lines})",
                    "rerun with --restart to discard them and start over, or --output NEW_FOLDER to keep them",
                )
        self._remove_leftovers(done)
        return done

    def read_manifest(self) -> dict[str, dict] | None:
        """Finished chunks by name, or None when the folder has no manifest yet. A torn last line is dropped."""
        manifest = self.path / MANIFEST
        if not manifest.exists():
            return None
        raw = manifest.read_bytes()
        lines = raw.split(b"\n")
        records, good_bytes = [], 0
        for line in lines:
            if not line.strip():
                good_bytes += len(line) + 1
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                break  # a line cut by a crash; everything after it is cut too
            good_bytes += len(line) + 1
        if good_bytes < len(raw):
            with open(manifest, "r+b") as f:
                f.truncate(min(good_bytes, len(raw)))
        if not records or "fingerprint" not in records[0]:
            return None
        self._fingerprint = [r for r in records if "fingerprint" in r][-1]["fingerprint"]
        self._tuning = ([r["tuning"] for r in records if "tuning" in r] or [None])[-1]
        self.command = records[0].get("command", "")
        return {r["chunk"]: r for r in records[1:] if "chunk" in r}

    def fingerprint(self) -> dict:
        return self._fingerprint

    def tuning(self) -> dict | None:
        """What a batching probe chose for this folder's job, if one ran."""
        return self._tuning

    def record_tuning(self, tuning: dict) -> None:
        self._append({"tuning": tuning})
        self._tuning = tuning

    def _check_foreign_files(self) -> None:
        foreign = [p.name for p in self.path.iterdir() if p.name != LOCK and not _ours(p.name)]
        if foreign:
            raise OutputError(
                f"output folder {self.path} is not empty and holds no batchinfer run: {', '.join(sorted(foreign)[:5])}",
                "choose an empty or new output.path",
            )

    def _clear(self) -> None:
        for p in self.path.iterdir():
            if _ours(p.name):
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def _remove_leftovers(self, done: dict[str, dict]) -> None:
        """Delete temporary files, files of chunks the manifest does not list, and error files a retry replaced."""
        current = current_errors(done)
        for folder in (self.path, self.path / ERRORS):
            if not folder.is_dir():
                continue
            for p in folder.iterdir():
                name = _chunk_of(p.name)
                replaced = folder.name == ERRORS and name in done and current.get(done[name].get("retry_of", name)) != name
                if p.name.startswith(".tmp-") or (p.name.startswith("part-") and (name not in done or replaced)):
                    p.unlink()
        (self.path / SUCCESS).unlink(missing_ok=True)

    def error_rows(self, name: str) -> pa.Table | None:
        path = self.path / ERRORS / f"part-{name}.parquet"
        return pq.read_table(path) if path.exists() else None

    def drop_errors(self, name: str) -> None:
        (self.path / ERRORS / f"part-{name}.parquet").unlink(missing_ok=True)

    # --- lock ------------------------------------------------------------------------------------------------

    def _lock(self) -> None:
        lock = self.path / LOCK
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pid = _read_pid(lock)
                if pid and _alive(pid) and pid != os.getpid():
                    raise OutputError(
                        f"output folder {self.path} is in use by another batchinfer run (pid {pid})",
                        "wait for it to finish, stop it, or choose another output.path",
                    )
                lock.unlink(missing_ok=True)  # left by a dead run: take it over
                continue
            except OSError as exc:
                raise OutputError(f"cannot write in output folder {self.path}: {exc.strerror}",
                                  "choose a writable output.path") from exc
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise OutputError(f"cannot take the lock {lock}", "remove it if no batchinfer run uses the folder")

    def unlock(self) -> None:
        lock = self.path / LOCK
        if _read_pid(lock) == os.getpid():
            lock.unlink(missing_ok=True)

    def holder(self) -> int | None:
        pid = _read_pid(self.path / LOCK)
        return pid if pid and _alive(pid) else None

    # --- writing ---------------------------------------------------------------------------------------------

    def write_chunk(self, chunk_name: str, results: pa.Table, errors: pa.Table | None) -> None:
        name = f"part-{chunk_name}.parquet"
        if errors is not None and errors.num_rows:
            (self.path / ERRORS).mkdir(exist_ok=True)
            self._write_atomic(errors, self.path / ERRORS / name)
        if results.num_rows:  # a chunk of error rows only has no part file; the manifest records it
            self._write_atomic(results, self.path / name)

    def write_skipped_shards(self, skipped: list[tuple[str, str]]) -> None:
        """One error row per shard left out (input.on_bad_shard: skip); its rows were never read."""
        target = self.path / ERRORS / SKIPPED
        if not skipped:
            target.unlink(missing_ok=True)
            return
        target.parent.mkdir(exist_ok=True)
        names, messages = zip(*skipped)
        table = pa.table({"id": pa.nulls(len(names), pa.string()), "source": list(names),
                          "row": pa.nulls(len(names), pa.int64()), "reason": ["bad_shard"] * len(names),
                          "message": list(messages)}, schema=ERROR_SCHEMA)
        self._write_atomic(table, target)

    def commit(self, record: dict) -> None:
        self._append(record)

    def write_report(self, report: dict, success: bool) -> None:
        tmp = self.path / f".tmp-{REPORT}"
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, self.path / REPORT)
        if success:
            (self.path / SUCCESS).write_text("")
            _fsync_dir(self.path)

    def _write_atomic(self, table: pa.Table, target: Path) -> None:
        tmp = target.with_name(f".tmp-{target.name}")
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression=self.compression)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _write_error(self.path, exc) from exc

    def _append(self, record: dict) -> None:
        try:
            with open(self.path / MANIFEST, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise _write_error(self.path, exc) from exc


def current_errors(done: dict[str, dict]) -> dict[str, str]:
    """For each chunk, the name of the pass whose error file is current: the chunk's, or its latest retry."""
    current = {}
    for name, record in done.items():  # manifest order: a retry comes after what it retries
        current[record.get("retry_of", name)] = name
    return current


def _write_error(path: Path, exc: OSError) -> OutputError:
    if exc.errno == errno.ENOSPC:
        return OutputError(f"the disk holding {path} is full", "free space, then rerun the same command to resume")
    return OutputError(f"cannot write in {path}: {exc.strerror or exc}", "check the folder's permissions, then rerun to resume")


def _ours(name: str) -> bool:
    return name.startswith(("part-", ".tmp-", "_manifest", "_report", "_SUCCESS", "_errors"))


def _chunk_of(filename: str) -> str:
    return filename.removeprefix("part-").removesuffix(".parquet")


def _read_pid(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

