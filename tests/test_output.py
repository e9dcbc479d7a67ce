"""The output folder: batchinfer touches only what it can prove it wrote, and commits chunk by chunk."""

import json
import os
import socket
from collections import Counter
from dataclasses import fields

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_job

from batchinfer.errors import OutputError, ResumeError
from batchinfer.execution.driver import run_job
from batchinfer.output.checkpoint import Checkpoint
from batchinfer.output.formats import ParquetOutput
from batchinfer.output.layout import ERROR_SCHEMA
from batchinfer.output.records import ChunkRecord
from batchinfer.output.status import FolderStatus
from batchinfer.storage import LocalFolder

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


def _open(folder, fingerprint=FINGERPRINT, restart=False, inputs=(), **start) -> Checkpoint:
    """A checkpoint opened and started as a run opens it; the caller closes it."""
    checkpoint = Checkpoint.open(folder, inputs=inputs)
    try:
        checkpoint.start(fingerprint, restart, **start)
    except BaseException:
        checkpoint.close()
        raise
    return checkpoint


def _finish(checkpoint: Checkpoint, report: dict) -> None:
    """The end of a run that wrote no format files: the report, and _SUCCESS when it is complete."""
    checkpoint.finish({"device": "cpu", **report}, ParquetOutput(), final=True, idle=False)


def _finished(folder, chunks=("00000-00000", "00000-00001")) -> Checkpoint:
    with _open(folder) as out:
        for name in chunks:
            out.writer().write_chunk(name, pa.table({"row": [1, 2]}), None)
            out.commit(ChunkRecord(name, rows=2, ok=2, errors={}))
        _finish(out, {"rows": 4, "complete": True})
    return out


@pytest.mark.parametrize("restart", [False, True])
def test_another_tools_output_is_refused_untouched(tmp_path, restart):
    folder = _spark_output(tmp_path / "spark")
    before = _snapshot(folder)
    with pytest.raises(OutputError) as info:
        _open(folder, restart=restart)
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
        _open(tmp_path / "out", restart=restart)
    assert "notes.txt" in info.value.message and "part-00009-00000.parquet" in info.value.message
    assert _snapshot(tmp_path / "out") == before


def test_restart_removes_only_its_own_files_and_starts_a_new_job(tmp_path):
    first = _finished(tmp_path / "out")
    leftover = tmp_path / "out" / f".tmp-{first.job_id[:12]}-part-00001-00000.parquet"
    leftover.write_bytes(b"PAR1 half")
    with _open(tmp_path / "out", restart=True) as out:
        assert out.done == {}
    assert out.job_id != first.job_id
    assert sorted(_snapshot(tmp_path / "out")) == ["_batchinfer.json"]


def test_resume_removes_a_leftover_part_without_marker_and_keeps_finished_ones(tmp_path):
    _finished(tmp_path / "out")
    with _open(tmp_path / "out") as first:
        first.writer().write_chunk("00001-00000", pa.table({"row": [9]}), None)  # killed before its marker
    with _open(tmp_path / "out") as out:
        done = out.done
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
            _open(path, restart=True)
    (tmp_path / "data").mkdir()
    shard = tmp_path / "data" / "a.parquet"
    for path in (tmp_path / "data", tmp_path):
        with pytest.raises(OutputError, match="holds the input"):
            _open(path, inputs=(str(shard),))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "home"]


def test_a_refused_resume_leaves_no_lock(tmp_path):
    _finished(tmp_path / "out")
    with pytest.raises(ResumeError, match="model.hash: 'abc' -> 'xyz'"):
        with Checkpoint.open(tmp_path / "out") as out:  # as the driver holds it
            out.start({**FINGERPRINT, "model.hash": "xyz"}, restart=False)
    assert not (tmp_path / "out" / "_lock").exists()


def test_a_job_that_committed_nothing_takes_the_new_settings(tmp_path):
    """A run that failed before its first chunk (a model without the head the task needs) leaves
    nothing that could mix with the corrected job, so the corrected job is not refused."""
    _open(tmp_path / "out").close()
    with _open(tmp_path / "out", {**FINGERPRINT, "model.hash": "fixed"}) as again:
        assert again.done == {}
    assert FolderStatus.read(tmp_path / "out").fingerprint["model.hash"] == "fixed"


def test_lock_is_created_with_its_content_in_one_step(tmp_path, monkeypatch):
    seen = []
    real_link = os.link

    def link(src, dst):
        seen.append(open(src).read())
        return real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    with _open(tmp_path / "out"):
        lock = json.loads((tmp_path / "out" / "_lock").read_text())
        assert lock["pid"] == os.getpid() and lock["host"] == socket.gethostname()
        assert json.loads(seen[0]) == lock  # the file was whole before it had its name
    assert not (tmp_path / "out" / "_lock").exists()


