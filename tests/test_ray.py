"""The Ray executor on a cluster of two nodes of 1 CPU each, on this machine: the same output as in-process,
every row once, whatever dies: a worker process killed with kill -9, a node lost mid-run, the driver stopped by
SIGTERM or killed with kill -9."""

import os
import signal
import threading
import time
from functools import partial

import numpy as np
import pyarrow.dataset as ds
import pytest
from helpers import done_chunks, make_job, run_cli, run_until, vectors, write_job

from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job

ray = pytest.importorskip("ray")


@pytest.fixture(scope="session")  # one worker runs these (conftest.ONE_WORKER), maybe with other files between
def cluster():
    """The Ray cluster the tests share, on this machine (ray.cluster_utils): two nodes of 1 CPU each, the head,
    which this process joins (a run started by a test joins it by its address), and another."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, log_to_driver=False, logging_level="error")
    nodes.wait_for_nodes()
    yield nodes
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture
def a_node(cluster):
    """The cluster's node other than the head, to remove; a node of 1 CPU takes its place afterwards."""
    node = next(iter(cluster.worker_nodes))
    yield node
    if node not in cluster.worker_nodes:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()


_job = partial(
    make_job,
    raw=True,
    input__keep=None,
    model__max_length=64,
    batching__chunk_rows=50,
    batching__max_tokens=4096,
    runtime__executor="ray",
    runtime__workers=2,
)


def _read(out):
    return ds.dataset(str(out), format="parquet").to_table()


class AfterChunks:
    """Progress that does something (`act`) to the cluster once `chunks` chunks are committed, in the driver's
    thread: the run goes on only after it; the run's log lines are kept in `notes`."""

    def __init__(self, chunks):
        self.left, self.notes = chunks, []

    def start(self, total_rows, done_rows, since):
        pass

    def log(self, message):
        self.notes.append(message)

    def advance(self, rows, tokens):
        self.left -= 1
        if self.left == 0:
            self.act()

    def act(self):
        raise NotImplementedError


class KillWorkerAfter(AfterChunks):
    """Kills a worker's process with kill -9. (ray.kill ends an actor the same way to the driver: a RayActorError
    on its chunks in flight.)"""

    def __init__(self, chunks):
        super().__init__(chunks)
        self.killed = []

    def act(self):
        name = next(n for n in ray.util.list_named_actors() if n.startswith("batchinfer-") and n.endswith("-ray-1"))
        os.kill(ray.get(ray.get_actor(name).describe.remote())[1], signal.SIGKILL)
        self.killed.append(name)


# One Ray run proves all three (each Ray run costs actor starts, 19 s of a 2-core AVX2 EPYC for a run of its
# own): workers: auto on a cluster without GPUs is one per CPU of each node; a classify job's labels and named
# scores come back from those two workers as in-process, though a worker's process was killed with kill -9
# mid-run; an embed job's vectors are compared to an in-process run's by the SIGTERM and kill -9 test below
def test_ray_output_equals_the_in_process_output_though_a_worker_is_killed_with_kill_9(
    cluster, sms_parquet, sms_table, tmp_path, tiny_classify, capfd, monkeypatch
):
    import ray._private.worker as ray_worker

    raylet_said, print_worker_logs = threading.Event(), ray_worker.print_worker_logs

    def seen(data, *args, **kwargs):  # the raylet's lines reach the driver through this, printed or not
        if any("died" in line for line in data["lines"]):
            raylet_said.set()
        return print_worker_logs(data, *args, **kwargs)

    monkeypatch.setattr(ray_worker, "print_worker_logs", seen)
    job = partial(_job, sms_parquet, tiny_classify, task="classify", output__scores=True, runtime__workers="auto")
    local = run_job(validate_job(job(out=tmp_path / "local", runtime__executor="local", runtime__workers=1)))
    progress = KillWorkerAfter(3)
    report = run_job(validate_job(job(out=tmp_path / "ray")), progress=progress)
    assert progress.killed and report["complete"] and report["rows"] == report["rows_ok"] == local["rows"] == 600
    workers = report["run"]["workers"]
    # the killed worker's chunks in flight ran again, on the other worker or on the killed one restarted under its
    # name: which, and whether the killed one had committed a chunk before, is the kill's timing
    assert report["device"] == "cpu x2 (ray)" and set(workers) <= {"ray-0", "ray-1"} and workers  # auto: 2 CPUs
    assert sum(w["rows"] for w in workers.values()) == 600  # the killed worker's rows in flight counted once
    # the raylet's own message about the dead worker comes from a thread of Ray's driver, after the kill
    assert raylet_said.wait(60), "Ray's driver never received the raylet's message about the dead worker"
    shown = capfd.readouterr()
    assert "worker died" not in (shown.out + shown.err).lower() and "\x1b[" not in shown.out + shown.err
    died = [note for note in progress.notes if "died" in note]
    assert len(died) == 1 and len(died[0]) < 120, died  # one line of batchinfer's instead
    assert done_chunks(tmp_path / "ray") == 12
    ours, theirs = _read(tmp_path / "ray"), _read(tmp_path / "local")
    ids = sms_table.column("sms_id").to_pylist()[:600]
    assert ours.column("sms_id").to_pylist() == theirs.column("sms_id").to_pylist() == ids  # each once, in order
    assert ours.column("label").to_pylist() == theirs.column("label").to_pylist()
    assert ours.schema.field("scores").metadata == theirs.schema.field("scores").metadata  # the label names
    assert np.abs(vectors(ours, "scores") - vectors(theirs, "scores")).max() < 1e-5


