"""`batchinfer export`: a finished folder as one file, refused for an unfinished one, never over a file unasked."""

import json
import os
import shutil
import sys

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import user_job, write_job
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.commands.export import export_folder

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
    # The job id marks the folder's own files, not the user's: the export's own key says who wrote it.
    assert list(single.schema.metadata) == [b"batchinfer.export"]
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
    assert result.exit_code == 1 and "is not a finished job (2/7 chunks done" in result.output
    said = " ".join(result.output.split())
    assert f"finish it (batchinfer run {job}), then export; or export what it holds now with --partial" in said
    assert "--limit" not in said.split("fix:")[1] and not target.exists()
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    target.write_text("mine")
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target)])
    assert result.exit_code == 1 and "exists" in result.output and "--force" in result.output
    assert target.read_text() == "mine"
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target), "--force"])
    assert result.exit_code == 1 and "cannot tell that an export wrote it" in result.output, result.output
    assert target.read_text() == "mine"  # --force replaces an export's file only
    # a path ending in / names a folder: refused, not written as a file of that name
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-f", "csv", "-o", f"{tmp_path / 'csv'}/"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "so it names a folder" in said and f"-o {tmp_path / 'csv'}.csv" in said, said
    assert not (tmp_path / "csv").exists()
    target.unlink()
    assert runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target)]).exit_code == 0
    assert runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target), "--force"]).exit_code == 0
    assert pq.read_table(target).num_rows == 600 and not list(tmp_path.glob(".tmp-*"))
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-f", "xml", "-o", str(tmp_path / "x")])
    assert result.exit_code == 1 and "not one of parquet, jsonl, csv" in result.output
    # A marker of another job in the finished folder: named as such (it was blamed on a missing _SUCCESS).
    marker = tmp_path / "out" / "_done" / "00000-00000.json"
    ours = marker.read_text()
    marker.write_text(ours.replace('"job_id": "', '"job_id": "other-'))
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(tmp_path / "mixed.parquet")])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "holds completion markers that are not this job's: _done/00000-00000.json" in said
    assert "_SUCCESS" not in said and not (tmp_path / "mixed.parquet").exists()
    marker.write_text(ours)
    # A chunk's marker removed after the run: the _SUCCESS stays, but the folder no longer says it holds the rows.
    (tmp_path / "out" / "_done" / "00000-00001.json").unlink()
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(tmp_path / "less.parquet")])
    # 7 chunks: the --limit 150 trial cut the second at 50 rows, and the full run ran its other 50 as a piece
    assert result.exit_code == 1 and "is not a finished job (6/7 chunks done" in result.output, result.output
    assert "(complete)" not in runner.invoke(app, ["status", str(tmp_path / "out")]).output
    assert not (tmp_path / "less.parquet").exists()


def test_partial_exports_what_a_trial_holds_and_never_passes_for_a_finished_export(tmp_path, sms_parquet, tiny_embed):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "--limit", "150", "-q"]).exit_code == 0
    target = tmp_path / "trial.parquet"
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target), "--partial"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"wrote 150 rows to {target}; a partial export: the 2/7 chunks the folder finished" in said
    table = pq.read_table(target)
    assert table.column("sms_id").to_pylist() == pq.read_table(sms_parquet).column("sms_id").to_pylist()[:150]
    assert table.schema.metadata[b"batchinfer.export.partial"] == b"2/7 chunks"
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(target), "--force", "--partial"])
    assert result.exit_code == 0 and "a partial export" not in result.output  # a finished folder: the whole job
    assert (
        pq.read_table(target).num_rows == 600 and b"batchinfer.export.partial" not in pq.read_metadata(target).metadata
    )


def test_export_checks_the_parts_as_a_run_opens_them(tmp_path, sms_parquet, tiny_embed):
    """A finished folder that lost a part, holds a foreign file or a part cut short at a part's name, is refused
    (a run would redo those chunks) instead of exported short; a rerun mends it and the export then holds all."""
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    part = "part-00001-00000.parquet"
    other = pq.read_table(tmp_path / "out" / part)
    damages = {
        "is missing": lambda path: path.unlink(),
        "is not this job's file": lambda path: pq.write_table(other.replace_schema_metadata(None), path),
        "is not a whole Parquet file": lambda path: path.write_bytes(path.read_bytes()[:-200]),
        "holds 40 rows where its chunk committed 100": lambda path: pq.write_table(other.slice(0, 40), path),
    }
    for problem, damage in damages.items():
        folder = tmp_path / problem.replace(" ", "-").replace("'", "")
        shutil.copytree(tmp_path / "out", folder)
        damage(folder / part)
        target = tmp_path / f"{folder.name}.parquet"
        result = runner.invoke(app, ["export", str(folder), "-o", str(target)])
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and f"lost rows of 1 finished chunk(s): {part} {problem}" in said, said
        assert "job.yaml: it runs those chunks again; then export" in said
        assert not target.exists()
    mended = tmp_path / "is-missing"
    assert runner.invoke(app, ["run", str(job), "--output", str(mended), "-q"]).exit_code == 0
    result = runner.invoke(app, ["export", str(mended), "-o", str(tmp_path / "all.parquet")])
    assert result.exit_code == 0 and "wrote 600 rows" in result.output, result.output


