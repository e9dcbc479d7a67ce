"""serve.p99_ms's controller (serve/latency.py), replayed on a recorded trace of MiniLM batch latencies: no clock,
no model, no threads; each decision checked against what the trace measured.

The trace: `python examples/bench/serve_latency.py --record tests/data/minilm_batch_latency.json` (MiniLM batches
of 1 to 64 tweets, [tokens, rows, seconds] each, on the 2-core AVX2 EPYC of this project, loaded by other work)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from batchinfer.serve.latency import (
    CALM,
    DECREASE,
    HEADROOM,
    STEER_EVERY,
    Admission,
    Cost,
    FirstToken,
    FixedWindow,
    LatencyTarget,
)

TRACE = json.loads((Path(__file__).parent / "data" / "minilm_batch_latency.json").read_text())["batches"]


def _seconds(tokens: float) -> float:
    """What a batch of `tokens` takes on the trace: its measurements by size, made non-decreasing (a larger batch
    never takes less; the loaded machine's noise says otherwise now and then), interpolated."""
    sizes = sorted({t for t, _, _ in TRACE})
    means = np.maximum.accumulate([np.mean([s for t, _, s in TRACE if t == size]) for size in sizes])
    return float(np.interp(tokens, sizes, means))


def _measured(control: LatencyTarget) -> LatencyTarget:
    """`control` with the trace's batches measured (the cost line only; the budget as it was)."""
    for tokens, _, seconds in TRACE:
        control.cost.add(tokens, seconds)
    return control


def _target(target=1.0, max_tokens=4096, max_rows=256, max_wait=0.005) -> LatencyTarget:
    return LatencyTarget(target, max_tokens, max_rows, max_wait)


def test_the_cost_line_fitted_on_the_trace_predicts_its_batches():
    cost = Cost()
    for tokens, _, seconds in TRACE:
        cost.add(tokens, seconds)
    fixed, per_token = cost.line()
    assert fixed > 0 and per_token > 0  # a part per batch and a part per token, both measured
    errors = [abs(cost.seconds(t) - s) / s for t, _, s in TRACE if t > 100]
    assert np.median(errors) < 0.25, errors
    assert cost.seconds(1000, batches=4) == pytest.approx(4 * fixed + 1000 * per_token)
    one_size = Cost()
    for seconds in (0.1, 0.3):  # one size only: no line, seconds per token
        one_size.add(50, seconds)
    assert one_size.line() == (0.0, pytest.approx(0.2 / 50))
    assert Cost().seconds(500) == 0.0  # nothing measured yet: nothing predicted, so nothing shed


def test_each_batch_of_the_trace_moves_the_budget_as_clipper_does():
    """Replayed in order, every batch full: one over half the allowed target lowers the budget to 90% of what it
    ran at most (less where the cost line says 90% takes too long), one within it raises it by one row and its
    tokens; a batch that was not full leaves it as it is."""
    control = _target(target=1.2)
    for tokens, rows, seconds in TRACE:
        before = (control.tokens, control.rows)
        control.ran(tokens, rows, seconds, full=True)
        if seconds > control.limit:
            fits = control.cost.within(control.limit)
            assert control.tokens == max(1, int(min(before[0], tokens * DECREASE, fits))) < tokens
            assert control.rows <= max(1, int(min(before[1], rows * DECREASE))) and control.rows < max(rows, 2)
        else:
            assert control.tokens == min(4096, before[0] + math.ceil(tokens / rows))
            assert control.rows == min(256, before[1] + 1)
    kept = (control.tokens, control.rows)
    control.ran(10, 1, 0.01, full=False)
    assert (control.tokens, control.rows) == kept


@pytest.mark.parametrize("target", [0.5, 1.0, 3.0])
def test_on_the_trace_the_budget_settles_where_a_batch_takes_half_the_allowed_target(target):
    """A closed loop: batches as large as the budget, each taking what the trace says a batch of that size
    takes. From the largest budget it falls, then stays where a batch takes the limit on average: past it by
    at most the step of one row, and not far below it (throughput is not given away)."""
    control = _target(target)
    ran = []
    for _ in range(300):
        tokens = control.tokens
        seconds = _seconds(tokens)
        control.ran(tokens, max(1, tokens // 20), seconds, full=True)
        ran.append(seconds / control.limit)
    settled = np.array(ran[100:])
    assert 0.75 < np.mean(settled) < 1.1 and max(settled) < 1.5, (np.mean(settled), max(settled))  # 1.34: one
    # row across the trace's step from 187 to 209 tokens (0.38 to 0.53 s)
    assert control.tokens < 4096


def test_a_request_is_shed_when_the_work_ahead_would_answer_it_past_the_target():
    control = _measured(_target(target=1.0))
    allowed = control.admission.allowed
    assert control.admit(0.0, 0, 0, 100_000, 5000).admit  # nothing ahead: admitted, however large
    fixed, per_token = control.cost.line()
    fits = int((allowed - fixed - control.wait) / per_token) - 30  # tokens ahead (its own too) that still fit
    assert control.admit(0.0, fits, 40, 30, 1).admit
    refused = control.admit(0.0, fits + 200, 40, 30, 1)
    assert not refused.admit and refused.predicted > allowed
    assert refused.predicted == pytest.approx(control.wait + control.cost.seconds(fits + 230))
    control.running(10.0, 2000, 1)  # a window of 2,000 tokens started at t=10 s: it is ahead of every request
    behind = control.admit(10.0, 0, 0, 30, 1)
    assert not behind.admit and behind.predicted == pytest.approx(
        control.cost.seconds(2000) + control.wait + control.cost.seconds(30)
    )
    assert behind.retry_after == max(1, math.ceil(behind.predicted - allowed))
    assert control.admit(10.0 + control.cost.seconds(2000), 0, 0, 30, 1).admit  # once it has run
    control.running(20.0, 2000, 1)
    control.idle(20.5)  # it ended sooner than predicted
    assert control.admit(20.5, 0, 0, 30, 1).admit


def test_requests_of_many_rows_count_the_batches_they_need():
    control = _measured(_target(target=1.0, max_rows=8))
    fixed, _ = control.cost.line()
    few, many = control.predict(0.0, 0, 0, 64, 8), control.predict(0.0, 0, 0, 64, 64)
    assert many - few == pytest.approx(7 * fixed)  # eight batches of eight rows, each with its fixed part


def test_the_headroom_falls_while_the_p99_is_past_the_target_and_rises_once_it_is_calm():
    admission = Admission(0.2)
    floor, start, step = HEADROOM
    assert admission.headroom == start
    latencies = [s for _, _, s in TRACE]  # 0.06 .. 3.3 s: a p99 far past 0.2 s
    for i in range(STEER_EVERY * 3):
        admission.answered(latencies[i % len(latencies)])
    assert admission.headroom == pytest.approx(start * DECREASE**3)
    for _ in range(STEER_EVERY * 40):
        admission.answered(max(latencies))
    assert admission.headroom == pytest.approx(floor)  # never below its floor
    calm = [s for s in latencies if s < CALM * 0.2] * 200
    for seconds in calm[: STEER_EVERY * 40]:  # the tail is all calm again after TAIL of them
        admission.answered(seconds)
    assert admission.headroom == 1.0 and admission.p99 < CALM * 0.2
    assert admission.decide(0.2).admit and not admission.decide(0.21).admit


def test_the_wait_is_what_the_target_leaves_after_two_batches_at_most_max_wait():
    control = _target(target=1.0, max_tokens=400, max_wait=0.05)
    assert control.wait == 0.05  # nothing measured: max_wait
    _measured(control)
    tight = _target(target=0.1, max_tokens=400, max_wait=0.05)
    tight.cost = control.cost
    assert tight.wait == 0.0  # two batches of 400 tokens take more than the target allows
    loose = _target(target=100.0, max_tokens=400, max_wait=0.05)
    loose.cost = control.cost
    assert loose.wait == 0.05


def test_a_window_takes_one_budget_first_come_first_served_and_the_fixed_window_all():
    control = _target(max_tokens=100, max_rows=3)
    assert control.take([40, 40, 40, 5]) == 2  # a third would pass 100 tokens
    assert control.take([10, 10, 10, 10]) == 3  # rows
    assert control.take([500, 10]) == 1  # a row larger than the budget runs alone
    assert control.full(100, 1) and control.full(5, 3) and not control.full(99, 2)
    fixed = FixedWindow(100, 3, 0.005)
    assert fixed.take([40, 40, 40, 5]) == 4 and not fixed.full(99, 50) and fixed.admit(0.0, 10**6, 10**4, 1, 1).admit


def test_out_of_memory_holds_the_budget_below_half_of_what_ran_out():
    control, fixed = _target(max_tokens=4096), FixedWindow(4096, 256, 0.005)
    control.oom(1000)
    fixed.oom(1000)
    assert control.tokens == fixed.tokens == 500
    control.ran(400, 20, 0.0, full=True)  # a fast full batch may grow it again, never past that half
    for _ in range(100):
        control.ran(control.tokens, 20, 0.0, full=True)
    assert control.tokens == 500


def test_generation_is_shed_when_its_first_token_is_predicted_past_the_target():
    """FirstToken: a line through (tokens held when a request was added, its time to first token)."""
    first = FirstToken(0.5)
    for held, seconds in ((200, 0.05), (1000, 0.12), (3000, 0.3), (6000, 0.55)):
        first.answered(held, seconds)
    assert first.admit(0, 10**6).admit  # nothing held ahead: admitted
    assert first.admit(1500, 500).admit  # about 0.2 s
    late = first.admit(6000, 500)
    assert not late.admit and late.predicted == pytest.approx(first.cost.seconds(6500)) and late.retry_after == 1
