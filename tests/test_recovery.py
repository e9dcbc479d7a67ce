"""Out of memory and model failures: split, retry, lower the budget, and lose no row."""

import shutil
from functools import partial

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch
from helpers import make_job

from batchinfer.errors import ModelError
from batchinfer.execution.driver import run_job
from batchinfer.runners.recovery import NOT_FINITE, is_oom, run_resilient


def _fail_above(tokens: int, error=torch.OutOfMemoryError):
    """A runner wrapper that raises for batches of more than `tokens` padded tokens, as a small GPU would."""

    def wrap(runner):
        original = runner.run

        def run(ids):
            if len(ids) * max(len(r) for r in ids) > tokens:
                raise error("CUDA out of memory. Tried to allocate 2.00 GiB")
            return original(ids)

        runner.run = run
        return runner

    return wrap


_job = partial(make_job, input__keep=None, batching=None, batching__chunk_rows=200)


def _embeddings(out):
    table = ds.dataset(str(out), format="parquet").to_table()
    return table.column("sms_id").to_pylist(), np.array(table.column("embedding").to_pylist())


def test_oom_splits_lowers_budget_and_keeps_every_row(sms_parquet, tiny_embed, tmp_path):
    run_job(_job(sms_parquet, tiny_embed, tmp_path / "normal"))
    report = run_job(_job(sms_parquet, tiny_embed, tmp_path / "small"), on_runner=_fail_above(600))
    ids, values = _embeddings(tmp_path / "small")
    normal_ids, normal = _embeddings(tmp_path / "normal")
    assert ids == normal_ids and len(ids) == 600
    assert np.abs(values - normal).max() < 1e-4
    assert report["max_tokens_lowered"][0].startswith("out of memory at ")
    assert "max_tokens 16384 -> " in report["max_tokens_lowered"][0]
    # Each lowering starts where the one before left off, in later chunks too, and the report says where it ended.
    steps = [tuple(map(int, note.split("max_tokens ")[1].split(" -> "))) for note in report["max_tokens_lowered"]]
    assert all(after[0] == before[1] for before, after in zip(steps, steps[1:]))
    assert report["batching"]["max_tokens"] == steps[-1][1] <= 600
    assert report["rows_error"] == 0


def test_a_row_that_never_fits_goes_to_errors_as_oom(sms_parquet, tiny_embed, tmp_path):
    report = run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"), on_runner=_fail_above(40))
    assert report["errors_by_reason"]["oom"] > 0
    assert report["rows_ok"] + report["errors_by_reason"]["oom"] == 600
    errors = ds.dataset(str(tmp_path / "out" / "_errors"), format="parquet").to_table().to_pylist()
    assert all(e["reason"] == "oom" and "out of memory" in e["message"] for e in errors)


def test_one_poisonous_row_costs_only_that_row():
    def run(rows):
        if [13] in rows:
            raise IndexError("index out of range in self")
        return np.ones((len(rows), 2), dtype=np.float32)

    outcome = run_resilient(run, [[i] for i in range(32)])
    assert outcome.failed == {13: ("model_error", "IndexError: index out of range in self")}
    assert outcome.oom_tokens is None and outcome.results[12].tolist() == [1, 1]


def test_a_result_holding_nan_or_infinity_is_that_rows_error():
    def run(rows):
        values = [np.ones(2, dtype=np.float32) for _ in rows]
        for k, row in enumerate(rows):
            values[k][1] = {3: np.nan, 7: -np.inf}.get(row[0], 1.0)
        return values

    outcome = run_resilient(run, [[i] for i in range(8)])
    assert outcome.failed == {3: ("model_error", NOT_FINITE), 7: ("model_error", NOT_FINITE)}
    assert outcome.results[3] is None and outcome.results[2].tolist() == [1, 1]


def _overflowing_embedder(tiny_embed, folder, word: str):
    """tiny_embed with one token's embedding infinite, as a float16 overflow leaves it: NaN for every row holding
    `word`, and nothing odd for the rest."""
    from transformers import AutoTokenizer, BertModel

    shutil.copytree(tiny_embed, folder)
    model = BertModel.from_pretrained(folder)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(word)] = (
            float("inf")
        )
    model.save_pretrained(folder)
    return folder


def test_rows_whose_output_is_nan_go_to_errors_and_none_is_written(sms_parquet, tiny_embed, tmp_path):
    """A model whose output overflowed on some rows wrote their NaN vectors as embeddings, with no word."""
    model = _overflowing_embedder(tiny_embed, tmp_path / "model", "free")
    report = run_job(_job(sms_parquet, model, tmp_path / "out"))
    ids, values = _embeddings(tmp_path / "out")
    errors = ds.dataset(str(tmp_path / "out" / "_errors"), format="parquet").to_table()
    assert np.isfinite(values).all() and report["rows_ok"] == len(ids)
    assert 0 < errors.num_rows == report["errors_by_reason"]["model_error"] and len(ids) + errors.num_rows == 600
    texts = ds.dataset(str(sms_parquet), format="parquet").to_table(columns=["sms_id", "text"]).to_pylist()
    failed = {str(row["sms_id"]): row["text"] for row in texts}
    assert all("free" in failed[i].lower() for i in errors.column("id").to_pylist())
    assert set(errors.column("message").to_pylist()) == {NOT_FINITE}


def test_a_model_whose_output_is_nan_on_every_row_stops_the_job(sms_parquet, tiny_embed, tmp_path):
    model = _overflowing_embedder(tiny_embed, tmp_path / "model", "[CLS]")  # every row starts with it
    with pytest.raises(ModelError, match="failed on every row of chunk 00000-00000: the model's output for this row"):
        run_job(_job(sms_parquet, model, tmp_path / "out"))


def test_a_model_that_fails_on_everything_stops_the_job(sms_parquet, tiny_embed, tmp_path):
    with pytest.raises(ModelError, match="failed on every row of chunk 00000-00000"):
        run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"), on_runner=_fail_above(0, error=ValueError))


def test_cpu_out_of_memory_is_recognised():
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
