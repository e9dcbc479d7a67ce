"""The online batcher (serve): requests close together share batches, each gets its rows back in order,
the queue is bounded in tokens, one failed batch fails only its own requests. A stand-in runner, no model."""

import asyncio
import re
import threading
import time

import pytest
import torch

from batchinfer.serve.batcher import Batcher, Overloaded, Shed, TooLarge

FOREVER = 60.0  # a max_wait no test reaches: the window closes on the token budget or on stop()


class Runner:
    """Answers each row with its token ids' sum; remembers every batch it ran; fails on a poison id."""

    device = torch.device("cpu")

    def __init__(self, poison: int | None = None):
        self.batches: list[list[list[int]]] = []
        self.poison = poison

    def lay_out(self, strategy: str) -> None:
        pass  # rows are summed whether padded or packed

    def run(self, ids):
        if self.poison is not None and any(self.poison in row for row in ids):
            raise ValueError("a row the model cannot take")
        self.batches.append([list(row) for row in ids])
        return [sum(row) for row in ids]


def _batcher(runner, max_tokens=1000, max_wait=FOREVER, max_queue_tokens=1000, **extra) -> Batcher:
    return Batcher(runner, max_tokens, "padded", 64, max_wait, max_queue_tokens, **extra)


async def _stop(batcher: Batcher) -> None:
    """stop() from the model's side of the loop: what it runs then is delivered to a loop still open."""
    await asyncio.get_running_loop().run_in_executor(None, batcher.stop)


def _rows(*lengths: int, start: int = 1) -> list[list[int]]:
    """Rows of the given token counts, each of distinct ids."""
    rows, next_id = [], start
    for n in lengths:
        rows.append(list(range(next_id, next_id + n)))
        next_id += n
    return rows


def test_requests_close_together_share_a_batch_and_get_their_own_rows_back_in_order():
    runner, stats = Runner(), []
    a, b = _rows(5, 1, 3), _rows(2, 4, start=100)
    batcher = _batcher(runner, max_tokens=15, on_batch=stats.append)  # the two together reach the budget

    async def go():
        loop = asyncio.get_running_loop()
        first = batcher.submit(a, loop)
        await asyncio.sleep(0.05)
        assert not first.future.done()  # 9 tokens, a budget of 15 and a long max_wait: it waits for company
        second = batcher.submit(b, loop)
        return await asyncio.wait_for(asyncio.gather(first.future, second.future), 10)

    (got_a, failed_a), (got_b, failed_b) = asyncio.run(go())
    batcher.stop()
    assert got_a == [sum(r) for r in a] and got_b == [sum(r) for r in b] and failed_a == failed_b == {}
    assert sorted(map(tuple, sum(runner.batches, []))) == sorted(map(tuple, a + b))
    assert max(s.requests for s in stats) == 2  # shared, not one by one
    assert sum(s.rows for s in stats) == 5 and sum(s.tokens for s in stats) == 15
    for batch in runner.batches:  # sorted by length before cutting, as offline
        assert [len(r) for r in batch] == sorted((len(r) for r in batch), reverse=True)


def test_a_lone_request_waits_max_wait_then_runs():
    runner, stats = Runner(), []
    batcher = _batcher(runner, max_wait=0.2, on_batch=stats.append)

    async def go():
        started = time.monotonic()
        request = batcher.submit(_rows(2, 3), asyncio.get_running_loop())
        result = await asyncio.wait_for(request.future, 10)
        return result, time.monotonic() - started

    (results, _), waited = asyncio.run(go())
    batcher.stop()
    assert results == [3, 12] and waited >= 0.2
    assert len(stats) == 1 and min(stats[0].waited) >= 0.2


def test_the_queue_is_bounded_in_tokens_and_a_reservation_counts():
    batcher = _batcher(Runner(), max_queue_tokens=10)

    async def go():
        loop = asyncio.get_running_loop()
        queued = batcher.submit(_rows(6), loop)
        with pytest.raises(
            Overloaded, match="6 tokens are queued or running, the limit is serve.max_queue_tokens \\(10\\)"
        ):
            batcher.submit(_rows(5), loop)
        last = batcher.submit(_rows(4), loop)  # fits: 10 of 10
        assert batcher.queued_tokens == 10
        await _stop(batcher)
        return await asyncio.wait_for(asyncio.gather(queued.future, last.future), 1)

    assert [results for results, _ in asyncio.run(go())] == [[21], [10]]

    alone = _batcher(Runner(), max_queue_tokens=10)

    async def reserve():
        loop = asyncio.get_running_loop()
        with alone.reserved(8):  # a request being tokenized holds its estimate
            with pytest.raises(Overloaded):
                alone.submit(_rows(3), loop)
            own = alone.submit(_rows(7), loop, reserved=8)  # its own reservation is not counted twice
        assert alone.queued_tokens == 7
        with pytest.raises(Overloaded):
            alone.submit(_rows(5), loop)
        await _stop(alone)
        return await asyncio.wait_for(own.future, 1)

    assert asyncio.run(reserve()) == ([sum(range(1, 8))], {})