def test_a_model_error_in_a_worker_is_the_same_message(cluster, sms_parquet, tiny_embed, tmp_path):
    from batchinfer.errors import ModelError

    with pytest.raises(ModelError, match="sequence-classification head"):
        job = _job(sms_parquet, tiny_embed, tmp_path / "out", "classify", output__scores=True, runtime__workers=1)
        run_job(validate_job(job))


def test_more_workers_than_the_cluster_holds_is_refused(cluster, sms_parquet, tiny_embed, tmp_path):
    from batchinfer.errors import ConfigError

    job = _job(sms_parquet, tiny_embed, tmp_path / "out")
    job["runtime"]["workers"] = 3
    with pytest.raises(ConfigError, match="runtime.workers 3 need 3 CPUs .* the Ray cluster has 2 CPUs"):
        run_job(validate_job(job))


def test_without_ray_installed_the_message_says_what_to_install(sms_parquet, tiny_embed, tmp_path, monkeypatch):
    import builtins

    from batchinfer.errors import ConfigError

    real_import = builtins.__import__

    def no_ray(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "ray" and level == 0:
            raise ImportError("No module named 'ray'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError) as info:
        run_job(validate_job(_job(sms_parquet, tiny_embed, tmp_path / "out")))
    assert 'pip install -e ".[ray]"' in info.value.hint


def test_sigterm_then_the_driver_killed_with_kill_9_then_the_same_command_finishes(
    cluster, sms_parquet, tiny_embed, tmp_path
):
    # One run through both ways a driver ends early (each costs a Ray start): SIGTERM stops the workers and says
    # how to resume; kill -9 of the resumed driver gives no warning at all; the same command then finishes with
    # the output of an uninterrupted in-process run. The job file is local: --set makes it a Ray run.
    out = tmp_path / "out"
    job = write_job(tmp_path, **{**_job(sms_parquet, tiny_embed, out, batching__max_rows=2), "runtime": {}})
    command = ["run", str(job), "--set", "runtime.executor=ray", "--set", "runtime.workers=1"]  # 2: the tests above
    command += ["--set", f"runtime.ray_address={cluster.address}"]  # not another Ray running on this machine
    stopped = run_until(command, lambda _: done_chunks(out) >= 1, signal.SIGTERM, timeout=180)
    output = stopped.output
    assert stopped.returncode == 143 and "stopped on SIGTERM" in output and "resume with: batchinfer run" in output
    first = done_chunks(out)
    assert 1 <= first < 11, output
    assert not [n for n in ray.util.list_named_actors() if n.startswith("batchinfer-")]  # no worker left behind
    killed = run_until(command + ["-q"], lambda _: done_chunks(out) > first, timeout=180)
    assert first < done_chunks(out) < 12, killed.output  # the kill landed mid-run, after the resume got going
    finished = run_cli(command + ["-q"])
    assert finished.returncode == 0, finished.stderr
    run_job(
        validate_job(_job(sms_parquet, tiny_embed, tmp_path / "whole", runtime__executor="local", batching__max_rows=2))
    )
    resumed, whole = _read(out), _read(tmp_path / "whole")
    assert resumed.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()  # each once, input order
    assert (
        np.abs(
            np.array(resumed.column("embedding").to_pylist()) - np.array(whole.column("embedding").to_pylist())
        ).max()
        < 1e-5
    )


class LoseNodeAfter(AfterChunks):
    """Removes a node of the cluster (its raylet stops, and the workers on it with it; removed with kill -9
    instead, allow_graceful=False, the worker's chunks fail the same way); from then on, the job is stopped if it
    runs `limit` seconds more (a stalled job fails the test, never hangs it)."""

    def __init__(self, chunks, cluster, node, stop, limit):
        super().__init__(chunks)
        self.cluster, self.node = cluster, node
        self.removed, self.timer = None, threading.Timer(limit, stop.set, (signal.SIGTERM,))  # cancel when done

    def act(self):
        self.cluster.remove_node(self.node)
        self.removed = time.monotonic()
        self.timer.start()


def test_a_lost_node_costs_its_chunks_in_flight_and_the_other_worker_finishes_the_job(
    cluster, a_node, sms_parquet, sms_table, tiny_embed, tmp_path
):
    # 21 chunks on two workers, one per node; the node of one is lost after 4 chunks, and Ray cannot place its
    # worker again (the other node's one CPU is taken): the job does not wait for it
    from batchinfer.control import Interrupted, StopFlag

    out, stop = tmp_path / "out", StopFlag()
    progress = LoseNodeAfter(4, cluster, a_node, stop, limit=60)
    job = _job(sms_parquet, tiny_embed, out, batching__chunk_rows=30, batching__max_rows=2)
    try:
        report = run_job(validate_job(job), progress=progress, stop=stop)
    except Interrupted:
        pytest.fail(f"the job stalled for 60 s after the node was lost: {done_chunks(out)} of 21 chunks done")
    finally:
        progress.timer.cancel()
    assert time.monotonic() - progress.removed < 60 and report["complete"] and report["rows"] == 600
    (lost, what), *others = report["run"]["lost_workers"].items()
    assert not others and what["died"] == 1 and not what["back"], report["run"]
    planned = {f"{shard:05d}-{chunk:05d}" for shard in range(3) for chunk in range(7)}
    assert what["chunks_rerun"] and set(what["chunks_rerun"]) <= planned
    died = [note for note in progress.notes if "died" in note]
    assert len(died) == 1 and died[0].startswith(f"{lost} died") and what["chunks_rerun"][0] in died[0], died
    assert done_chunks(out) == 21
    ids = sms_table.column("sms_id").to_pylist()[:600]
    assert _read(out).column("sms_id").to_pylist() == ids  # each committed once, in input order
