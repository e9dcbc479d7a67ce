"""serve.p99_ms: batches sized, and requests admitted, so that the 99th percentile latency of admitted requests
stays under a target (Clipper, NSDI 2017: the batch grows additively while its measured latency is within bounds
and shrinks multiplicatively when it is not; what cannot meet the target is shed instead of queued).

Three measured things drive every decision:
- Cost: what a batch of n tokens takes, a line through the last batches' (tokens, seconds): a part per batch
  and a part per token.
- BatchSize: the batch budget (tokens and rows), grown after a full batch that ran within what the target
  allows a request alone (a row more, or at once what the Cost line says fits), 10% less than what ran after
  one that did not.
- Admission: a window takes every queued row, so a new request is answered with them all, and makes them all
  later: the predicted latency of the queue's oldest request (what it waited, what runs now, the next window
  with the new request, by the Cost line) against the target, less a margin; past it, a 429 with the seconds
  until it would fit as Retry-After. The margin is what the predictions missed by: the MISSED percentile of
  (answered - predicted) over the last admitted requests, so that what the line misses (noise, the HTTP layer, a
  slow batch) is learnt from every answer, not only from the late ones.

Pure: time and measurements come in as arguments; no clock, thread or lock here (the batcher and the generate
service call it under their own). FixedWindow is the batcher's policy without a target: today's window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

FITTED_ON = 64  # the last batches (or requests) the cost line is fitted on
TAIL = 400  # the last admitted requests whose latencies (the p99) and misses (the margin) are kept
# the percentile of the predictions' misses that the margin holds (see Admission). Past saturation nearly every
# admitted request is admitted at the edge, where the share late is the share of misses past the margin: a p99
# needs it under 1 in 100, and a percentile of a few hundred misses runs short of their tail. Misses of
# N(5 ms, 10 ms) at the edge: 2.5 in 100 late at the 98th percentile of 200, 1.5 at the 99th, 0.8 at the 99.5th
# of 400 (at the 98th of 200, past saturation, the p99 was 507 and 531 ms in 2 of 3 runs for a 500 ms target,
# MiniLM at 163 a second, 2-core AVX2 EPYC; at the 99.5th of 400, 379 to 428 ms).
MISSED = 99.5
DECREASE = 0.9  # multiplicative decrease of a batch budget
HALF = 0.5  # ... and at most this much at once, whatever the cost line says fits (see BatchSize)
FLOOR = 0.5  # the least share of the target a request is allowed, whatever the margin


@dataclass(frozen=True)
class Decision:
    """Whether a request is admitted; the predicted latency it was judged by (the queue's oldest request's) and
    what was allowed (seconds); when it is not, the whole seconds after which it would fit (Retry-After).
    expected: the request's own predicted latency, which its answer is compared with (Admission.answered);
    measured: whether anything was measured to predict from (not: refused behind work of unknown length)."""

    admit: bool
    predicted: float
    allowed: float
    expected: float = 0.0
    measured: bool = True

    @property
    def retry_after(self) -> int:
        return max(1, math.ceil(self.predicted - self.allowed))


class Cost:
    """Seconds a batch of `tokens` takes, from the last FITTED_ON measurements: fixed + per_token x tokens, a
    least-squares line (seconds per token alone where the batches were all of one size or the line is not
    rising)."""

    def __init__(self):
        self.points: deque[tuple[int, float]] = deque(maxlen=FITTED_ON)
        self._line: tuple[float, float] | None = None

    def add(self, tokens: int, seconds: float) -> None:
        self.points.append((max(1, tokens), seconds))
        self._line = None

    @property
    def known(self) -> bool:
        return bool(self.points)

    def line(self) -> tuple[float, float]:
        """(seconds per batch, seconds per token)."""
        if self._line is None:
            tokens, seconds = (np.array(column, dtype=np.float64) for column in zip(*self.points))
            self._line = (0.0, float(seconds.sum() / tokens.sum()))
            if np.ptp(tokens) > 0:
                slope, fixed = np.polyfit(tokens, seconds, 1)
                if slope > 0 and fixed >= 0:
                    self._line = (float(fixed), float(slope))
        return self._line

    def seconds(self, tokens: int, batches: int = 1) -> float:
        if not self.points:
            return 0.0
        fixed, per_token = self.line()
        return fixed * batches + per_token * tokens

    def within(self, seconds: float) -> float:
        """The tokens one batch may hold to take at most `seconds` (infinite while nothing is measured)."""
        fixed, per_token = self.line() if self.points else (0.0, 0.0)
        return max(0.0, seconds - fixed) / per_token if per_token > 0 else math.inf


class BatchSize:
    """Clipper's AIMD on the batch budget: after a full batch (it met the budget) that ran within `limit`
    seconds, one row more and its tokens; after one that took longer, 10% less than what it ran, or less still
    where the cost line says that would take longer too (`fits`: the tokens it says fit; rows in proportion)."""

    def __init__(self, max_tokens: int, max_rows: int):
        self.max_tokens, self.max_rows = max_tokens, max_rows
        self.tokens, self.rows = max_tokens, max_rows

    def ran(self, tokens: int, rows: int, seconds: float, full: bool, limit: float, fits: float = math.inf) -> None:
        if seconds > limit:
            # the line's cut at once, but never below half of what ran: under a burst, the time outside the model
            # (the event loop's, the GIL's) inflated the line's fixed part past the limit, cut the budget to one
            # row at once, and batches of a row each served a fraction of the load (MiniLM, 100 at once)
            self.tokens = max(1, int(min(self.tokens, max(min(tokens * DECREASE, fits), tokens * HALF))))
            self.rows = max(1, int(min(self.rows, rows * DECREASE, rows * self.tokens / max(tokens, 1))))
        elif full:  # a row more, or at once what the cost line says fits (a batch's fixed part is paid once)
            per_row = tokens / max(rows, 1)
            self.tokens = min(self.max_tokens, max(self.tokens + math.ceil(per_row), int(min(fits, 1 << 40))))
            self.rows = min(self.max_rows, max(self.rows + 1, int(self.tokens / per_row)))

    def oom(self, tokens: int) -> None:
        """A batch of `tokens` (padded) ran out of memory: never again more than half of it."""
        self.max_tokens = max(1, min(self.max_tokens, tokens // 2))
        self.tokens = min(self.tokens, self.max_tokens)


class Admission:
    """A target (seconds) for the p99 of admitted requests, held by shedding: a request is admitted when its
    predicted latency is within the target less a margin, the MISSED percentile of what the last TAIL admitted
    requests' answers came past their predictions (negative where the predictions run long: up to twice the
    target is then allowed), at least FLOOR of the target left. A request at the edge is then late only where
    its prediction misses by more than 199 in 200 did, and one far inside the target never. Each answer moves
    the margin, so one slow batch raises it for the next few hundred answers and no longer. Before, a headroom
    that each late answer cut by a step and a hundred and ninety-nine in time gave back was cut by a third at
    once by a burst of late answers (one slow batch makes every request queued behind it late) and took
    thousands of answers to recover: 18% shed at 77 a second with the p99 still over the target (MiniLM,
    2-core AVX2 EPYC)."""

    def __init__(self, target: float):
        self.target = target
        self.latencies: deque[float] = deque(maxlen=TAIL)
        self.misses: deque[float] = deque(maxlen=TAIL)
        self.margin = 0.0

    @property
    def allowed(self) -> float:
        return min(2 * self.target, max(FLOOR * self.target, self.target - self.margin))

    def decide(self, predicted: float, expected: float = 0.0) -> Decision:
        return Decision(predicted <= self.allowed, predicted, self.allowed, expected)

    def answered(self, seconds: float, expected: float) -> None:
        """An admitted request's latency, and what was predicted for it when it was admitted."""
        self.latencies.append(seconds)
        self.misses.append(seconds - expected)
        self.margin = float(np.percentile(self.misses, MISSED))

    @property
    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else 0.0


