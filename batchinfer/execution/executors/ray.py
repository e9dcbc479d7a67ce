"""On a Ray cluster: one long-lived actor per worker, holding the model (Ray pins one GPU to each with
num_gpus), fed chunks through Ray's ActorPool with two in flight per actor, so one is read while the other runs.

Only the driver commits, and a chunk's result comes back once, so no chunk is committed twice. A worker that
dies (killed, out of memory, its node lost) costs only its chunks in flight: Ray restarts the actor (its model
loaded again) and runs those chunks again on it (max_restarts, max_task_retries); one that keeps dying ends
the run with a message.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Iterator

from ...control import Progress, StopFlag, library_logs_shown
from ...errors import BatchinferError, ConfigError, ModelError
from ...job.plan import Work
from ...output.records import ChunkResult
from ..chunk_task import TaskInputs

IN_FLIGHT = 2  # chunks per worker: one computing, one loading
POLL = 0.25  # seconds between checks of the stop flag while chunks run
RESTARTS = 2  # times Ray restarts a worker whose process died, running its chunks in flight again


class Worker:
    """The actor: a ChunkTask with its runner, loaded once. Loading one chunk overlaps computing another
    (a threaded actor); each step runs one at a time."""

    def __init__(self, inputs: TaskInputs, name: str, threads: int):
        import torch

        torch.set_num_threads(threads)
        import ray

        self.loading, self.computing = threading.Lock(), threading.Lock()
        self.failed: Exception | None = None
        self.tuned = False
        # Ray restarted this worker after its process died: said once, with its first chunk's notes.
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        try:
            self.task = inputs.task(StopFlag(), name)
        except Exception as exc:  # noqa: BLE001 - raised by describe(): Ray keeps no cause of a failed __init__
            self.failed = exc

    def describe(self) -> tuple[str, int]:
        if self.failed:
            raise self.failed
        return str(self.task.runner.device), os.getpid()

    def run(self, work: Work, probe: bool, tuning: dict | None) -> ChunkResult:
        if self.failed:  # a replacement worker whose model did not load
            raise self.failed
        if tuning and not self.tuned:  # once: an out-of-memory may lower the budget afterwards
            self.task.take(tuning)
            self.tuned = True
        with self.loading:
            loaded = self.task.load(work)
        notes: list[str] = []
        if self.restarted:
            notes.append("restarted by Ray after its process died; its chunks in flight ran again")
            self.restarted = False
        with self.computing:
            result = self.task.run(loaded, probe=probe, log=notes.append)
        result.notes = notes  # said by the driver's progress, in the driver's process
        return result


class RayExecutor:
    def __init__(self, inputs: TaskInputs, stop: StopFlag, progress: Progress):
        self.ray = _import_ray()
        self.stop, self.progress = stop, progress
        runtime = inputs.job.runtime
        self.connected = _connect(self.ray, runtime.ray_address)  # None: connected before, left so
        _quiet_ray_lines()
        resources = self.ray.cluster_resources()
        gpus = resources.get("GPU", 0)
        per_gpu = runtime.gpus_per_worker if gpus else 0
        count = runtime.workers if runtime.workers != "auto" else max(1, int(gpus // per_gpu) if per_gpu else 1)
        cpus = resources.get("CPU", 0)
        if count * runtime.cpus_per_worker > cpus or count * per_gpu > gpus:
            self.close()
            raise ConfigError(
                f"runtime.workers {count} need {count * runtime.cpus_per_worker:g} CPUs and {count * per_gpu:g} GPUs; "
                f"the Ray cluster has {cpus:g} CPUs and {gpus:g} GPUs",
                "lower runtime.workers or runtime.cpus_per_worker, or add machines to the cluster",
            )
        remote = self.ray.remote(Worker)
        options = dict(
            num_cpus=runtime.cpus_per_worker,
            num_gpus=per_gpu,
            max_concurrency=IN_FLIGHT + 1,
            max_restarts=RESTARTS,
            max_task_retries=RESTARTS,
        )
        threads = max(1, int(runtime.cpus_per_worker))
        # Actor names are unique in the cluster (several jobs may share it); the report says ray-0, ray-1, ...
        prefix = f"batchinfer-{inputs.writer.job_id[:8]}"
        self.actors = {f"ray-{i}": None for i in range(count)}
        try:
            for name in self.actors:
                self.actors[name] = remote.options(name=f"{prefix}-{name}", **options).remote(inputs, name, threads)
            described = self._get([actor.describe.remote() for actor in self.actors.values()])
        except BaseException:
            self.close()
            raise
        self.device = f"{described[0][0]} x{count} (ray)"
        self.load_seconds: dict = {}  # each worker loads in its own process, at once: no one figure for the run

    def run(self, todo: list[Work], probe: bool) -> Iterator[ChunkResult]:
        # Each actor twice in the pool: two chunks in flight on it (its loading overlaps its computing).
        pool = self.ray.util.ActorPool([actor for actor in self.actors.values() for _ in range(IN_FLIGHT)])
        work, tuning = iter(todo), None
        while probe:  # the probe's chunk runs alone: the others wait for the batching it settles
            first = next(work, None)
            if first is None:
                return
            pool.submit(lambda actor, w: actor.run.remote(w, True, None), first)
            result = self._next(pool)
            if result.tuning is not None:  # a chunk with no rows to run leaves the probe to the next
                probe, tuning = False, result.tuning
            yield result
        for each in work:
            pool.submit(lambda actor, w, tuning=tuning: actor.run.remote(w, False, tuning), each)
        while pool.has_next():
            yield self._next(pool)

    def _next(self, pool) -> ChunkResult:
        """The next chunk to finish, in any order; the stop flag checked while waiting."""
        while True:
            self.stop.check()
            try:
                result = self._get(pool, POLL)
                break
            except TimeoutError:
                continue
        for note in result.notes:
            self.progress.log(f"{result.record.worker}: {note}")
        return result

    def _get(self, source, timeout: float | None = None):
        """ray.get of refs, or a pool's next result, with a task's own error (a bad shard, a model failing
        every row) raised as itself, and a worker that died more than Ray restarts it as one message."""
        try:
            if isinstance(source, self.ray.util.ActorPool):
                return source.get_next_unordered(timeout=timeout)
            return self.ray.get(source)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, BatchinferError):
                raise cause from None
            raise
        except self.ray.exceptions.RayActorError as exc:
            raise ModelError(
                f"Ray workers keep dying ({type(exc).__name__}: {str(exc)[:300]})",
                "check the workers' memory (ray memory, dmesg) and logs; rerun the same command to resume",
            ) from None

    def close(self) -> None:
        for actor in getattr(self, "actors", {}).values():
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
        if self.connected:  # disconnects; a local Ray started here ("started") stops with it
            self.ray.shutdown()


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "runtime.executor: ray needs Ray, which is not installed",
            'pip install -e ".[ray]" (or pip install "batchinfer[ray]")',
        ) from exc
    return ray


def _connect(ray, address: str | None) -> str | None:
    """Join the cluster at `address`, or a running one, or start a local one: how Ray was reached (see
    _init), or None when this process was already connected (then closing leaves the connection alone).
    Ray installs signal handlers of its own; the caller's (stop after the batch in flight) are kept."""
    if ray.is_initialized():
        return None
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _init(ray, address)
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                signal.signal(signum, handler)


