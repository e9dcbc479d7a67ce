"""Online batching for encoder runners: requests that arrive close together share batches.

Rows of every request wait in one queue. A window closes when the queued tokens reach the budget or
the oldest row has waited max_wait; the window's rows are then sorted by token count and cut into
batches as offline jobs are (batching.cut.cut_batches), and each batch runs with the same
split-and-retry (runners.recovery.run_resilient). A request's rows may span batches; its results are put back
in order when its last row is done. The queue is bounded in tokens: past it, a request is refused
at once (the server answers 429) instead of waiting without bound, and a request larger than the bound
itself is refused (413) even when the queue is empty, since no one else could run while it did. A
request being tokenized holds a reservation against that bound (an upper estimate of its tokens, at
most the bound), so that requests arriving together are refused before they are tokenized, not after.
A request whose caller went away (cancel) has its rows dropped: those queued at once, and those of the
window being run before each batch.

With serve.p99_ms (latency.LatencyTarget) the window's budget and wait come from measured batch latencies,
and a request predicted to be answered (or to make a request queued before it answered) past the target is
refused at once (Shed: 429 with Retry-After) instead of queued; without it, the fixed window above
(latency.FixedWindow). Either way a batch that runs out of memory lowers the budget below it.

The model runs on one thread of its own; requests are asyncio futures resolved from it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..batching.cut import cut_batches
from ..runners.protocol import BatchRunner
from ..runners.recovery import run_resilient
from .latency import FixedWindow, LatencyTarget


class Overloaded(Exception):
    """The queue holds too much to take this request now; the message says how much."""


class Shed(Overloaded):
    """A request predicted to be answered past serve.p99_ms: refused at once; retry_after, whole seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


def shed(decision, would: str = "be answered") -> Shed:
    """The refusal of a request its Decision did not admit; `would`: what the target bounds."""
    if decision.measured:
        why = f"a request now would {would} in about {milliseconds(decision.predicted)}, past"
    else:
        why = (
            "a request is running and none has been measured yet, so a request now cannot be predicted to "
            f"{would} within"
        )
    return Shed(f"{why} what serve.p99_ms allows ({milliseconds(decision.allowed)})", decision.retry_after)


def milliseconds(seconds: float) -> str:
    """ "1,250 ms", "0.5 ms": a target under a millisecond is no "0 ms"."""
    value = seconds * 1000
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.2g} ms"


class TooLarge(Exception):
    """A request of more tokens than the whole queue holds: never taken; the message says how to split it."""


def refuse_past(limit: int, held: int, tokens: int, least: int = 0) -> None:
    """serve.max_queue_tokens, one bound for every task: a request of `tokens` (or of at least `least`, before it
    is tokenized) that can never fit is TooLarge (413); one that does not fit beside the `held` tokens now is
    Overloaded (429)."""
    if max(tokens, least) > limit:
        size = f"{tokens:,}" if tokens >= least else f"at least {least:,}"
        raise TooLarge(
            f"the request is {size} tokens, more than the queue holds (serve.max_queue_tokens, {limit:,}); "
            f"split it into requests of at most {limit:,} tokens"
        )
    if held + tokens > limit:
        raise Overloaded(f"{held:,} tokens are queued or running, the limit is serve.max_queue_tokens ({limit:,})")


class TokenQueue:
    """Generation's share of serve.max_queue_tokens: each admitted request holds its prompt tokens and the most
    it may generate, from before it is tokenized (an upper estimate, at most the bound) until its last answer
    is out. The event loop alone calls it."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def take(self, tokens: int, least: int) -> Ticket:
        """Hold `tokens` (an estimate, cut to the bound) for a request of at least `least`; raises TooLarge
        or Overloaded before any work."""
        refuse_past(self.limit, 0, 0, least)
        return Ticket(self).settle(min(tokens, self.limit))

    def trade(self, had: int, tokens: int) -> int:
        """A ticket's `had` tokens held as `tokens` instead, if they fit beside the rest (else it raises)."""
        refuse_past(self.limit, self.held - had, tokens)
        self.held += tokens - had
        return tokens


@dataclass
class Ticket:
    """What one request holds of a TokenQueue; released once, however its answer ends."""

    queue: TokenQueue
    tokens: int = 0

    def settle(self, tokens: int) -> Ticket:
        """Hold `tokens` (the real count, once tokenized) instead; raises as take() when they do not fit."""
        self.tokens = self.queue.trade(self.tokens, tokens)
        return self

    def release(self) -> None:
        self.tokens = self.queue.trade(self.tokens, 0)


