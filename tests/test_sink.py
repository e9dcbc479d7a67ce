"""The output folder: batchinfer touches only what it can prove it wrote, and commits chunk by chunk."""

import json
import os
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchinfer.errors import OutputError, ResumeError
from batchinfer.sink import ERROR_SCHEMA, OutputDir, read_state

FINGERPRINT = {"input.path": "in", "model.hash": "abc"}


def _snapshot(folder):
    """Every file below a folder with its bytes: what 'untouched' means."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _spark_output(folder):
    folder.mkdir(parents=True)
    table = pa.table({"x": [1, 2, 3]})
    pq.write_table(table, folder / "part-00000-6f1c2a4e-c000.snappy.parquet")
    pq.write_table(table, folder / "part-00001-6f1c2a4e-c000.snappy.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / "._SUCCESS.crc").write_text("crc")
    return folder


def _finished(folder, chunks=("00000-00000", "00000-00001")) -> OutputDir:
    out = OutputDir(folder)
    out.open(FINGERPRINT, restart=False)
    for name in chunks:
        out.write_chunk(name, pa.table({"row": [1, 2]}), None)
        out.commit({"chunk": name, "rows": 2, "ok": 2, "errors": {}})
    out.write_report({"rows": 4}, success=True)
    out.unlock()
    return out


@pytest.mark.parametrize("restart", [False, True])
def test_another_tools_output_is_refused_untouched(tmp_path, restart):
    folder = _spark_output(tmp_path / "spark")
    before = _snapshot(folder)
    with pytest.raises(OutputError) as info:
        OutputDir(folder).open(FINGERPRINT, restart=restart)
    assert (
        "holds no batchinfer job" in info.value.message
        and "part-00000-6f1c2a4e-c000.snappy.parquet" in info.value.message
    )
    assert "--output" in info.value.hint
    assert _snapshot(folder) == before  # nothing deleted, nothing added (no lock left behind)


@pytest.mark.parametrize("restart", [False, True])
def test_a_foreign_file_in_a_batchinfer_folder_is_refused_untouched(tmp_path, restart):
    _finished(tmp_path / "out")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "out" / "part-00009-00000.parquet")  # our naming, not our job
    (tmp_path / "out" / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path / "out")
    with pytest.raises(OutputError) as info:
        OutputDir(tmp_path / "out").open(FINGERPRINT, restart=restart)
    assert "notes.txt" in info.value.message and "part-00009-00000.parquet" in info.value.message
    assert _snapshot(tmp_path / "out") == before


def test_restart_removes_only_its_own_files_and_starts_a_new_job(tmp_path):
    first = _finished(tmp_path / "out")
    leftover = tmp_path / "out" / f".tmp-{first.job_id[:12]}-part-00001-00000.parquet"
    leftover.write_bytes(b"PAR1 half")
    out = OutputDir(tmp_path / "out")
    assert out.open(FINGERPRINT, restart=True) == {}
    out.unlock()
    assert out.job_id != first.job_id
    assert sorted(_snapshot(tmp_path / "out")) == ["_batchinfer.json"]


def test_resume_removes_a_leftover_part_without_marker_and_keeps_finished_ones(tmp_path):
    first = _finished(tmp_path / "out")
    first.open(FINGERPRINT, restart=False)
    first.write_chunk("00001-00000", pa.table({"row": [9]}), None)  # killed before its marker
    first.unlock()
    out = OutputDir(tmp_path / "out")
    done = out.open(FINGERPRINT, restart=False)
    out.unlock()
    assert list(done) == ["00000-00000", "00000-00001"]
    assert not (tmp_path / "out" / "part-00001-00000.parquet").exists()
    assert (tmp_path / "out" / "part-00000-00001.parquet").exists() and not (tmp_path / "out" / "_SUCCESS").exists()


def test_part_files_carry_the_job_id(tmp_path):
    out = _finished(tmp_path / "out")
    metadata = pq.read_metadata(tmp_path / "out" / "part-00000-00000.parquet").metadata
    assert metadata[b"batchinfer.job_id"] == out.job_id.encode()
    assert json.loads((tmp_path / "out" / "_SUCCESS").read_text())["job_id"] == out.job_id
    assert json.loads((tmp_path / "out" / "_report.json").read_text())["job_id"] == out.job_id


def test_root_home_and_a_folder_holding_the_input_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    for path, said in [("/", "the root folder"), (tmp_path / "home", "your home folder")]:
        with pytest.raises(OutputError, match=said):
            OutputDir(path).open(FINGERPRINT, restart=True)
    (tmp_path / "data").mkdir()
    shard = tmp_path / "data" / "a.parquet"
    for path in (tmp_path / "data", tmp_path):
        with pytest.raises(OutputError, match="holds the input"):
            OutputDir(path).open(FINGERPRINT, restart=False, inputs=(str(shard),))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "home"]


def test_a_refused_resume_leaves_no_lock(tmp_path):
    _finished(tmp_path / "out")
    with pytest.raises(ResumeError, match="model.hash: 'abc' -> 'xyz'"):
        OutputDir(tmp_path / "out").open({**FINGERPRINT, "model.hash": "xyz"}, restart=False)
    assert not (tmp_path / "out" / "_lock").exists()


def test_a_job_that_committed_nothing_takes_the_new_settings(tmp_path):
    """A run that failed before its first chunk (a model without the head the task needs) leaves
    nothing that could mix with the corrected job, so the corrected job is not refused."""
    out = OutputDir(tmp_path / "out")
    out.open(FINGERPRINT, restart=False)
    out.unlock()
    again = OutputDir(tmp_path / "out")
    assert again.open({**FINGERPRINT, "model.hash": "fixed"}, restart=False) == {}
    again.unlock()
    assert read_state(tmp_path / "out")[0].fingerprint()["model.hash"] == "fixed"


def test_lock_is_created_with_its_content_in_one_step(tmp_path, monkeypatch):
    seen = []
    real_link = os.link

    def link(src, dst):
        seen.append(open(src).read())
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    out = OutputDir(tmp_path / "out")
    out.open(FINGERPRINT, restart=False)
    lock = json.loads((tmp_path / "out" / "_lock").read_text())
    assert lock["pid"] == os.getpid() and lock["host"] == socket.gethostname()
    assert json.loads(seen[0]) == lock  # the file was whole before it had its name
    out.unlock()
    assert not (tmp_path / "out" / "_lock").exists()


def test_a_lock_that_is_not_batchinfers_is_neither_taken_nor_removed(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_lock").write_text("held by my own script")
    with pytest.raises(OutputError, match="is not a batchinfer lock"):
        OutputDir(tmp_path / "out").open(FINGERPRINT, restart=False)
    assert (tmp_path / "out" / "_lock").read_text() == "held by my own script"


def test_a_damaged_job_file_and_an_old_format_folder_get_messages(tmp_path):
    _finished(tmp_path / "out")
    (tmp_path / "out" / "_batchinfer.json").write_text('{"batchinfer": 2, "job_')
    with pytest.raises(OutputError, match="_batchinfer.json is damaged") as info:
        OutputDir(tmp_path / "out").open(FINGERPRINT, restart=True)
    assert "--output" in info.value.hint
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "_manifest.jsonl").write_text('{"fingerprint": {}}\n')
    with pytest.raises(OutputError, match="earlier batchinfer") as info:
        OutputDir(tmp_path / "old").open(FINGERPRINT, restart=True)
    assert "--output" in info.value.hint and (tmp_path / "old" / "_manifest.jsonl").exists()


def test_the_current_error_file_of_a_chunk_is_its_latest_retry():
    from batchinfer.sink import current_errors

    done = {
        "00000-00000": {},
        "00000-00001": {},
        "00000-00000-r1": {"retry_of": "00000-00000"},
        "00000-00000-r2": {"retry_of": "00000-00000"},
    }
    assert current_errors(done) == {"00000-00000": "00000-00000-r2", "00000-00001": "00000-00001"}


def test_limit_widens_only_over_committed_work_and_an_unreadable_folder_is_left_to_open(tmp_path):
    out = OutputDir(tmp_path / "out")
    out.open({**FINGERPRINT, "limit": 100_000}, restart=False)
    out.unlock()
    assert OutputDir(tmp_path / "out").covering_limit(10) == 10  # interrupted before its first chunk
    whole = OutputDir(tmp_path / "whole")
    whole.open({**FINGERPRINT, "limit": None}, restart=False)  # a run of every row
    whole.commit({"chunk": "00000-00000", "rows": 2, "ok": 2, "errors": {}})
    whole.unlock()
    assert OutputDir(tmp_path / "whole").covering_limit(10) is None
    (tmp_path / "afile").write_text("x")
    assert OutputDir(tmp_path / "afile" / "out").covering_limit(10) == 10


def test_the_bad_records_file_of_batchinfer_0_2_is_still_its_own(tmp_path):
    from batchinfer.sink import BAD_RECORDS, ERROR_SCHEMA

    out = _finished(tmp_path / "out")
    out._write_table(BAD_RECORDS, ERROR_SCHEMA.empty_table())  # as 0.2 wrote it, with the job id
    again = OutputDir(tmp_path / "out")
    again.open(FINGERPRINT, restart=False)  # not refused as foreign
    again.write_skipped_shards([])
    again.unlock()
    assert not (tmp_path / "out" / BAD_RECORDS).exists()


def test_an_input_at_the_output_url_with_or_without_a_slash_is_refused():
    from batchinfer.storage import refuse_location

    for output, path in [("s3://b/out/", "s3://b/out"), ("s3://b/out", "s3://b/out/"), ("s3://b/out", "s3://b/out/x")]:
        with pytest.raises(OutputError, match="holds the input"):
            refuse_location(output, (path,))
    refuse_location("s3://b/out", ("s3://b/out-old/x",))  # a sibling is fine


@pytest.mark.parametrize("restart", [False, True])
def test_a_foreign_file_at_a_committed_parts_name_is_refused_untouched(tmp_path, restart):
    """A part's name is not proof: only the job id in its footer is (--restart deleted such a file)."""
    _finished(tmp_path / "out")
    pq.write_table(pa.table({"row": [7, 8]}), tmp_path / "out" / "part-00000-00001.parquet")  # someone else's
    before = _snapshot(tmp_path / "out")
    with pytest.raises(OutputError, match="holds files that are not this job's: part-00000-00001.parquet"):
        OutputDir(tmp_path / "out").open(FINGERPRINT, restart=restart)
    assert _snapshot(tmp_path / "out") == before