def _quiet_ray_lines() -> None:
    """Without --debug, Ray prints nothing of its own in this process: not the workers' output, not its
    logger's lines, and not the raylet's error messages ("A worker died or was killed ...", some 800
    characters in colour), which its driver prints from a thread of its own whatever log_to_driver says.
    A worker's death is batchinfer's one line instead (RayExecutor._replace). Left so for the process:
    the raylet's message about a dead worker may come after the job is over."""
    if library_logs_shown():
        return
    logging.getLogger("ray").setLevel(logging.ERROR)
    # Ray has no public switch for the raylet's messages: its driver prints them from a thread of its own. This
    # is the one ray.util.rpdb sets; a Ray that moves it costs the silence only, never the run.
    try:
        import ray._private.worker as ray_worker
    except ImportError:
        return
    ray_worker._worker_logs_enabled = False


def _init(ray, address: str | None) -> str:
    """Connect this process to Ray: "address" (the cluster at runtime.ray_address), "running" (one already
    running on this machine) or "started" (a local Ray started here, gone with this process)."""
    debug = library_logs_shown()
    options = dict(
        include_dashboard=False,
        log_to_driver=debug,
        logging_level=logging.INFO if debug else logging.ERROR,
        configure_logging=True,
    )
    if address:
        try:
            ray.init(address=address, **options)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"cannot reach the Ray cluster at {address}: {exc}",
                "check runtime.ray_address (e.g. ray://head:10001), or remove it to start a local one",
            ) from exc
        return "address"
    try:
        ray.init(address="auto", **options)
        return "running"
    except (ConnectionError, ValueError, RuntimeError):
        started = time.perf_counter()
        ray.init(**options)
        logging.getLogger(__name__).debug("started a local Ray in %.1f s", time.perf_counter() - started)
        return "started"
