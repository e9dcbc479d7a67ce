"""kill -9 at random moments, then the same command: the output equals an uninterrupted run."""

import json
import random

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import done_chunks, run_cli, run_until, write_job

from batchinfer.execution.driver import run_job
from batchinfer.job.config import load_job

KILLS = 3  # random points in three runs; -m slow takes twenty


def _visible_files_are_whole(out):
    for part in out.glob("part-*.parquet"):
        pq.read_metadata(part)  # raises on a half-written file
    for marker in out.glob("_done/*.json"):
        json.loads(marker.read_text())


def _kill_and_resume(tmp_path, sms_parquet, tiny_embed, kills: int, chunk_rows: int, seed: int) -> None:
    job = write_job(
        tmp_path,
        input={"path": str(sms_parquet), "text": "text", "id": "sms_id"},
        # pinned kernels: the reference run and the killed one would each time the backends and may pick apart
        model={"path": str(tiny_embed), "task": "embed", "max_length": 64, "backend": "torch"},
        batching={"chunk_rows": chunk_rows, "max_rows": 2, "max_tokens": 16384, "strategy": "padded"},
        output={"path": str(tmp_path / "out")},
    )
    reference = load_job(job, [f"output.path={tmp_path / 'reference'}"])
    run_job(reference)
    total = -(-200 // chunk_rows) * 3  # three shards of 200 rows
    rng = random.Random(seed)
    command = ["run", str(job), "-q"]
    landed = []
    for _ in range(kills):
        target = done_chunks(tmp_path / "out") + rng.randint(0, 2)
        stopped = run_until(
            command,
            lambda _, target=target: done_chunks(tmp_path / "out") >= target,
            delay=rng.uniform(0, 0.05),  # somewhere inside a chunk: mid-batch, mid-write or mid-commit
        )
        landed.append(stopped.alive == [True] and done_chunks(tmp_path / "out") < total)
        _visible_files_are_whole(tmp_path / "out")
        assert not (tmp_path / "out" / "_SUCCESS").exists()
    assert landed == [True] * kills  # every kill hit a run in progress, with chunks still to do
    assert 0 < done_chunks(tmp_path / "out") < total
    finished = run_cli(command)
    assert finished.returncode == 0, finished.stderr
    resumed = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    whole = ds.dataset(str(tmp_path / "reference"), format="parquet").to_table()
    assert resumed.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()  # same ids, order, no duplicate
    assert np.array_equal(
        np.array(resumed.column("embedding").to_pylist()), np.array(whole.column("embedding").to_pylist())
    )
    assert not list((tmp_path / "out").glob(".tmp-*")) and not (tmp_path / "out" / "_lock").exists()


def test_kill_9_at_random_points_then_resume(tmp_path, sms_parquet, tiny_embed):
    _kill_and_resume(tmp_path, sms_parquet, tiny_embed, kills=KILLS, chunk_rows=40, seed=20261129)


@pytest.mark.slow
def test_kill_9_soak(tmp_path, sms_parquet, tiny_embed):
    """python -m pytest -m slow: twenty kills over smaller chunks."""
    _kill_and_resume(tmp_path, sms_parquet, tiny_embed, kills=20, chunk_rows=10, seed=7)