def test_a_lock_that_is_not_batchinfers_is_neither_taken_nor_removed(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_lock").write_text("held by my own script")
    with pytest.raises(OutputError, match="is not a batchinfer lock"):
        _open(tmp_path / "out")
    assert (tmp_path / "out" / "_lock").read_text() == "held by my own script"


def test_a_damaged_job_file_and_an_old_format_folder_get_messages(tmp_path):
    _finished(tmp_path / "out")
    (tmp_path / "out" / "_batchinfer.json").write_text('{"batchinfer": 2, "job_')
    with pytest.raises(OutputError, match="damaged: .*_batchinfer.json: not JSON") as info:
        _open(tmp_path / "out", restart=True)
    assert "--output" in info.value.hint
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "_manifest.jsonl").write_text('{"fingerprint": {}}\n')
    with pytest.raises(OutputError, match="earlier batchinfer") as info:
        _open(tmp_path / "old", restart=True)
    assert "--output" in info.value.hint and (tmp_path / "old" / "_manifest.jsonl").exists()


def test_the_current_error_file_of_a_chunk_is_its_latest_retry():
    from batchinfer.output.records import current_errors

    def record(name, retry_of=None):
        return ChunkRecord(name, rows=1, ok=1, errors={}, retry_of=retry_of)

    done = {
        "00000-00000": record("00000-00000"),
        "00000-00001": record("00000-00001"),
        "00000-00000-r1": record("00000-00000-r1", "00000-00000"),
        "00000-00000-r2": record("00000-00000-r2", "00000-00000"),
    }
    assert current_errors(done) == {"00000-00000": "00000-00000-r2", "00000-00001": "00000-00001"}


def test_limit_widens_only_over_committed_work_and_an_unreadable_folder_is_refused_by_open(tmp_path):
    _open(tmp_path / "out", {**FINGERPRINT, "limit": 100_000}).close()
    with Checkpoint.open(tmp_path / "out") as out:
        assert out.covering_limit(10) == 10  # interrupted before its first chunk
    with _open(tmp_path / "whole", {**FINGERPRINT, "limit": None}) as whole:  # a run of every row
        whole.commit(ChunkRecord("00000-00000", rows=2, ok=2, errors={}))
    with Checkpoint.open(tmp_path / "whole") as whole:
        assert whole.covering_limit(10) is None
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="cannot create output folder"):  # read once, by open, before any limit
        Checkpoint.open(tmp_path / "afile" / "out")


def test_the_bad_records_file_of_batchinfer_0_2_is_still_its_own(tmp_path):
    from batchinfer.output.layout import BAD_RECORDS

    out = _finished(tmp_path / "out")
    out.writer().write_table(BAD_RECORDS, ERROR_SCHEMA.empty_table())  # as 0.2 wrote it, with the job id
    with _open(tmp_path / "out") as again:  # not refused as foreign
        again.write_skipped_shards([])
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
        _open(tmp_path / "out", restart=restart)
    assert _snapshot(tmp_path / "out") == before


def test_a_finished_chunk_whose_part_or_error_file_vanished_runs_again(tmp_path):
    _finished(tmp_path / "out", chunks=("00000-00000", "00000-00001", "00000-00002"))
    errors = pa.table({"id": ["a"], "source": ["s"], "row": [9], "reason": ["null_text"], "message": ["m"]})
    with _open(tmp_path / "out") as out:
        out.writer().write_chunk("00000-00003", pa.table({"row": [1]}), errors.cast(ERROR_SCHEMA))
        out.commit(ChunkRecord("00000-00003", rows=2, ok=1, errors={"null_text": 1}))
    (tmp_path / "out" / "part-00000-00001.parquet").unlink()
    (tmp_path / "out" / "_errors" / "part-00000-00003.parquet").unlink()
    # Ours, but not what its marker committed (rows lost): redone too; it carries our id, so it may go.
    table = pq.read_table(tmp_path / "out" / "part-00000-00002.parquet")
    pq.write_table(table.slice(0, 1), tmp_path / "out" / "part-00000-00002.parquet")
    with _open(tmp_path / "out") as again:
        done = again.done
    assert list(done) == ["00000-00000"]
    assert again.notes == [
        "part-00000-00001.parquet is missing: chunk 00000-00001 runs again",
        "part-00000-00002.parquet holds 1 rows where its chunk committed 2: chunk 00000-00002 runs again",
        "_errors/part-00000-00003.parquet is missing: chunk 00000-00003 runs again",
    ]
    assert sorted(p.name for p in (tmp_path / "out").rglob("*.parquet")) == ["part-00000-00000.parquet"]
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_a_marker_that_also_holds_the_workers_batching_still_resumes(tmp_path):
    """Markers written before the typed record also held `budget` (the worker's batching): such a folder
    resumes, its chunk done, and nothing runs again."""
    first = _finished(tmp_path / "out", chunks=("00000-00000",))
    old = {
        "job_id": first.job_id,
        "chunk": "00000-00000",
        "rows": 2,
        "ok": 2,
        "errors": {},
        "truncated": 0,
        "tokens": 20,
        "padded_tokens": 24,
        "model_seconds": 0.5,
        "seconds": 0.7,
        "worker": "local",
        "budget": [16384, "padded", "torch", None],
        "finished": 1.7e9,
    }
    (tmp_path / "out" / "_done" / "00000-00000.json").write_text(json.dumps(old))
    with _open(tmp_path / "out") as out:
        assert out.notes == [] and out.done == {
            "00000-00000": ChunkRecord(
                "00000-00000", 2, 2, {}, tokens=20, padded_tokens=24, model_seconds=0.5, seconds=0.7, finished=1.7e9
            )
        }
    assert (tmp_path / "out" / "part-00000-00000.parquet").exists()


