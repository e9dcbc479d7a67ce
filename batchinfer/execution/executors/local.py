"""In this process: one runner, and one background thread that reads and tokenizes the next chunk
while the model runs this one (pyarrow and the Rust tokenizer release the GIL), so the model rarely
waits for input."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

from ...control import Progress
from ...job.plan import Work
from ...output.records import ChunkResult
from ..chunk_task import ChunkTask, Loaded


class LocalExecutor:
    def __init__(self, task: ChunkTask, progress: Progress):
        self.task, self.progress = task, progress
        self.device = str(task.runner.device)
        self.load_seconds = task.runner.load_seconds
        self.lost_workers: dict = {}  # one worker, this process: none to lose and carry on without

    def run(self, todo: list[Work], probe: bool) -> Iterator[ChunkResult]:
        for loaded in self._prefetch(todo):
            result = self.task.run(loaded, probe=probe, log=self.progress.log, partial=self.progress.partial)
            probe = probe and result.tuning is None  # a chunk with no rows to run leaves the probe to the next
            yield result

    def _prefetch(self, todo: list[Work]) -> Iterator[Loaded]:
        """Loaded chunks in order, loading the next one while the caller computes."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchinfer-load")
        pending: Future | None = None
        try:
            pending = pool.submit(self.task.load, todo[0])
            for following in [*todo[1:], None]:
                with self.task.stop.at_once():  # waiting writes nothing; the loading thread checks the flag
                    loaded = pending.result()
                pending = pool.submit(self.task.load, following) if following else None
                yield loaded
        finally:
            if pending is not None:
                pending.cancel()
            pool.shutdown(wait=True)

    def close(self) -> None:
        self.task.close()
