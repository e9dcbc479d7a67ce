"""The Python API: the same jobs and results as the command line."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from helpers import write_job

import batchinfer
from batchinfer.cli import app
from batchinfer.errors import ConfigError


def test_run_equals_the_cli(tmp_path, sms_parquet, tiny_embed):
    from typer.testing import CliRunner

    job = write_job(
        tmp_path,
        input={"path": str(sms_parquet), "text": "text", "id": "sms_id"},
        # pinned kernels: with backend auto the probe's timing may pick another backend for each of the two runs
        model={"path": str(tiny_embed), "task": "embed", "max_length": 64, "backend": "torch"},
        batching={"max_tokens": 4096, "strategy": "padded"},
        output={"path": str(tmp_path / "cli")},
    )
    assert CliRunner().invoke(app, ["run", str(job), "-q"]).exit_code == 0
    result = batchinfer.run(job, output__path=str(tmp_path / "api"))
    assert isinstance(result, batchinfer.RunResult) and result.complete and result.rows == result.rows_ok == 600
    saved = json.loads((tmp_path / "api" / "_report.json").read_text())
    assert {k: v for k, v in saved.items() if k != "job_id"} == result.report  # the whole report, as saved
    assert result.seconds == result.report["run"]["seconds"] and result.rows_per_s == result.report["run"]["rows_per_s"]
    with pytest.raises(TypeError, match=r"result.report\['complete'\]"):  # 0.2.0 returned the report: says what to read
        result["complete"]
    cli, api = (ds.dataset(str(tmp_path / n)).to_table() for n in ("cli", "api"))
    assert api.column("sms_id").to_pylist() == cli.column("sms_id").to_pylist()
    assert api.column("embedding").to_pylist() == cli.column("embedding").to_pylist()


def test_infer_keeps_input_order_and_names_rows_that_cannot_run(tmp_path, sms_table, tiny_classify):
    texts = sms_table.column("text").to_pylist()[:50] + ["", "   "]
    # pinned kernels: the two calls below compare labels, which backends of another precision may flip on a tie
    table = batchinfer.infer(
        texts, model=str(tiny_classify), task="classify", model__max_length=64, model__backend="torch"
    )
    assert table.num_rows == 52 and table.column("text").to_pylist() == texts
    assert table.column("error").to_pylist()[:50] == [None] * 50
    assert [e.split(":")[0] for e in table.column("error").to_pylist()[50:]] == ["empty_text", "empty_text"]
    assert table.column("label").to_pylist()[50:] == [None, None]
    frame = pd.DataFrame({"body": texts[:50], "n": range(50)})
    again = batchinfer.infer(
        frame, model=str(tiny_classify), task="classify", text="body", model__max_length=64, model__backend="torch"
    )
    assert again.column("n").to_pylist() == list(range(50))
    assert again.column("label").to_pylist() == table.column("label").to_pylist()[:50]
    scores = np.array(again.column("score").to_pylist())
    assert np.allclose(scores, np.array(table.column("score").to_pylist()[:50]), atol=1e-6)
    assert isinstance(again, pa.Table)


def test_infer_scores_equal_run_s_label_names_included(tmp_path, sms_parquet, sms_table, tiny_classify):
    """infer() goes the chunk's way (RowRun, name_scores): its `scores` name their labels as run's part files do."""
    settings = {"model__max_length": 64, "model__backend": "torch", "output__scores": True}
    data = sms_table.slice(0, 40).select(["sms_id", "text"])
    table = batchinfer.infer(data, model=str(tiny_classify), task="classify", **settings)
    job = write_job(
        tmp_path,
        input={"path": str(sms_parquet), "text": "text", "id": "sms_id"},
        model={"path": str(tiny_classify), "task": "classify"},
        output={"path": str(tmp_path / "run")},
    )
    assert batchinfer.run(job, limit=40, **settings).complete
    ran = ds.dataset(str(tmp_path / "run")).to_table().sort_by("sms_id")
    mine = table.sort_by("sms_id")
    labels = ran.schema.field("scores").metadata
    assert labels and labels == mine.schema.field("scores").metadata  # the config's id2label, in order
    assert mine.column("label").to_pylist() == ran.column("label").to_pylist()
    assert np.allclose(np.array(mine.column("scores").to_pylist()), np.array(ran.column("scores").to_pylist()))


def test_infer_answers_each_item_that_is_no_text_with_its_own_error_in_input_order(tiny_classify):
    """A list holding an int, a dict or a lone surrogate made pyarrow's or Python's error escape infer(), and
    the valid items beside it went unanswered."""
    items = ["Ok lar joking wif u oni", 7, {"a": 1}, "\ud800", None, "", b"bytes", 1.5, ["x"], "Free entry in 2"]
    table = batchinfer.infer(items, model=str(tiny_classify), task="classify", model__backend="torch")
    assert table.num_rows == len(items)
    assert table.column("text").to_pylist() == [items[0], None, None, None, None, "", None, None, None, items[-1]]
    assert table.column("error").to_pylist() == [
        None,
        "not_text: data[1] is int (7), not text",
        "not_text: data[2] is dict ({'a': 1}), not text",
        "bad_utf8: data[3]: not valid Unicode (surrogates not allowed at character 0)",
        "null_text: column 'text' is null",
        "empty_text: text is empty, or only whitespace, invisible or control characters",
        "not_text: data[6] is bytes (b'bytes'), not text",
        "not_text: data[7] is float (1.5), not text",
        "not_text: data[8] is list (['x']), not text",
        None,
    ]
    labels = table.column("label").to_pylist()
    assert labels[0] is not None and labels[-1] is not None and labels[1:-1] == [None] * 8
    alone = batchinfer.infer([items[0], items[-1]], model=str(tiny_classify), task="classify", model__backend="torch")
    assert [labels[0], labels[-1]] == alone.column("label").to_pylist()


def test_infer_never_hides_a_result_behind_an_input_column(sms_table, tiny_classify, tiny_llama):
    texts = sms_table.column("text").to_pylist()[:4]
    table = pa.table({"text": texts, "label": ["spam", "ham", "ham", "ham"]})
    with pytest.raises(ConfigError, match="column 'label' has the name of a result column of task classify"):
        batchinfer.infer(table, model=str(tiny_classify), task="classify")
    generated = batchinfer.infer(
        texts, model=str(tiny_llama), task="generate", generation__max_new_tokens=3, generation__temperature=0.0
    )
    assert generated.column("prompt").to_pylist() == texts
    assert all(isinstance(t, str) for t in generated.column("text").to_pylist())
    assert all(1 <= n <= 3 for n in generated.column("completion_tokens").to_pylist())


def test_infer_names_the_data_not_an_internal_file(tiny_classify):
    from batchinfer.errors import InputError

    frame = pd.DataFrame({"title": ["a"], "body": ["b"]})
    with pytest.raises(InputError) as info:
        batchinfer.infer(frame, model=str(tiny_classify), task="classify")
    assert info.value.message == "data: column 'text' not found; it has: title, body"
    assert "rows.parquet" not in info.value.message + info.value.hint
    with pytest.raises(InputError, match=r"^data: columns 'head', 'tail' not found; it has: title, body$"):
        batchinfer.infer(frame, model=str(tiny_classify), task="classify", text="{head} {tail}")
    with pytest.raises(ConfigError, match="^batchinfer.infer is not a valid job"):
        batchinfer.infer(frame, model=str(tiny_classify), task="classify", text="title", model__max_length=-1)
    assert batchinfer.infer(frame, model=str(tiny_classify), task="classify", text="{title}. {body}").num_rows == 1


def test_infer_runs_in_memory_and_writes_no_file(tmp_path, monkeypatch, sms_table, tiny_embed):
    """infer's rows go to the model as a chunk of a run does, from memory: no temporary folder (a temp
    directory that is gone is no matter), nothing written where it runs."""
    import tempfile

    texts = sms_table.column("text").to_pylist()[:20]
    before = batchinfer.infer(texts, model=str(tiny_embed), task="embed", model__max_length=16, model__backend="torch")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    monkeypatch.chdir(tmp_path)
    table = batchinfer.infer(texts, model=str(tiny_embed), task="embed", model__max_length=16, model__backend="torch")
    assert list(tmp_path.iterdir()) == []
    assert table.column_names == ["text", "embedding", "truncated", "error"]
    assert table.column("embedding").to_pylist() == before.column("embedding").to_pylist()
    assert any(table.column("truncated").to_pylist()) and table.column("error").null_count == 20