def test_export_never_writes_inside_an_output_folder_and_removes_only_its_own_stale_temp(
    tmp_path, sms_parquet, tiny_embed, monkeypatch
):
    job = write_job(tmp_path, user_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    out = tmp_path / "out"
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "_lock"}
    (tmp_path / "link").symlink_to(out)
    for target in (
        out / "all.parquet",
        out / "part-00000-00000.parquet",
        out / "_batchinfer.json",
        out / "_done" / "x",
    ):
        for force in ([], ["--force"]):
            result = runner.invoke(app, ["export", str(out), "-o", str(target), *force])
            said = " ".join(result.output.split())
            assert result.exit_code == 1 and "a batchinfer output folder: the folder's readers" in said, said
    result = runner.invoke(app, ["export", str(out), "-o", str(tmp_path / "link" / "all.jsonl"), "-f", "jsonl"])
    assert result.exit_code == 1 and "lies inside" in result.output  # a link into the folder leads inside it
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "_lock"} == before
    assert runner.invoke(app, ["status", str(out)]).exit_code == 0
    # An export killed (kill -9) between its temporary file's fsync and the rename leaves that file behind.
    monkeypatch.setattr(os, "replace", lambda *a: sys.exit(137))
    with pytest.raises(SystemExit):
        export_folder(str(out), "csv", tmp_path / "all.csv", force=True)
    monkeypatch.undo()
    [stale] = tmp_path.glob(".tmp-export-*-all.csv")
    others = [tmp_path / ".tmp-0123abcd-all.csv", tmp_path / ".tmp-export-0123abcd-other.csv"]
    others += [tmp_path / ".tmp-export-mine-all.csv"]  # not its own to remove: other targets, other patterns
    for path in others:
        path.write_text("half")
    result = runner.invoke(app, ["export", str(out), "-f", "csv", "-o", str(tmp_path / "all.csv")])
    assert result.exit_code == 0, result.output
    assert not stale.exists() and all(p.read_text() == "half" for p in others)


def test_a_partial_export_before_any_chunk_says_none_has_finished(tmp_path):
    from batchinfer.output.checkpoint import Checkpoint

    with Checkpoint.open(tmp_path / "out") as out:  # a run that has not finished its first chunk
        out.start({}, restart=False, command="batchinfer run job.yaml", extent={"chunks": 6, "rows": 600})
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(tmp_path / "x.parquet"), "--partial"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "no chunk has finished yet (0/6 chunks done)" in said, said
    assert "holds no result rows" not in said and "resume it: batchinfer run job.yaml" in said


@pytest.mark.parametrize("command", ["status", "export"])
def test_a_folder_that_does_not_exist_is_said_to_not_exist(tmp_path, command):
    words = [command, str(tmp_path / "no-such-out")] + (["-o", str(tmp_path / "x.csv")] if command == "export" else [])
    result = runner.invoke(app, words)
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and f"{tmp_path / 'no-such-out'} does not exist (no such folder)" in said, said
    assert "holds no batchinfer run" not in said and not (tmp_path / "no-such-out").exists()
    (tmp_path / "empty").mkdir()  # a folder there, but no run in it
    result = runner.invoke(app, [command, str(tmp_path / "empty")] + words[2:])
    assert result.exit_code == 1 and "holds no batchinfer run" in result.output


def test_a_bucket_that_does_not_exist_is_said_to_not_exist(s3):
    for words in (["status", "s3://no-such-bucket-here/out"], ["export", "s3://no-such-bucket-here/out", "-o", "x"]):
        result = runner.invoke(app, words)
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "s3://no-such-bucket-here/out" in said and "does not exist" in said, said
        assert "holds no batchinfer run" not in said


def test_export_says_how_many_rows_are_in_errors_and_not_in_the_file(tmp_path, tiny_embed):
    """It said 'wrote 4 rows' of a folder of 7 rows, 3 in _errors/, and no more."""
    import pyarrow as pa

    (tmp_path / "in").mkdir()
    texts = ["a fine text", "", "another", "   ", "more", "", "last"]
    pq.write_table(
        pa.table({"sms_id": list(range(7)), "text": texts, "label": ["x"] * 7}), tmp_path / "in" / "a.parquet"
    )
    job = write_job(tmp_path, user_job(tmp_path / "in", tiny_embed, tmp_path / "out"))
    assert runner.invoke(app, ["run", str(job), "-q"]).exit_code == 0
    said = runner.invoke(app, ["export", str(tmp_path / "out"), "-o", str(tmp_path / "all.parquet")]).output
    assert f"wrote 4 rows to {tmp_path / 'all.parquet'}; 3 rows in error are not in it" in said.replace("\n", " ")
    assert f"{tmp_path / 'out'}/_errors/" in said.replace("\n", "")
