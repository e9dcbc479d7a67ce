"""One chunk task, load then run, on a tiny model: which rows reach the model, how they are batched, what
the part and error files hold and what the record counts. A stand-in writer keeps the tables it is given."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_job

from batchinfer.batching.budget import Batching
from batchinfer.control import Interrupted, StopFlag
from batchinfer.errors import InputError
from batchinfer.execution.chunk_task import TaskInputs, id_text, unreadable
from batchinfer.job.plan import Work, plan_chunks
from batchinfer.sources import discover_shards, read_spec

BAD = {2: "null_text", 5: "empty_text", 8: "too_long"}  # offsets of the rows that never reach the model


class Writer:
    def __init__(self):
        self.chunks: dict[str, tuple[pa.Table, pa.Table | None]] = {}

    def write_chunk(self, chunk_name, results, errors):
        self.chunks[chunk_name] = (results, errors)


@pytest.fixture
def chunk_task(tmp_path, sms_table, tiny_embed):
    texts = [" ".join(t.split()[:3]) for t in sms_table.column("text").to_pylist()[:10]]
    texts[2], texts[5], texts[8] = None, "  ", " ".join(sms_table.column("text").to_pylist()[:20])
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(10)], "text": texts}), tmp_path / "rows.parquet")
    job = make_job(
        tmp_path / "rows.parquet",
        tiny_embed,
        tmp_path / "out",
        input__id="id",
        input__keep=None,
        model__max_length=16,
        model__truncation="error",
        batching={"chunk_rows": 10, "max_tokens": 48, "max_rows": 4},
    )
    inputs = discover_shards(job.input, job.columns)
    writer, budget = Writer(), Batching(48, "padded")
    spec = read_spec(job.input, job.columns, inputs.types)
    task = TaskInputs(job, tiny_embed, inputs.shards, spec, writer, budget).task(StopFlag())
    yield task, writer, plan_chunks([10], 10)[0]
    task.close()


def test_load_keeps_bad_rows_from_the_model_and_cuts_the_rest_by_the_budget(chunk_task):
    task, _, chunk = chunk_task
    loaded = task.load(Work(chunk, chunk.name))
    assert {offset: reason for offset, (reason, _) in loaded.prepared.errors.items()} == BAD
    assert loaded.prepared.errors[8][1] == "text is longer than max_length=16 tokens"
    sent = loaded.prepared.rows[loaded.tokens.owners()[loaded.index]]
    assert sorted(sent.tolist()) == [i for i in range(10) if i not in BAD]
    positions = np.concatenate(loaded.batches)
    assert sorted(positions.tolist()) == list(range(len(loaded.index)))  # every item once
    lengths = loaded.tokens.lengths[loaded.index]
    for batch in loaded.batches:
        assert len(batch) <= 4 and len(batch) * lengths[batch].max() <= 48  # max_rows and the token budget
    assert loaded.cut_with == (48, "padded") and loaded.row_ids.tolist() == list(range(10))


def test_run_writes_good_rows_in_order_and_bad_rows_as_errors_and_counts_them(chunk_task):
    task, writer, chunk = chunk_task
    loaded = task.load(Work(chunk, chunk.name))
    seen = []
    result = task.run(loaded, partial=lambda rows, tokens: seen.append((rows, tokens)))
    record = result.record
    results, errors = writer.chunks[chunk.name]
    good = [f"r{i}" for i in range(10) if i not in BAD]
    assert results.column("id").to_pylist() == good and results.column("row").to_pylist() == [int(r[1:]) for r in good]
    assert np.allclose(np.linalg.norm(np.array(results.column("embedding").to_pylist()), axis=1), 1, atol=1e-5)
    assert errors.column("id").to_pylist() == ["r2", "r5", "r8"]
    assert errors.column("reason").to_pylist() == [BAD[2], BAD[5], BAD[8]]
    tokens = int(loaded.tokens.lengths[loaded.index].sum())
    assert (record.rows, record.ok, record.tokens) == (10, 7, tokens)
    assert record.errors == {"null_text": 1, "empty_text": 1, "too_long": 1}
    assert record.padded_tokens >= tokens and result.budget.key == (48, "padded") and result.tuning is None
    assert len(seen) == len(loaded.batches) and seen[-1] == (10, tokens)  # batch by batch, to the whole chunk
    assert [rows for rows, _ in seen] == sorted(rows for rows, _ in seen)


def test_a_retry_reads_only_its_rows_and_keeps_their_place_in_the_shard(chunk_task):
    task, writer, chunk = chunk_task
    loaded = task.load(Work(chunk, f"{chunk.name}-r1", offsets=[1, 2, 7], retry_of=chunk.name))
    assert loaded.row_ids.tolist() == [1, 2, 7] and loaded.table.column("id").to_pylist() == ["r1", "r2", "r7"]
    record = task.run(loaded).record
    results, errors = writer.chunks[f"{chunk.name}-r1"]
    assert results.column("row").to_pylist() == [1, 7] and errors.column("row").to_pylist() == [2]
    assert record.retry_of == chunk.name and (record.rows, record.ok) == (3, 2)


def test_a_stop_before_reading_reads_nothing(chunk_task):
    task, _, chunk = chunk_task
    task.stop.set(2)
    with pytest.raises(Interrupted):
        task.load(Work(chunk, chunk.name))


def test_an_unreadable_chunk_fails_with_its_rows_or_makes_each_row_a_bad_shard_error(chunk_task):
    task, _, chunk = chunk_task
    shard = task.shards[0]
    with pytest.raises(InputError, match=r"rows 0-9 of rows.parquet cannot be read: OSError: torn") as info:
        unreadable(task.job, task.spec.columns, shard, chunk, OSError("torn"))
    assert "on_bad_shard: skip" in info.value.hint
    skipping = task.job.model_copy(update={"input": task.job.input.model_copy(update={"on_bad_shard": "skip"})})
    block = unreadable(skipping, task.spec.columns, shard, chunk, OSError("torn"))
    assert block.table.num_rows == 10 and sorted(block.bad_rows) == list(range(10))
    assert {reason for reason, _ in block.bad_rows.values()} == {"bad_shard"}


def test_ids_in_the_error_table_are_text_as_the_input_gives_them():
    assert id_text(pa.chunked_array([[7, None, 12]])).to_pylist() == ["7", None, "12"]
    assert id_text(pa.chunked_array([[[1, 2], [3]]])).to_pylist() == ["[1, 2]", "[3]"]
    assert id_text(pa.chunked_array([[{"a": "é"}]])).to_pylist() == ['{"a": "é"}']