@dataclass
class Submitted:
    """One caller's rows as submitted to the batcher (not an HTTP request); `future` resolves to (results in
    row order, {row: (reason, message)})."""

    size: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    results: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    left: int = 0
    cancelled: bool = False
    arrived: float = field(default_factory=time.monotonic)
    answered: float = 0.0  # when its last row's result came (time.monotonic)
    expected: float = 0.0  # its latency as predicted when it was admitted (latency.Decision)
    before: float = 0.0  # seconds from its arrival (HTTP) to its submission

    def __post_init__(self):
        self.results = [None] * self.size
        self.left = self.size


@dataclass
class _Row:
    request: Submitted
    position: int
    ids: list
    arrived: float


@dataclass
class BatchStats:
    """What one batch was, for the metrics."""

    rows: int
    requests: int
    tokens: int
    waited: list[float]  # seconds each row waited in the queue
    seconds: float
    budget: tuple[int, int]  # the batch budget (tokens, rows) after it


class Batcher:
    def __init__(
        self,
        runner: BatchRunner,
        max_tokens: int,
        strategy: str,
        max_rows: int,
        max_wait: float,
        max_queue_tokens: int,
        on_batch=lambda stats: None,
        target: float | None = None,
    ):
        """target: serve.p99_ms in seconds (LatencyTarget), None for the fixed window."""
        self.runner, self.strategy, self.max_queue_tokens, self.on_batch = runner, strategy, max_queue_tokens, on_batch
        self.window = (
            LatencyTarget(target, max_tokens, max_rows, max_wait)
            if target
            else FixedWindow(max_tokens, max_rows, max_wait)
        )
        self._queue: deque[_Row] = deque()
        self._queued_tokens = 0
        self._reserved = 0  # tokens of requests being tokenized, counted as queued
        self._stopping = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="batchinfer-batcher", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    @contextmanager
    def reserved(self, tokens: int, least: int = 0, since: float = 0.0):
        """Hold `tokens` of the queue while a request is tokenized; raises Overloaded, before any work, when
        they do not fit, and TooLarge when even `least` (a lower bound of its tokens, and of its rows) is past
        the bound; Shed when even `least` would be answered past serve.p99_ms (submit checks the real count).
        submit(..., reserved=tokens) inside the block trades them for the real count. `since`: seconds since
        the request arrived."""
        refuse_past(self.max_queue_tokens, 0, 0, least)
        tokens = min(tokens, self.max_queue_tokens)  # an estimate past the bound: submit sees the real count
        with self._wake:
            self._admit(tokens, 0)
            self._in_time(least, least, since)
            self._reserved += tokens
        try:
            yield
        finally:
            with self._wake:
                self._reserved -= tokens

    def submit(self, items: list, loop: asyncio.AbstractEventLoop, reserved: int = 0, since: float = 0.0) -> Submitted:
        """Queue a request's items (token ids, one per row); raises Overloaded when the queue is full.
        reserved: the tokens this request holds already (Batcher.reserved); since: the seconds since the request
        arrived (its body read, its tokenizing), which serve.p99_ms counts."""
        tokens = sum(len(item) for item in items)
        request = Submitted(len(items), loop.create_future(), loop, before=since)
        now = time.monotonic()
        with self._wake:
            self._admit(tokens, min(reserved, self.max_queue_tokens))  # as reserved() holds it
            request.expected = self._in_time(tokens, len(items), since).expected
            self._queue.extend(_Row(request, i, item, now) for i, item in enumerate(items))
            self._queued_tokens += tokens
            self._wake.notify()
        if not items:
            loop.call_soon(request.future.set_result, ([], {}))
        return request

    def answered(self, request: Submitted, seconds: float) -> None:
        """`request` was answered to its client `seconds` after it came: the latency serve.p99_ms holds."""
        with self._wake:
            self.window.answered(seconds, request.answered - request.arrived, request.expected, request.before)

    def cancel(self, request: Submitted) -> None:
        """Drop the rows of `request` that have not run (its caller went away): the queued ones now, the rest
        before each batch of the window being run."""
        with self._wake:
            request.cancelled = True
            dropped = [row for row in self._queue if row.request is request]
            if dropped:
                self._queue = deque(row for row in self._queue if row.request is not request)
                self._queued_tokens -= sum(len(row.ids) for row in dropped)

    def _admit(self, tokens: int, own: int) -> None:
        """Refuse `tokens` more when they would pass the queue's bound: now (Overloaded), or ever (TooLarge).
        Called holding the lock."""
        if self._stopping:
            raise Overloaded("it is shutting down")
        refuse_past(self.max_queue_tokens, self._queued_tokens + self._reserved - own, tokens)

    def _in_time(self, tokens: int, rows: int, since: float):
        """Refuse (Shed) a request of `tokens` in `rows`, `since` seconds after it arrived, that the window
        predicts past serve.p99_ms behind what is queued and running; else its latency.Decision. Called holding
        the lock."""
        now, oldest = time.monotonic(), self._queue[0] if self._queue else None
        waited = now - oldest.arrived if oldest else 0.0
        ages = (waited, waited + oldest.request.before if oldest else 0.0, since)  # LatencyTarget.admit's
        decision = self.window.admit(now, self._queued_tokens, len(self._queue), tokens, rows, *ages)
        if not decision.admit:
            raise shed(decision)
        return decision

    def stop(self) -> None:
        """Finish what is queued, then stop."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    # --- the model's thread ----------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    self._wake.wait()
                if not self._queue:
                    return
                rows, full = self._window()
            if rows:
                try:
                    self._run(rows, full)
                except Exception as exc:  # noqa: BLE001 - one failed batch must not leave later requests waiting
                    for row in rows:
                        row.request.loop.call_soon_threadsafe(_reject, row.request.future, exc)
                finally:
                    with self._wake:
                        self.window.idle(time.monotonic())

    def _window(self) -> tuple[list[_Row], bool]:
        """The next window's rows, once the queue holds a budget or its oldest row has waited (holding the
        lock; the queue is not empty when called, and may be emptied by cancel while it waits: then no rows);
        whether the queue held a whole budget."""
        window = self.window
        while self._queue and not window.full(self._queued_tokens, len(self._queue)) and not self._stopping:
            left = self._queue[0].arrived + window.waiting(self._queued_tokens) - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(min(left, threading.TIMEOUT_MAX))  # serve.max_wait_ms may be .inf: full batches only
        full = window.full(self._queued_tokens, len(self._queue))
        rows = [self._queue.popleft() for _ in range(window.take([len(row.ids) for row in self._queue]))]
        self._queued_tokens -= sum(len(row.ids) for row in rows)
        return rows, full

    def _run(self, rows: list[_Row], full: bool) -> None:
        lengths = np.array([len(row.ids) for row in rows], dtype=np.int64)
        self.runner.lay_out(self.strategy)
        window = self.window
        batches = cut_batches(lengths, window.tokens, self.strategy, window.rows, self.runner.device)
        with self._wake:
            window.running(time.monotonic(), int(lengths.sum()), len(batches))
        for k, batch in enumerate(batches):
            members = [rows[i] for i in batch.tolist() if not rows[i].request.cancelled]
            if members:
                self._run_batch(members, full, last=k == len(batches) - 1)

    def _run_batch(self, members: list[_Row], full: bool, last: bool = False) -> None:
        """`last`: the window's last batch, which ends it before its rows are delivered: a client that sends its
        next request once answered finds nothing running ahead of it (it found the window still running, and a
        lone client was shed under a target below a request's own latency)."""
        started = time.monotonic()
        outcome = run_resilient(self.runner.run, [row.ids for row in members])
        seconds, tokens = time.monotonic() - started, sum(len(row.ids) for row in members)
        with self._wake:
            if outcome.oom_tokens:
                self.window.oom(outcome.oom_tokens)
            self.window.ran(tokens, len(members), seconds, full)
            budget = (self.window.tokens, self.window.rows)
            if last:
                self.window.idle(time.monotonic())
        requests = len({id(r.request) for r in members})
        self.on_batch(
            BatchStats(len(members), requests, tokens, [started - r.arrived for r in members], seconds, budget)
        )
        for k, row in enumerate(members):
            self._deliver(row, outcome.results[k], outcome.failed.get(k))

    def _deliver(self, row: _Row, result, problem) -> None:
        request = row.request
        if problem:
            request.failed[row.position] = problem
        request.results[row.position] = result
        request.left -= 1
        request.answered = time.monotonic()
        if request.left == 0 and not request.cancelled:
            request.loop.call_soon_threadsafe(_resolve, request.future, (request.results, request.failed))


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _reject(future: asyncio.Future, exc: Exception) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"the batch failed: {type(exc).__name__}: {exc}"))