def test_a_request_larger_than_the_bound_is_refused_even_when_the_queue_is_empty():
    runner = Runner()
    batcher = _batcher(runner, max_tokens=20, max_queue_tokens=30)

    async def go():
        loop = asyncio.get_running_loop()
        with pytest.raises(TooLarge, match=r"the request is 36 tokens, more than the queue holds \(serve.max_queue_"):
            batcher.submit(_rows(12, 12, 12), loop)  # was taken alone, and held the queue while it ran
        with pytest.raises(TooLarge, match="the request is at least 31 tokens"):
            with batcher.reserved(500, least=31):  # 31 texts: refused before they are tokenized
                pass
        with batcher.reserved(500):  # an estimate past the bound holds the bound; the real count decides
            with pytest.raises(Overloaded, match="30 tokens are queued or running"):
                batcher.submit(_rows(1), loop)
            request = batcher.submit(_rows(12, 12), loop, reserved=500)  # fits, and spans two batches
        return await asyncio.wait_for(request.future, 10)

    results, failed = asyncio.run(go())
    batcher.stop()
    assert results == [sum(r) for r in _rows(12, 12)] and failed == {} and len(runner.batches) == 2


def test_a_poison_row_fails_alone_and_the_others_get_their_results():
    batcher = _batcher(Runner(poison=2), max_tokens=9)

    async def go():
        request = batcher.submit([[1, 1, 1], [2, 2, 2], [3, 3, 3]], asyncio.get_running_loop())
        return await asyncio.wait_for(request.future, 10)

    results, failed = asyncio.run(go())
    batcher.stop()
    assert results == [3, None, 9]
    assert list(failed) == [1] and failed[1][0] == "model_error" and "a row the model cannot take" in failed[1][1]


def test_a_failed_batch_rejects_its_requests_and_the_batcher_goes_on():
    calls = []

    def broken_metrics(stats):
        calls.append(stats)
        if len(calls) == 1:
            raise KeyError("metrics")

    batcher = _batcher(Runner(), max_wait=0.01, on_batch=broken_metrics)

    async def go():
        loop = asyncio.get_running_loop()
        first = batcher.submit(_rows(2), loop)
        with pytest.raises(RuntimeError, match="the batch failed: KeyError"):
            await asyncio.wait_for(first.future, 10)
        second = batcher.submit(_rows(3), loop)
        return await asyncio.wait_for(second.future, 10)

    results, _ = asyncio.run(go())
    assert results == [6] and batcher.alive
    batcher.stop()


def test_cancelled_rows_never_reach_the_model_and_an_empty_request_resolves_at_once():
    runner = Runner()
    batcher = _batcher(runner)

    async def go():
        loop = asyncio.get_running_loop()
        gone = batcher.submit(_rows(4), loop)
        batcher.cancel(gone)  # the caller went away before the window closed: its rows leave the queue
        assert batcher.queued_tokens == 0
        empty = batcher.submit([], loop)
        return await asyncio.wait_for(empty.future, 1)

    assert asyncio.run(go()) == ([], {})
    batcher.stop()
    assert runner.batches == []


def test_a_request_cancelled_while_its_rows_wait_for_company_leaves_the_batcher_serving():
    """The client went away while its rows, alone in the queue, waited for company: the window woke to an empty
    queue, and the batching thread died (IndexError), every later request accepted and never answered."""
    runner = Runner()
    batcher = _batcher(runner, max_wait=0.3)

    async def go():
        loop = asyncio.get_running_loop()
        gone = batcher.submit(_rows(3), loop)
        await asyncio.sleep(0.05)  # the window waits for company
        batcher.cancel(gone)
        await asyncio.sleep(0.4)  # past the wait
        return await asyncio.wait_for(batcher.submit(_rows(2, start=10), loop).future, 5)

    assert asyncio.run(go()) == ([21], {})
    assert batcher.alive and runner.batches == [_rows(2, start=10)]
    batcher.stop()


def test_stop_runs_what_is_queued_then_refuses():
    runner = Runner()
    batcher = _batcher(runner)  # FOREVER: only stop() closes the window

    async def go():
        loop = asyncio.get_running_loop()
        request = batcher.submit(_rows(3), loop)
        await _stop(batcher)
        result = await asyncio.wait_for(request.future, 1)
        with pytest.raises(Overloaded, match="shutting down"):
            batcher.submit(_rows(1), loop)
        return result

    assert asyncio.run(go()) == ([6], {})
    assert not batcher.alive and runner.batches == [_rows(3)]


