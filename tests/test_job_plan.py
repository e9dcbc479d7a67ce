"""JobPlan.open: a job's shards, model, chunks and fingerprint, as run, validate and plan all start."""

import json

import pytest
from helpers import make_job

from batchinfer.commands.dryrun import estimate_job
from batchinfer.errors import ModelError
from batchinfer.execution.driver import run_job
from batchinfer.execution.job_plan import JobPlan


def test_a_run_records_the_plan_and_fingerprint_that_job_plan_gives(tmp_path, sms_parquet, tiny_embed):
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out", batching__chunk_rows=70)
    plan = JobPlan.open(job)
    run_job(job, limit=150)
    record = json.loads((tmp_path / "out" / "_batchinfer.json").read_text())
    assert record["fingerprint"] == plan.fingerprint(150) != plan.fingerprint()
    assert record["plan"]["chunks"] == len(plan.chunks(150)) == 3
    # the whole job as the next run plans it: the third chunk in two pieces, its first 10 rows kept
    assert record["plan"]["job_chunks"] == len(plan.chunks(None, {"00000-00002": {10}})) == len(plan.chunks()) + 1
    assert plan.rows == sum(s.num_rows for s in plan.inputs.shards) and plan.model_path == tiny_embed


def test_plan_refuses_a_model_without_the_tasks_head_as_run_does(tmp_path, sms_parquet, tiny_embed, monkeypatch):
    """`plan` opens the job as `run` does: a classify job on an embedding model stops at the model's config,
    before a sample is read or timed."""
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out", "classify")
    with pytest.raises(ModelError) as run_error:
        run_job(job)
    monkeypatch.setattr("batchinfer.commands.dryrun.sample_problems", lambda *a: pytest.fail("a sample was read"))
    with pytest.raises(ModelError) as plan_error:
        estimate_job(job, timed=False)
    assert plan_error.value.message == run_error.value.message and not (tmp_path / "out").exists()
