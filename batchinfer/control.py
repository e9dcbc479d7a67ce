"""What a running job shares between its driver, its executors and its chunk tasks: the stop flag,
the progress protocol and the batching budget. No package imports."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol


class Progress(Protocol):
    def start(self, total_rows: int, done_rows: int) -> None: ...
    def advance(self, rows: int, tokens: int) -> None: ...  # a chunk committed
    def partial(self, rows: int, tokens: int) -> None: ...  # so far in the chunk in flight, batch by batch
    def log(self, message: str) -> None: ...


class Quiet:
    """Progress that shows nothing."""

    def start(self, total_rows: int, done_rows: int) -> None:
        pass

    def advance(self, rows: int, tokens: int) -> None:
        pass

    def partial(self, rows: int, tokens: int) -> None:
        pass

    def log(self, message: str) -> None:
        pass


@dataclass
class Budget:
    """How batches are cut: settled by the job, a recorded probe or a new one, and lowered for the
    rest of the run when a batch runs out of memory."""

    max_tokens: int
    strategy: str
    lowered: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, str]:
        return self.max_tokens, self.strategy


class Interrupted(Exception):
    """The run stopped on request (SIGINT/SIGTERM) after finishing the batch in flight."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclass
class StopFlag:
    """Set from a signal handler; checked between batches."""

    signum: int = 0
    event: threading.Event = field(default_factory=threading.Event)

    def set(self, signum: int) -> None:
        self.signum = signum
        self.event.set()

    def check(self) -> None:
        if self.event.is_set():
            raise Interrupted(self.signum)
