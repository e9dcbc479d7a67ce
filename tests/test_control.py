"""The stop flag: where a run only reads, a signal stops the main thread at once, whatever the code it
lands in does with the exception.

Each case runs in a fresh interpreter: a SIGINT sent to this test process could land in a native thread
that an earlier test left behind (OpenVINO's, xgrammar's), which is nothing a run's own process has."""

import signal
import subprocess
import sys
import textwrap
import threading
from dataclasses import FrozenInstanceError, replace

import pytest

from batchinfer.batching.budget import Batching
from batchinfer.control import Interrupted, StopFlag

SCENARIO = textwrap.dedent(
    """
    import os, signal, threading, time
    from batchinfer.control import Interrupted, StopFlag

    flag = StopFlag()
    signal.signal(signal.SIGINT, lambda signum, _: flag.set(signum))

    def swallowing(_):
        try:
            time.sleep(5)
        except Exception:  # as a library trying something else would
            return "went on"

    def converting(_):
        try:
            time.sleep(5)
        except Exception as exc:
            raise OSError("could not read") from exc  # as pyarrow does for a Python file object's error

    inside = {"sleep": time.sleep, "swallowing": swallowing, "converting": converting, "outside": None}[CASE]
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.perf_counter()
    if inside is None:
        time.sleep(0.3)  # the handler ran: nothing was raised
        try:
            flag.check()
        except Interrupted:
            print("flag set")
    else:
        try:
            with flag.at_once():
                inside(5)
        except Interrupted as exc:
            print("interrupted", exc.signum == signal.SIGINT, time.perf_counter() - started < 1)
    """
)


def _run(case: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", f"CASE = {case!r}\n{SCENARIO}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("inside", ["sleep", "swallowing", "converting"])
def test_a_signal_inside_at_once_is_interrupted_at_once(inside):
    assert _run(inside) == "interrupted True True"


def test_outside_at_once_a_signal_only_sets_the_flag():
    assert _run("outside") == "flag set"


def test_the_flag_raises_once_set_and_only_then():
    flag = StopFlag()
    flag.check()  # not set: nothing
    flag.set(signal.SIGTERM)  # outside at_once, even in the main thread: only the flag
    with pytest.raises(Interrupted) as info:
        flag.check()
    assert info.value.signum == signal.SIGTERM and flag.event.is_set()
    with pytest.raises(Interrupted):  # a block is not entered once the flag is set
        with flag.at_once():
            raise AssertionError("entered")


def test_at_once_turns_what_a_library_raises_after_a_signal_into_interrupted_and_nothing_else():
    flag = StopFlag()
    with pytest.raises(OSError, match="a real read error"):  # no signal: the error is the error
        with flag.at_once():
            raise OSError("a real read error")
    assert flag.reading == 0
    with pytest.raises(Interrupted) as info:
        with flag.at_once():
            assert flag.reading == 1
            flag.event.set()  # what set() does from a thread other than the main one
            flag.signum = signal.SIGINT
            raise OSError("could not read")  # pyarrow's wording of the stop
    assert isinstance(info.value.__cause__, OSError) and flag.reading == 0


def test_a_block_that_swallows_the_stop_is_interrupted_on_the_way_out():
    flag = StopFlag()
    with pytest.raises(Interrupted):
        with flag.at_once():
            threading.Thread(target=flag.set, args=(signal.SIGINT,)).start()  # another thread: no raise there
            flag.event.wait(5)
    assert flag.reading == 0


def test_a_budget_is_a_value_keyed_by_its_tokens_and_strategy():
    budget = Batching(4096, "padded")
    assert budget.key == (4096, "padded") and budget.backend is budget.precision is None
    lowered = replace(budget, max_tokens=1024)  # after an out-of-memory batch: a new budget, the old one stays
    assert lowered.key == (1024, "padded") and budget.key == (4096, "padded")
    with pytest.raises(FrozenInstanceError):
        budget.max_tokens = 1024


SIGNALS = textwrap.dedent(
    """
    import os, signal, sys, time
    from batchinfer.control import Interrupted, Signals, StopFlag

    flag = StopFlag()
    before = signal.getsignal(signal.SIGTERM)
    with Signals(flag, lambda signum: print("forced", signum, flush=True)):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("stopping", flag.signum == signal.SIGTERM, flush=True)  # the first only sets the flag
        if SECOND:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # a batch on the model: the watching thread ends the process
            print("not forced")
    print("restored", signal.getsignal(signal.SIGTERM) is before)
    """
)


@pytest.mark.parametrize("second", [False, True])
def test_the_first_signal_sets_the_flag_and_a_second_ends_the_process(second):
    done = subprocess.run(
        [sys.executable, "-c", f"SECOND = {second}\n{SIGNALS}"], capture_output=True, text=True, timeout=60
    )
    if second:
        assert done.returncode == 128 + signal.SIGTERM, done.stderr
        assert done.stdout.split("\n")[:2] == ["stopping True", f"forced {int(signal.SIGTERM)}"]
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["stopping", "True", "restored", "True"]
