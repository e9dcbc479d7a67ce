"""Who runs the chunk tasks: in this process (local) or on a Ray cluster (ray). Executors differ only
in where `ChunkTask.run` happens; the driver hands them chunks and commits the records they return."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

from ...control import Progress, StopFlag
from ...job.plan import Work
from ...output.records import ChunkResult
from ..chunk_task import TaskInputs


class Executor(Protocol):
    """What the driver uses of an executor (tests/test_house.py holds the driver to it)."""

    device: str  # what the runners run on, for the report
    load_seconds: dict  # the model's load in steps (converting, compiling), for the report's startup figures
    # workers that died during the run: name -> {"died", "error", "chunks_rerun", "back"}, for the report
    lost_workers: dict

    def run(self, todo: list[Work], probe: bool) -> Iterator[ChunkResult]:
        """Run every chunk of `todo` once; yield each chunk's result as it finishes (in any order).
        probe: settle `batching: auto` on the first chunk that has rows; its result carries the choice,
        and the chunks after it use it."""
        ...

    def close(self) -> None: ...


@contextmanager
def make_executor(inputs: TaskInputs, stop: StopFlag, progress: Progress, on_runner: Callable | None = None):
    """The executor the job's runtime section asks for, closed on the way out. Loading the model writes
    nothing, so a signal stops it at once."""
    with stop.at_once():
        if inputs.job.runtime.executor == "ray":
            from .ray import RayExecutor

            executor = RayExecutor(inputs, stop, progress)
        else:
            from .local import LocalExecutor

            executor = LocalExecutor(inputs.task(stop, wrap=on_runner), progress)
    try:
        yield executor
    finally:
        executor.close()
