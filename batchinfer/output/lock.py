"""The folder lock (_lock): one run at a time per output folder, on a local disk and on an object store.

The lock is created whole if absent, names its run (run id, pid, host, the process's boot and start time)
and is rewritten every HEARTBEAT seconds. A lock whose run is dead (on this host: its process is gone; on
another: no heartbeat for LOCK_STALE seconds) is taken over; of two runs taking over at once, only the one
whose lock reads back goes on."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

from ..errors import OutputError
from ..storage import join
from .failures import writing
from .layout import LOCK, dumps

HEARTBEAT = 15.0  # seconds between rewrites of the lock while a run holds it
LOCK_STALE = 120.0  # a lock from another host not rewritten for this long belongs to a dead run
PF_EXITING = 0x4  # the kernel's flag of a process on its way out (/proc/PID/stat field 9)
TAKEOVER_SETTLE = 1.0  # seconds between taking over a dead run's lock and reading it back


class FolderLock:
    def __init__(self, folder, path, started: float | None = None):
        self.folder, self.path = folder, path  # path: shown in messages
        self.run_id = uuid.uuid4().hex
        self.tmp = f".tmp-lock-{self.run_id}-"  # the lock's temporary files name its run (layout.CREATING)
        self.started = time.time() if started is None else started  # for `status`: the run's rate since then
        self._heartbeat: _Heartbeat | None = None

    def acquire(self) -> None:
        if not writing(self.path, lambda: self.folder.create(LOCK, self.content(), tmp=self.tmp)):
            self._take_over()
        self._heartbeat = _Heartbeat(self)

    def _take_over(self) -> None:
        """The lock exists: refuse while its run lives; else replace it, wait, and read it back, so that of
        two runs taking over the same dead lock at once only the one whose lock stays goes on."""
        holder = live_holder(self.folder, self.run_id)
        if holder:
            raise OutputError(
                f"output folder {self.path} is in use by another batchinfer run (pid {holder['pid']}) on "
                f"host {holder['host']}",
                "wait for it to finish, stop it, or choose another output.path",
            )
        if read_lock(self.folder.read(LOCK)) is None and self.folder.read(LOCK) is not None:
            raise OutputError(
                f"{join(str(self.path), LOCK)} is not a batchinfer lock",
                "choose another output.path; batchinfer does not remove files it did not write",
            )
        content = self.content()
        writing(
            self.path, lambda: self.folder.write(LOCK, content, tmp=self.tmp)
        )  # left by a run that died: take it over
        time.sleep(TAKEOVER_SETTLE)
        if (read_lock(self.folder.read(LOCK)) or {}).get("run_id") != self.run_id:
            holder = read_lock(self.folder.read(LOCK)) or {"pid": "?", "host": "?"}
            raise OutputError(
                f"output folder {self.path} was just taken over by another batchinfer run (pid {holder['pid']}) "
                f"on host {holder['host']}",
                "let that run finish; it resumes this job",
            )

    def content(self) -> bytes:
        return dumps(
            {
                "run_id": self.run_id,
                "pid": os.getpid(),
                "process": process_identity(),
                "host": socket.gethostname(),
                "started": round(self.started, 3),
                "heartbeat": round(time.time(), 3),
            }
        )

    def check(self) -> None:
        """Before a commit: the folder is still this run's (a run that stalled past LOCK_STALE may have
        lost it to another, which must then be the only one committing)."""
        lock = read_lock(self.folder.read(LOCK)) or {"pid": "?", "host": "?"}
        if lock.get("run_id") != self.run_id:
            raise OutputError(
                f"another batchinfer run took over {self.path} (pid {lock['pid']} on host {lock['host']}) "
                "while this one stalled",
                "let that run finish; it resumes this job",
            )

    def release(self) -> None:
        if self._heartbeat is None:
            return
        self._heartbeat.stop()
        self._heartbeat = None
        if (read_lock(self.folder.read(LOCK)) or {}).get("run_id") == self.run_id:
            self.folder.delete(LOCK)


class _Heartbeat:
    """Rewrites the lock every HEARTBEAT seconds while the run holds it, so runs on other machines can
    tell a live holder from a dead one; notes it if another run has taken the lock meanwhile."""

    def __init__(self, lock: FolderLock):
        self.lock, self.lost = lock, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="batchinfer-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        folder = self.lock.folder
        while not self._stop.wait(HEARTBEAT):
            try:
                lock = read_lock(folder.read(LOCK))
                if lock is None or lock.get("run_id") != self.lock.run_id:
                    self.lost = lock or {"pid": "?", "host": "?"}
                    return
                folder.write(LOCK, self.lock.content(), tmp=self.lock.tmp)
            except OSError:
                continue  # a passing storage error: try again at the next beat

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT)


def live_holder(folder, own_run_id: str = "") -> dict | None:
    """The live run holding the folder (other than `own_run_id`), if any. On this host a run is alive while
    its process is; elsewhere while its heartbeat is younger than LOCK_STALE."""
    lock = read_lock(folder.read(LOCK))
    if lock is None or (own_run_id and lock.get("run_id") == own_run_id):
        return None
    if lock["host"] == socket.gethostname():
        return lock if _alive(lock["pid"], lock.get("process")) else None
    beat = lock.get("heartbeat") or folder.mtime(LOCK) or 0
    return lock if time.time() - beat < LOCK_STALE else None


def read_lock(raw: bytes | None) -> dict | None:
    """A lock's content: JSON, or a bare pid as batchinfer 0.1 wrote it."""
    if raw is None:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    if text.isdigit():
        return {"pid": int(text), "host": socket.gethostname(), "run_id": ""}
    try:
        lock = json.loads(text)
    except ValueError:
        return None
    return lock if isinstance(lock, dict) and isinstance(lock.get("pid"), int) and "host" in lock else None


def _alive(pid: int, process: str | None = None) -> bool:
    """Whether the process that wrote a lock still runs: its pid is in use, by that same process (the
    same boot and start time, where the lock recorded them: a restarted container reuses pids)."""
    if process is not None and process != process_identity(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not _ending(pid)
    return not _ending(pid)


def _ending(pid: int) -> bool:
    """Whether process `pid` has ended but for its entry, or is ending (Linux; False elsewhere): a zombie its
    parent has not reaped yet, a process exiting, or one with SIGKILL pending. `kill -9` returns before its
    process has gone, and a shell reaps a killed job when it gets to it: under load the same command run at
    once found its lock's pid still there and refused the folder as in use."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (OSError, IndexError):
        return False
    state, flags = stat[0], int(stat[6])  # /proc/PID/stat fields 3 and 9
    pending = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd:", "ShdPnd:"))]
    return state in ("Z", "X", "x") or bool(flags & PF_EXITING) or any(p >> (signal.SIGKILL - 1) & 1 for p in pending)


def process_identity(pid: int | None = None) -> str | None:
    """The boot and the start time of a process (Linux), which a reused pid does not share; None elsewhere."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return None
