"""Who runs the chunk tasks: in this process (local) or on a Ray cluster (ray). Executors differ only
in where `ChunkTask.run` happens; the driver hands them chunks and commits the records they return."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Protocol

from ..config import JobConfig
from ..control import Budget, Progress, StopFlag
from ..plan import Work
from ..sink import PartWriter
from ..sources import ReadSpec, Shard


class Executor(Protocol):
    device: str  # what the runners run on, for the report

    def run(self, todo: list[Work], probe: bool) -> Iterator[dict]:
        """Run every chunk of `todo` once; yield each chunk's record as it finishes (in any order).
        probe: settle `batching: auto` on the first chunk that has rows; its record carries the choice,
        and the chunks after it use it."""
        ...

    def close(self) -> None: ...


@contextmanager
def make_executor(
    job: JobConfig,
    model_path: Path,
    shards: list[Shard],
    spec: ReadSpec,
    writer: PartWriter,
    budget: Budget,
    stop: StopFlag,
    progress: Progress,
    on_runner: Callable | None = None,
):
    """The executor the job's runtime section asks for, closed on the way out."""
    if job.runtime.executor == "ray":
        from .ray import RayExecutor

        executor = RayExecutor(job, model_path, shards, spec, writer, budget, stop, progress)
    else:
        from ..runners import make_runner
        from ..task import ChunkTask
        from .local import LocalExecutor

        runner = make_runner(job, model_path)
        if on_runner:
            runner = on_runner(runner)
        executor = LocalExecutor(ChunkTask(job, shards, spec, runner, writer, budget, stop), progress.log)
    try:
        yield executor
    finally:
        executor.close()
