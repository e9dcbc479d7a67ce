"""What a running job shares between its driver, its executors and its chunk tasks: the stop flag and
the progress protocol. No package imports."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol


class Progress(Protocol):
    # since: the run's start (time.perf_counter()), which the rates it shows count from
    def start(self, total_rows: int, done_rows: int, since: float) -> None: ...
    def advance(self, rows: int, tokens: int) -> None: ...  # a chunk committed
    def partial(self, rows: int, tokens: int) -> None: ...  # so far in the chunk in flight, batch by batch
    def log(self, message: str) -> None: ...


class Quiet:
    """Progress that shows nothing."""

    def start(self, total_rows: int, done_rows: int, since: float) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass

    def partial(self, rows: int, tokens: int) -> None:
        pass

    def log(self, message: str) -> None:
        pass


class Interrupted(Exception):
    """The run stopped on request (SIGINT/SIGTERM): after the batch in flight, or at once while it only
    read (StopFlag.at_once)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class StopFlag:
    """Set from a signal handler; checked between batches and between the steps of loading a chunk.
    Where a run writes nothing (discovering and hashing its input, loading the model, waiting for a chunk
    to be read), `at_once` makes the signal stop the main thread where it is, not when the step ends."""

    signum: int = 0
    event: threading.Event = field(default_factory=threading.Event)
    reading: int = 0  # at_once blocks the main thread is inside

    def set(self, signum: int) -> None:
        self.signum = signum
        self.event.set()
        if self.reading and threading.current_thread() is threading.main_thread():
            raise Interrupted(signum)  # from the signal handler, into the block the main thread is in

    def check(self) -> None:
        if self.event.is_set():
            raise Interrupted(self.signum)

    @contextmanager
    def at_once(self):
        """A block that writes nothing, so that the main thread may be stopped anywhere inside it. Library
        code may turn the exception into its own (pyarrow reading through a Python file) or swallow it
        (a loader trying something else): after a signal, whatever leaves the block is Interrupted."""
        self.check()
        main = threading.current_thread() is threading.main_thread()
        self.reading += main
        try:
            yield
        except Exception as exc:
            if self.event.is_set() and not isinstance(exc, Interrupted):
                raise Interrupted(self.signum) from exc
            raise
        finally:
            self.reading -= main
        self.check()


class Signals:
    """SIGINT and SIGTERM during a run: the first sets the stop flag (the run stops cleanly); the second
    ends the process at once with 128 + signum. The second is seen by a thread of its own (through
    signal.set_wakeup_fd), so it works while the main thread is inside a long call (a batch on the model).
    Nothing is half-written under a final name then: part files and markers are written whole under a
    temporary name first, and the next run takes over the lock of a process that is gone.
    `forced(signum)` says what happened before the process ends. Enter in the main thread."""

    def __init__(self, stop: StopFlag, forced: Callable[[int], None]):
        self.stop, self.forced = stop, forced
        self._lock = threading.Lock()

    def __enter__(self) -> "Signals":
        self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self.previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._watch = threading.Thread(target=self._watch_signals, name="batchinfer-signals", daemon=True)
        self._watch.start()
        return self

    def __exit__(self, *exc) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        os.write(self._write, b"\0")  # wakes the watching thread, which ends
        self._watch.join()
        os.close(self._read)
        os.close(self._write)

    def _on_signal(self, signum: int, _frame) -> None:
        if self.stop.event.is_set():  # the watching thread may not have run yet
            self._force(signum)
        self.stop.set(signum)

    def _watch_signals(self) -> None:
        seen = 0
        while True:
            for signum in os.read(self._read, 64):
                if signum == 0:
                    return
                if signum in (signal.SIGINT, signal.SIGTERM):
                    seen += 1
                    if seen >= 2:
                        self._force(signum)

    def _force(self, signum: int) -> None:
        with self._lock:  # once, whichever thread sees it first
            self.forced(signum)
            os._exit(128 + signum)


_LIBRARY_LOGS = [False]  # --debug: third-party libraries (transformers, Ray) print their own lines too


def show_library_logs(shown: bool) -> None:
    _LIBRARY_LOGS[0] = shown


def library_logs_shown() -> bool:
    return _LIBRARY_LOGS[0]
