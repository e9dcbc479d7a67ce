"""The local executor: the next chunk is read while this one runs, records come in chunk order, the probe
moves on until a chunk settles it, and a stop or a failed read ends the run with no loader left behind.
A stand-in chunk task, no model."""

import signal
import threading
from types import SimpleNamespace

import pytest

from batchinfer.batching.budget import Batching
from batchinfer.control import Interrupted, Quiet, StopFlag
from batchinfer.errors import InputError
from batchinfer.execution.executors.local import LocalExecutor
from batchinfer.job.plan import Work, plan_chunks
from batchinfer.output.records import ChunkRecord, ChunkResult

WAIT = 2.0  # seconds a stand-in waits for what read-ahead should already have started


class Task:
    """A stand-in ChunkTask. run(k) waits for load(k + 1) to begin: read-ahead or a timeout. A chunk
    named in `empty` has no rows to run (its result carries no tuning); `fail`/`stop_at` break a load."""

    def __init__(self, names, empty=(), fail=None, stop_at=None):
        self.runner = SimpleNamespace(device="cpu", load_seconds={"torch": 0.5})
        self.stop = StopFlag()
        self.names, self.empty, self.fail, self.stop_at = names, set(empty), fail, stop_at
        self.started = {name: threading.Event() for name in names}
        self.ahead: list[bool] = []  # per run: whether the next load had begun while it ran
        self.probes: list[bool] = []
        self.ran: list[str] = []
        self.closed = False

    def load(self, work):
        self.started[work.name].set()
        if work.name == self.stop_at:
            self.stop.set(signal.SIGTERM)  # as the signal handler would, seen by the loader's own check
            self.stop.check()
        if work.name == self.fail:
            raise InputError(f"{work.name} cannot be read", "replace the file")
        return work

    def run(self, loaded, probe, log, partial):
        following = self.names.index(loaded.name) + 1
        if following < len(self.names):
            self.ahead.append(self.started[self.names[following]].wait(WAIT))
        self.probes.append(probe)
        self.ran.append(loaded.name)
        tuning = None if loaded.name in self.empty or not probe else {"max_tokens": 64}
        return ChunkResult(ChunkRecord(loaded.name, 10, 10, {}), Batching(64, "padded", "torch"), tuning)

    def close(self):
        self.closed = True


def _todo(n: int) -> list[Work]:
    return [Work(c, c.name) for c in plan_chunks([n * 10], chunk_rows=10)]


def _loaders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("batchinfer-load")]


def test_the_next_chunk_loads_while_this_one_runs_and_records_come_in_order():
    todo = _todo(4)
    task = Task([w.name for w in todo])
    executor = LocalExecutor(task, Quiet())
    results = list(executor.run(todo, probe=False))
    assert [r.record.chunk for r in results] == [w.name for w in todo] == task.ran
    assert task.ahead == [True, True, True]  # each load began before the chunk before it finished
    assert executor.device == "cpu" and executor.load_seconds == {"torch": 0.5}
    assert not _loaders()
    executor.close()
    assert task.closed


def test_the_probe_goes_to_the_first_chunk_that_settles_it():
    todo = _todo(4)
    task = Task([w.name for w in todo], empty={todo[0].name})  # the first chunk's rows were all errors
    list(LocalExecutor(task, Quiet()).run(todo, probe=True))
    assert task.probes == [True, True, False, False]


def test_a_stop_while_loading_ends_the_run_before_that_chunk_and_leaves_no_loader():
    todo = _todo(4)
    task = Task([w.name for w in todo], stop_at=todo[2].name)
    seen = []
    with pytest.raises(Interrupted) as info:
        for result in LocalExecutor(task, Quiet()).run(todo, probe=False):
            seen.append(result.record.chunk)
    assert info.value.signum == signal.SIGTERM
    assert seen == task.ran == [todo[0].name, todo[1].name]
    assert not task.started[todo[3].name].is_set() and not _loaders()


def test_a_failed_read_surfaces_in_order_after_the_chunks_before_it():
    todo = _todo(3)
    task = Task([w.name for w in todo], fail=todo[1].name)
    seen = []
    with pytest.raises(InputError, match=f"{todo[1].name} cannot be read"):
        for result in LocalExecutor(task, Quiet()).run(todo, probe=False):
            seen.append(result.record.chunk)
    assert seen == [todo[0].name] and not _loaders()


def test_a_caller_that_stops_early_leaves_no_loader():
    todo = _todo(5)
    task = Task([w.name for w in todo])
    results = LocalExecutor(task, Quiet()).run(todo, probe=False)
    assert next(results).record.chunk == todo[0].name
    results.close()  # the driver stops on an error of its own
    assert not _loaders() and task.ran == [todo[0].name]
