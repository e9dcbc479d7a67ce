"""The stop flag: where a run only reads, a signal stops the main thread at once, whatever the code it
lands in does with the exception.

Each case runs in a fresh interpreter: a SIGINT sent to this test process could land in a native thread
that an earlier test left behind (OpenVINO's, xgrammar's), which is nothing a run's own process has."""

import subprocess
import sys
import textwrap

import pytest

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
