"""`batchinfer export`: a finished folder as one file, refused for an unfinished one, never over a file unasked."""

import json

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from helpers import user_job, write_job
from typer.testing import CliRunner

from batchinfer.cli import app

runner = CliRunner()


def test_export_writes_every_result_row_in_input_order_in_each_format(tmp_path, sms_parquet, tiny_embed):
    result = runner.invoke(
        app, ["run", str(write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))), "-q"]
    )
    assert result.exit_code == 0, result.output
    whole = ds.dataset(str(tmp_path / "out"), format="parquet").to_table()
    for fmt in ("parquet", "jsonl", "csv"):
        target = tmp_path / f"all.{fmt}"
        result = runner.invoke(app, ["export", str(tmp_path / "out"), "--format", fmt, "-o", str(target)])
        assert result.exit_code == 0 and f"wrote 600 rows to {target}" in result.output, result.output
    single = pq.read_table(tmp_path / "all.parquet")
    assert single.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()
    assert single.schema.metadata is None  # the job id marks the folder's own files, not the user's
    lines = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [line["sms_id"] for line in lines] == whole.column("sms_id").to_pylist()
    csv = pacsv.read_csv(tmp_path / "all.csv")
    assert csv.num_rows == 600 and csv.column("sms_id").to_pylist() == whole.column("sms_id").to_pylist()
    first = json.loads(csv.column("embedding")[0].as_py())  # a list column as JSON text
    assert np.allclose(first, whole.column("embedding")[0].as_py())


def test_export_refuses_an_unfinished_folder_and_an_existing_file(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "--limit", "150", "-q"]).exit_code == 0
    target = tmp_path / "all.parquet"
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target)])
    assert result.exit_code == 1 and "is not a finished job (2/6 chunks done" in result.output
    assert "finish it first" in result.output and not target.exists()
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    target.write_text("mine")
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target)])
    assert result.exit_code == 1 and "exists" in result.output and "--force" in result.output
    assert target.read_text() == "mine"
    assert runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target), "--force"]).exit_code == 0
    assert pq.read_table(target).num_rows == 600 and not list(tmp_path.glob(".tmp-*"))
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-f", "xml", "-o", str(tmp_path / "x")])
    assert result.exit_code == 1 and "not one of parquet, jsonl, csv" in result.output