def test_a_finished_chunk_whose_part_or_error_file_vanished_runs_again(tmp_path):
    out = _finished(tmp_path / "out", chunks=("00000-00000", "00000-00001", "00000-00002"))
    errors = pa.table({"id": ["a"], "source": ["s"], "row": [9], "reason": ["null_text"], "message": ["m"]})
    out = OutputDir(tmp_path / "out")
    out.open(FINGERPRINT, restart=False)
    out.write_chunk("00000-00003", pa.table({"row": [1]}), errors.cast(ERROR_SCHEMA))
    out.commit({"chunk": "00000-00003", "rows": 2, "ok": 1, "errors": {"null_text": 1}})
    out.unlock()
    (tmp_path / "out" / "part-00000-00001.parquet").unlink()
    (tmp_path / "out" / "_errors" / "part-00000-00003.parquet").unlink()
    # Ours, but not what its marker committed (rows lost): redone too; it carries our id, so it may go.
    table = pq.read_table(tmp_path / "out" / "part-00000-00002.parquet")
    pq.write_table(table.slice(0, 1), tmp_path / "out" / "part-00000-00002.parquet")
    again = OutputDir(tmp_path / "out")
    done = again.open(FINGERPRINT, restart=False)
    assert list(done) == ["00000-00000"]
    assert again.notes == [
        "part-00000-00001.parquet is missing: chunk 00000-00001 runs again",
        "part-00000-00002.parquet holds 1 rows where its chunk committed 2: chunk 00000-00002 runs again",
        "_errors/part-00000-00003.parquet is missing: chunk 00000-00003 runs again",
    ]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*.parquet")) == ["part-00000-00000.parquet"]
    assert not (tmp_path / "out" / "_SUCCESS").exists()
