"""The stop flag: where a run only reads, a signal stops the main thread at once, whatever the code it
lands in does with the exception."""

import os
import signal
import threading
import time

import pytest

from batchinfer.control import Interrupted, StopFlag


@pytest.fixture
def stop():
    flag = StopFlag()
    previous = signal.signal(signal.SIGINT, lambda signum, _: flag.set(signum))
    yield flag
    signal.signal(signal.SIGINT, previous)


def _soon():
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()


def _swallowing():
    try:
        time.sleep(5)
    except Exception:  # noqa: BLE001 - as a library trying something else would
        return "went on"


def _converting():
    try:
        time.sleep(5)
    except Exception as exc:
        raise OSError("could not read") from exc  # as pyarrow does for a Python file object's error


@pytest.mark.parametrize("inside", [time.sleep, lambda _: _swallowing(), lambda _: _converting()])
def test_a_signal_inside_at_once_is_interrupted_at_once(stop, inside):
    _soon()
    started = time.perf_counter()
    with pytest.raises(Interrupted) as info:
        with stop.at_once():
            inside(5)
    assert info.value.signum == signal.SIGINT and time.perf_counter() - started < 1


def test_outside_at_once_a_signal_only_sets_the_flag(stop):
    _soon()
    time.sleep(0.3)  # the handler ran: nothing was raised
    with pytest.raises(Interrupted):
        stop.check()
