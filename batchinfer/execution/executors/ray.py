"""On a Ray cluster: one long-lived actor per worker, holding the model (Ray pins one GPU to each with
num_gpus), with two chunks in flight on each, so one is read while the other runs.

Only the driver commits, and only a result it was waiting for, so no chunk is committed twice. A worker that
dies (killed, out of memory, its node lost) costs only its chunks in flight: Ray fails them as soon as it
sees the worker gone (max_task_retries 0: a chunk never waits for its worker to come back) and they go to
the workers that remain. Ray restarts the worker where it finds room (max_restarts), its model loaded again,
and it takes chunks again once it answers; one that Ray cannot place again (its node gone, no room elsewhere)
is not waited for, and the report names it and the chunks that ran again. A chunk run again writes its part
again, whole under the same name, before the driver commits it: the commit protocol's marker decides.

The chunks in flight are Ray's own refs, waited on with ray.wait, each with its worker and chunk:
ray.util.ActorPool cannot say which chunk a failed result belonged to, nor leave out a worker that is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from typing import Iterator

from ...batching.budget import ProbeChoice
from ...control import Progress, StopFlag, library_logs_shown
from ...errors import BatchinferError, ConfigError, ModelError
from ...job.plan import Work
from ...output.records import ChunkResult
from ..chunk_task import TaskInputs

IN_FLIGHT = 2  # chunks per worker: one computing, one loading
POLL = 0.25  # seconds between checks of the stop flag while chunks run
RESTARTS = 2  # times Ray restarts a worker whose process died (its chunks in flight go to the others meanwhile)


class Worker:
    """The actor: a ChunkTask with its runner, loaded once. Loading one chunk overlaps computing another
    (a threaded actor); each step runs one at a time."""

    def __init__(self, inputs: TaskInputs, name: str, threads: int):
        import torch

        torch.set_num_threads(threads)
        self.loading, self.computing = threading.Lock(), threading.Lock()
        self.failed: Exception | None = None
        self.tuned = False
        try:
            self.task = inputs.task(StopFlag(), name)
        except Exception as exc:  # noqa: BLE001 - raised by describe(): Ray keeps no cause of a failed __init__
            self.failed = exc

    def describe(self) -> tuple[str, int]:
        if self.failed:
            raise self.failed
        return str(self.task.runner.device), os.getpid()

    def run(self, work: Work, probe: bool, tuning: ProbeChoice | None) -> ChunkResult:
        if self.failed:  # a replacement worker whose model did not load
            raise self.failed
        if tuning and not self.tuned:  # once: an out-of-memory may lower the budget afterwards
            self.task.take(tuning)
            self.tuned = True
        with self.loading:
            loaded = self.task.load(work)
        notes: list[str] = []
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
        gpus, cpus = resources.get("GPU", 0), resources.get("CPU", 0)
        per_gpu = runtime.gpus_per_worker if gpus else 0
        count = runtime.workers if runtime.workers != "auto" else workers_held(self.ray.nodes(), runtime, per_gpu)
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
            max_task_retries=0,
        )
        threads = max(1, int(runtime.cpus_per_worker))
        # Actor names are unique in the cluster (several jobs may share it); the report says ray-0, ray-1, ...
        prefix = f"batchinfer-{inputs.writer.job_id[:8]}"
        self.actors = {f"ray-{i}": None for i in range(count)}
        try:
            for name in self.actors:
                self.actors[name] = remote.options(name=f"{prefix}-{name}", **options).remote(inputs, name, threads)
            described = self._get([self._answer(name) for name in self.actors])
        except self.ray.exceptions.RayActorError as exc:
            self.close()
            raise _dying(_said(exc)) from None
        except BaseException:
            self.close()
            raise
        self.device = f"{described[0][0]} x{count} (ray)"
        self.load_seconds: dict = {}  # each worker loads in its own process, at once: no one figure for the run
        self.live = list(self.actors)  # the workers taking chunks, in order
        self.sent: dict = {}  # a chunk in flight: its ref -> (worker, work)
        self.returning: dict = {}  # a lost worker's answer once Ray has restarted it: its ref -> worker
        self._last_error = ""  # the last worker's death, for the message when none is left
        # name -> {"died": times, "error": the last, "chunks_rerun": [...], "back": whether it took chunks again}
        self.lost_workers: dict[str, dict] = {}

    def run(self, todo: list[Work], probe: bool) -> Iterator[ChunkResult]:
        waiting, tuning = deque(todo), None
        while waiting or self.sent:
            self._hand_out(waiting, probe, tuning)
            for result in self._finished(waiting):
                if probe and result.tuning is not None:  # a chunk with no rows to run leaves the probe to the next
                    probe, tuning = False, result.tuning
                yield result

    def _hand_out(self, waiting: deque, probe: bool, tuning: ProbeChoice | None) -> None:
        """Fill each live worker's places with the next chunks; while probing, one chunk in all, alone (the
        others wait for the batching it settles)."""
        for name in self.live:
            while waiting and sum(w == name for w, _ in self.sent.values()) < IN_FLIGHT and not (probe and self.sent):
                work = waiting.popleft()
                self.sent[self.actors[name].run.remote(work, probe, tuning)] = (name, work)

    def _finished(self, waiting: deque) -> list[ChunkResult]:
        """The chunks that finished within POLL seconds (the stop flag checked between); a lost worker's
        chunks put back first in `waiting`; a worker back from a restart live again."""
        self.stop.check()
        if not self.live and not self.returning:
            raise _dying(self._last_error)
        ready, _ = self.ray.wait([*self.sent, *self.returning], num_returns=1, timeout=POLL)
        results = []
        for ref in ready:
            if ref in self.returning:
                self._welcome(ref)
                continue
            name, _ = self.sent[ref]
            try:
                result = self._get(ref)
            except self.ray.exceptions.RayActorError as exc:
                self._lose(name, exc, waiting)
                continue
            del self.sent[ref]
            for note in result.notes:
                self.progress.log(f"{result.record.worker}: {note}")
            results.append(result)
        return results

    def _lose(self, name: str, exc: Exception, waiting: deque) -> None:
        """A worker died: its chunks in flight go back to the front of `waiting`, for the others; Ray's
        restart of it is awaited on the side (an answer that waits out the restart), never by a chunk."""
        mine = [ref for ref, (worker, _) in self.sent.items() if worker == name]  # in the order sent
        works = [self.sent.pop(ref)[1] for ref in mine]  # a result of theirs that still comes is not waited for
        waiting.extendleft(reversed(works))
        self.live.remove(name)
        self._last_error = _said(exc)
        lost = self.lost_workers.setdefault(name, {"died": 0, "error": "", "chunks_rerun": [], "back": False})
        lost.update(died=lost["died"] + 1, error=self._last_error, back=False)
        lost["chunks_rerun"] += [w.name for w in works]
        self.returning[self._answer(name)] = name
        where = "the other workers" if self.live else "the first worker Ray places again"
        chunks = ", ".join(w.name for w in works)
        self.progress.log(f"{name} died ({type(exc).__name__}); its chunks {chunks} go to {where}")

    def _welcome(self, ref) -> None:
        """A lost worker answered: back (Ray restarted it, its model loaded), or gone for good."""
        name = self.returning.pop(ref)
        try:
            self._get(ref)
        except (self.ray.exceptions.RayActorError, BatchinferError) as exc:
            self._last_error = _said(exc)
            self.progress.log(f"{name} is gone for good ({type(exc).__name__})")
            return
        self.live.append(name)
        self.lost_workers[name]["back"] = True
        self.progress.log(f"{name} is back (Ray restarted it) and takes chunks again")

    def _answer(self, name: str):
        """The worker's answer (its device and process), waiting out Ray's restarts of it: a ref that fails
        only once Ray gives the worker up."""
        return self.actors[name].describe.options(max_task_retries=-1).remote()

    def _get(self, refs):
        """ray.get, with a task's own error (a bad shard, a model failing every row) raised as itself."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, BatchinferError):
                raise cause from None
            raise

    def close(self) -> None:
        for actor in getattr(self, "actors", {}).values():
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
        if self.connected:  # disconnects; a local Ray started here ("started") stops with it
            self.ray.shutdown()


def workers_held(nodes: list[dict], runtime, per_gpu: float) -> int:
    """runtime.workers auto: as many workers as the cluster's live nodes hold, each node counted on its own (a
    worker lives on one node): where the cluster has GPUs, one per gpus_per_worker of a node's GPUs (as many
    CPUs allowing); else one per cpus_per_worker of a node's CPUs. At least 1 (then refused if it does not fit).
    nodes: ray.nodes()."""
    held = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        by_cpu = int(resources.get("CPU", 0) // runtime.cpus_per_worker)
        held += min(by_cpu, int(resources.get("GPU", 0) // per_gpu)) if per_gpu else by_cpu
    return max(1, held)


def _said(exc: Exception) -> str:
    """An error in one short line: Ray's messages run to many lines."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


def _dying(error) -> ModelError:
    return ModelError(
        f"Ray workers keep dying ({error})"[:400],
        "check the workers' memory (ray memory, dmesg) and logs; rerun the same command to resume",
    )


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
    A worker's death is batchinfer's one line instead (RayExecutor._lose). Left so for the process:
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