class FixedWindow:
    """The batcher without a target: a window closes when the queued tokens reach batching.max_tokens or the
    oldest row has waited serve.max_wait_ms, takes the whole queue, and admits whatever fits in the queue."""

    def __init__(self, max_tokens: int, max_rows: int, max_wait: float):
        self.tokens, self.rows, self.wait = max_tokens, max_rows, max_wait

    def full(self, tokens: int, rows: int) -> bool:
        return tokens >= self.tokens

    def waiting(self, tokens: int) -> float:
        return self.wait

    def take(self, lengths: list[int]) -> int:
        return len(lengths)

    def admit(self, now: float, queued_tokens: int, queued_rows: int, tokens: int, rows: int, *ages: float) -> Decision:
        return Decision(True, 0.0, math.inf)

    def running(self, now: float, tokens: int, batches: int) -> None:
        pass

    def idle(self, now: float) -> None:
        pass

    def ran(self, tokens: int, rows: int, seconds: float, full: bool) -> None:
        pass

    def answered(self, seconds: float, inside: float, expected: float, before: float = 0.0) -> None:
        pass

    def oom(self, tokens: int) -> None:
        self.tokens = max(1, min(self.tokens, tokens // 2))


class LatencyTarget:
    """The batcher with serve.p99_ms: a window closes when the queue holds a batch budget (BatchSize's tokens or
    rows) or the oldest row has waited what the target leaves after two batches (at most serve.max_wait_ms),
    and takes every queued row, cut into batches of the budget; a request is admitted when the queue's oldest
    request, with it and every row queued, is predicted to be answered within the target."""

    def __init__(self, target: float, max_tokens: int, max_rows: int, max_wait: float):
        self.size, self.admission, self.cost = BatchSize(max_tokens, max_rows), Admission(target), Cost()
        self.max_wait = max_wait
        self.busy_until = 0.0  # when the window running now is predicted to end
        self.busy = False  # a window runs now (it may run past busy_until: the prediction is not the end)
        self.outside = 0.0  # a request's seconds outside the queue (reading, tokenizing, answering), averaged
        self.after = 0.0  # ... of them after its last row's result (answering), averaged

    @property
    def tokens(self) -> int:
        return self.size.tokens

    @property
    def rows(self) -> int:
        return self.size.rows

    @property
    def limit(self) -> float:
        """The longest a batch may take: what the target allows a request alone, less its time outside the queue
        (a longer batch misses the target whatever runs beside it; a shorter one is admission's to fit), and at
        least half of what it allows: time outside that grows under load is admission's to answer with sheds,
        not the batches' (at a limit near nothing they shrank to a row each, and the load they could serve with
        them)."""
        return max(HALF * self.admission.allowed, self.admission.allowed - self.outside)

    def waiting(self, tokens: int) -> float:
        """How long the oldest row waits for company with `tokens` queued: what the target leaves after two
        batches of them and the time outside the queue, at most serve.max_wait_ms. Sized on what is queued:
        sized on a whole budget (which the target alone fills) it left no wait at all, windows of one row, and
        each one's fixed part paid per row, below the fixed window's throughput at loads both could serve."""
        spare = self.admission.allowed - 2 * self.cost.seconds(max(1, tokens)) - self.outside
        return min(self.max_wait, max(0.0, spare))

    def full(self, tokens: int, rows: int) -> bool:
        return tokens >= self.tokens or rows >= self.rows

    def take(self, lengths: list[int]) -> int:
        """How many of the queued rows the next window takes: all of them, as the fixed window (admission has
        bounded them to what can be answered within the target), cut into batches of the budget."""
        return len(lengths)

    def predict(self, now: float, queued_tokens: int, queued_rows: int, tokens: int, rows: int, waited: float) -> float:
        """The seconds still to come, with a request of `tokens` in `rows` queued behind what is queued now, to
        the answer of each request queued: they all run in the next window, once the running window ends (or
        the oldest queued row, queued `waited` seconds ago, has waited for company); then the time from a
        request's last row to its answer."""
        ahead_tokens, ahead_rows = queued_tokens + tokens, queued_rows + rows
        batches = max(math.ceil(ahead_tokens / self.tokens), math.ceil(ahead_rows / self.rows), 1)
        # the next window starts when the running one ends and the oldest row has waited for company, whichever
        # is later: counting only the first ran 4.5 ms (median) short behind a running window (MiniLM, 77 a second)
        running = self.busy_until - now if self.busy else 0.0
        starts = max(0.0, running, self.waiting(ahead_tokens) - waited)
        return starts + self.cost.seconds(ahead_tokens, batches) + self.after

    def admit(
        self,
        now: float,
        queued_tokens: int,
        queued_rows: int,
        tokens: int,
        rows: int,
        waited: float = 0.0,
        oldest: float = 0.0,
        since: float = 0.0,
    ) -> Decision:
        """Admit a request unless it, or a request queued before it, is predicted past the target; with nothing
        ahead of it, always (no one could answer it sooner: a request larger than the target allows is still
        served). `waited`: the seconds the oldest queued row has been queued; `oldest`: the seconds since its
        request arrived (at least `waited`); `since`: since this request arrived. Each is predicted as the
        seconds it has had plus what predict() says is still to come. Counting what a request spent before it
        was queued (its body read, a busy event loop, its tokenizing) is what holds a burst: 100 requests at
        once each found the queue short when its turn to be queued came, all were admitted, and the last had
        waited up to a second for the event loop (MiniLM, 2-core AVX2 EPYC)."""
        ahead = self.predict(now, queued_tokens, queued_rows, tokens, rows, waited)
        predicted = max(waited, oldest, since) + ahead
        if not queued_rows and not self.busy:
            return Decision(True, predicted, self.admission.allowed, since + ahead)
        return self.admission.decide(predicted, since + ahead)

    def running(self, now: float, tokens: int, batches: int) -> None:
        """A window of `tokens` in `batches` starts at `now`."""
        self.busy_until, self.busy = now + self.cost.seconds(tokens, batches), True

    def idle(self, now: float) -> None:
        """The window has ended (sooner or later than predicted)."""
        self.busy_until, self.busy = now, False

    def ran(self, tokens: int, rows: int, seconds: float, full: bool) -> None:
        """A batch ran: `full` when it met the budget (the queue held more), the only kind that may grow it."""
        self.cost.add(tokens, seconds)
        self.size.ran(tokens, rows, seconds, full, self.limit, self.cost.within(self.limit))

    def answered(self, seconds: float, inside: float, expected: float, before: float = 0.0) -> None:
        """A request was answered in `seconds`: `before` of them until it was queued, `inside` from then to its
        last row's result; `expected`: its Decision's."""
        spent, after = max(0.0, seconds - inside), max(0.0, seconds - inside - before)
        first = not self.admission.latencies
        self.outside = spent if first else 0.9 * self.outside + 0.1 * spent
        self.after = after if first else 0.9 * self.after + 0.1 * after
        self.admission.answered(seconds, expected)

    def oom(self, tokens: int) -> None:
        self.size.oom(tokens)


class FirstToken:
    """serve.p99_ms for generation, on the time to first token: a request joins the engine's running batch, so
    its first token waits for the work held ahead of it (TokenQueue: prompts and the most they may generate).
    Predicted by a Cost line through the last requests' (tokens held when added, time to first token); a
    request is admitted when within the target, always when nothing is held ahead of it, never behind others
    before a first token is measured (a line through nothing predicted no wait: a burst at start was admitted
    whole)."""

    def __init__(self, target: float):
        self.cost, self.admission = Cost(), Admission(target)

    def admit(self, held: int, tokens: int) -> Decision:
        predicted = self.cost.seconds(held + tokens)
        if not held:
            return Decision(True, predicted, self.admission.allowed, predicted)
        if not self.cost.known:
            return Decision(False, predicted, self.admission.allowed, predicted, measured=False)
        return self.admission.decide(predicted, predicted)

    def answered(self, held: int, seconds: float) -> None:
        """A request added when `held` tokens (its own too) were held had its first token `seconds` after it came:
        against what the line predicted before it is added to it."""
        self.admission.answered(seconds, self.cost.seconds(held))
        self.cost.add(held, seconds)