def test_a_request_cancelled_while_its_window_runs_stops_at_the_next_batch():
    started, release = threading.Event(), threading.Event()

    class Held(Runner):
        def run(self, ids):
            started.set()
            release.wait(10)
            return super().run(ids)

    runner = Held()
    batcher = _batcher(runner, max_tokens=4, max_wait=0)  # a batch of one 4-token row

    async def go():
        loop = asyncio.get_running_loop()
        gone = batcher.submit(_rows(4, 4, 4, 4), loop)  # four batches
        stays = batcher.submit(_rows(4, start=100), loop)
        await loop.run_in_executor(None, started.wait, 10)
        batcher.cancel(gone)  # its client went away while its first batch ran
        release.set()
        return await asyncio.wait_for(stays.future, 10), gone.future.done()

    (results, _), resolved = asyncio.run(go())
    batcher.stop()
    assert results == [sum(range(100, 104))] and not resolved
    assert len(runner.batches) == 2  # the batch under way, then the other request's row; not the three left


class Held(Runner):
    """A Runner whose batches wait for `go`, set by the test: what comes meanwhile stays queued behind them."""

    def __init__(self):
        super().__init__()
        self.started, self.go = threading.Event(), threading.Event()

    def run(self, ids):
        self.started.set()
        self.go.wait(30)
        return super().run(ids)


def test_with_a_latency_target_a_request_predicted_past_it_is_shed_at_once_and_windows_take_the_queue():
    """serve.p99_ms: a request is refused (Shed, with Retry-After) when the running batch and the rows queued
    ahead of it would answer it past the target, by the measured cost; the others queue and are answered, all in
    the next window, cut into batches of the budget. Latencies measured, not timed: a second a token."""
    runner = Held()
    batcher = _batcher(runner, max_tokens=30, max_wait=0, target=85.0)  # allowed: 85 s (nothing missed yet)
    batcher.window.cost.add(10, 10.0)

    async def go():
        loop = asyncio.get_running_loop()
        first = batcher.submit(_rows(10), loop)
        assert await asyncio.to_thread(runner.started.wait, 10)  # running: about 10 s left
        queued = [batcher.submit(_rows(10, start=100 * i), loop) for i in range(1, 8)]  # each 10 s more: 80 s
        with pytest.raises(Shed) as shed:
            batcher.submit(_rows(10, start=900), loop)  # 90 s
        assert batcher.queued_tokens == 70
        runner.go.set()
        return shed.value, await asyncio.wait_for(asyncio.gather(first.future, *(q.future for q in queued)), 10)

    shed, answers = asyncio.run(go())
    batcher.stop()
    # 90 s, less the moments the test took since the first batch started (under a second: Retry-After 5)
    said = r"would be answered in about (89,\d{3}|90,000) ms, past what serve.p99_ms allows \(85,000 ms\)"
    assert shed.retry_after == 5 and re.search(said, str(shed))
    assert [results for results, _ in answers] == [[sum(range(1, 11))]] + [
        [sum(range(100 * i, 100 * i + 10))] for i in range(1, 8)
    ]
    # the seven queued in one window, cut by the offline planner into batches of the budget (30 tokens at most)
    batches = [[row[0] for row in batch] for batch in runner.batches]
    assert batches[0] == [1] and sorted(sum(batches[1:], [])) == [100 * i for i in range(1, 8)]
    assert all(len(batch) <= 3 for batch in batches)


class Small(Runner):
    """Runs out of memory on a batch of more than 20 padded tokens; remembers the size of every attempt."""

    def __init__(self):
        super().__init__()
        self.tried: list[int] = []

    def run(self, ids):
        self.tried.append(len(ids) * max(map(len, ids)))
        if self.tried[-1] > 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().run(ids)


@pytest.mark.parametrize("target", [None, 100.0])
def test_a_batch_that_runs_out_of_memory_lowers_the_budget_for_the_next_windows(target):
    """As offline: split and retried, then never again more than half of what ran out (the batcher used to
    try every window at the full budget again), with a latency target or without."""
    runner = Small()
    batcher = _batcher(runner, max_tokens=100, max_wait=0, target=target)

    async def go():
        loop = asyncio.get_running_loop()
        first = await asyncio.wait_for(batcher.submit(_rows(10, 10, 10, 10), loop).future, 10)
        second = await asyncio.wait_for(batcher.submit(_rows(10, 10, 10, 10, start=100), loop).future, 10)
        return first, second

    first, second = asyncio.run(go())
    batcher.stop()
    assert first[1] == second[1] == {} and runner.tried == [40, 20, 20, 20, 20]
    assert batcher.window.tokens == 20
