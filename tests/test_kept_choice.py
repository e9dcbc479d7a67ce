"""A backend choice kept beside an OpenVINO conversion (backends/openvino.py known_faster): used only when it was
measured under a load comparable to this run's and less than 7 days ago, and the report says under what load;
else both backends are timed again, with the reason. Stand-in loads and rates: nothing is timed here."""

import json
import time

import pytest

from batchinfer.backends import openvino
from batchinfer.machine import Load

QUIET = Load(1.0, 0.0, 0.0, 2, 0.3)
BUSY = Load(1.0, 1.5, 0.0, 2, 3.2)  # other processes took 1.5 of the 2 cores: everything ran 4x slower


@pytest.fixture
def kept(tmp_path):
    """Keeps rates for a conversion of its own, measured under a load: the conversion's description."""
    of = {"model": f"stand-in {tmp_path.name}"}
    entry = openvino.entry_of(of)
    entry.mkdir(parents=True)

    def keep(load: Load | None, rates=None):
        openvino.remember(entry, rates or {"openvino": 5550.0, "torch": 1157.0}, load.as_dict() if load else None)
        return of

    return keep


def test_a_choice_measured_under_a_comparable_load_is_used_and_says_under_what_load(kept):
    winner, note = openvino.known_faster(kept(QUIET), Load(1.0, 0.1, 0.0, 2, 0.5))
    assert winner == ("openvino", pytest.approx(5550 / 1157))
    assert note == "measured 0 hours ago, while the machine was quiet (load average 0.3)"


def test_a_choice_measured_on_a_busy_machine_is_timed_again_on_a_quiet_one(kept):
    winner, note = openvino.known_faster(kept(BUSY), QUIET)
    assert winner is None
    assert note == (
        "both backends timed again: the kept choice (OpenVINO at 4.8x the other's speed) was measured while other "
        "processes used 1.5 of 2 cores (load average 3.2); now the machine was quiet (load average 0.3)"
    )


def test_a_choice_over_7_days_old_or_with_no_load_kept_is_timed_again(kept, monkeypatch):
    of = kept(QUIET)
    later = time.time() + 8 * 86400
    monkeypatch.setattr(openvino.time, "time", lambda: later)
    assert openvino.known_faster(of, QUIET)[1].endswith("was measured 8 days ago, over 7 days")
    monkeypatch.undo()
    entry = openvino.entry_of(of)
    (entry / openvino.RATES).write_text(json.dumps({openvino.cpu_id(): {"openvino": 5550.0, "torch": 1157.0}}))
    winner, note = openvino.known_faster(of, QUIET)  # a record from before loads were kept
    assert winner is None and "has no record of when or under what load" in note


def test_close_rates_keep_no_choice(kept):
    assert openvino.known_faster(kept(QUIET, {"openvino": 1000.0, "torch": 1050.0}), QUIET) == (None, None)


def test_comparable_loads_are_those_whose_slowdowns_are_within_one_and_a_half_times():
    assert QUIET.comparable(Load(1.0, 0.5, 0.0, 2, 1.0))  # 1.33x slower
    assert not QUIET.comparable(Load(1.0, 0.8, 0.0, 2, 1.0))  # 1.67x
    assert not BUSY.comparable(QUIET) and BUSY.comparable(Load(1.0, 1.4, 0.1, 2, 3.0))