def test_a_runs_markers_hold_its_records_alone_and_a_resume_reads_each_once(
    tmp_path, sms_parquet, tiny_embed, monkeypatch
):
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out")
    run_job(job)
    markers = sorted((tmp_path / "out" / "_done").glob("*.json"))
    persisted = {f.name for f in fields(ChunkRecord)} | {"job_id"}
    for marker in markers:  # the worker's batching, a probe's choice and log notes travel beside the record
        assert set(json.loads(marker.read_text())) <= persisted
    reads, real_read = Counter(), LocalFolder.read
    monkeypatch.setattr(LocalFolder, "read", lambda self, name: reads.update([name]) or real_read(self, name))
    report = run_job(job, limit=250)  # a limit asks what the folder covers: from the one read of the open
    assert report["complete"] and report["rows"] == 600  # the folder covers every row: nothing left to do
    assert {m.relative_to(tmp_path / "out").as_posix(): 1 for m in markers} == {
        name: count for name, count in reads.items() if name.startswith("_done/")
    }


def test_a_format_writes_only_the_files_its_job_declared(tmp_path):
    """What a job writes beside its parts is named in the job record before it is written, so a later run can
    prove the file is the job's; a name it did not declare is never written."""
    from batchinfer.output.formats import RESULTS_JSONL, DeclaredFiles, JsonlOutput

    with _open(tmp_path / "out", files=JsonlOutput.files) as out:
        out.writer().write_chunk("00000-00000", pa.table({"row": [0, 1], "label": ["a", "b"]}), None)
        out.commit(ChunkRecord("00000-00000", rows=2, ok=2, errors={}))
        files = DeclaredFiles(out.folder, out.path, out.job)
        assert JsonlOutput().finish(files) == {RESULTS_JSONL: 2}
        with pytest.raises(ValueError, match="not among the files this job declared"):
            files.write("notes.txt", lambda f: f.write(b"x"))
    lines = (tmp_path / "out" / RESULTS_JSONL).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"row": 0, "label": "a"}, {"row": 1, "label": "b"}]
    assert not (tmp_path / "out" / "notes.txt").exists()
    with _open(tmp_path / "out", files=JsonlOutput.files):  # the declared file is the job's: not refused
        pass


@pytest.mark.parametrize(
    "change",
    [{"rows": "500"}, {"ok": None}, {"errors": []}, {"errors": {"too_long": "3"}}, {"rows": True}, {"rows": -5}],
)
def test_a_marker_of_json_with_the_wrong_types_is_damaged_not_a_crash(change):
    from pydantic import ValidationError

    marker = {"chunk": "00000-00000", "rows": 500, "ok": 497, "errors": {"too_long": 3}}
    assert ChunkRecord.from_marker(marker).ok == 497
    with pytest.raises(ValidationError):
        ChunkRecord.from_marker({**marker, **change})


def test_a_label_scoring_marker_written_before_prompt_tokens_gets_them_from_its_computed_tokens():
    """Label scoring's records once held the prefix's figures without `prompt_tokens`; its `tokens` left the
    prefix out, so the rows' prompt tokens in full are those plus the saved ones."""
    marker = {"chunk": "00000-00000", "rows": 30, "ok": 30, "errors": {}, "tokens": 900}
    old = {**marker, "prefix": {"tokens": 40, "rows": 30, "saved_tokens": 1200}}
    assert ChunkRecord.from_marker(old).prefix == {
        "tokens": 40,
        "rows": 30,
        "saved_tokens": 1200,
        "prompt_tokens": 2100,
    }
    new = {**marker, "prefix": {"tokens": 40, "rows": 30, "saved_tokens": 1200, "prompt_tokens": 2500}}
    assert ChunkRecord.from_marker(new).prefix["prompt_tokens"] == 2500
    with pytest.raises(ValueError):  # pydantic's ValidationError
        ChunkRecord.from_marker({**marker, "prefix": {**new["prefix"], "prompt_tokens": "2500"}})


def test_a_cache_inside_the_output_folder_is_refused_before_anything_is_written(
    tmp_path, sms_parquet, tiny_embed, monkeypatch
):
    """Refused rather than ignored: the cache's files would be parts to a Parquet reader of the folder, and
    files no job wrote to the next run."""
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "out" / "cache"))
    with pytest.raises(OutputError, match="cache .* lies inside output.path") as refused:
        run_job(make_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert "set BATCHINFER_CACHE to a folder outside the output" in refused.value.hint
    assert not (tmp_path / "out").exists()
