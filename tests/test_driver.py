"""End to end through the engine: outputs, agreement with trusted tools, batching invariance, resume."""

import json
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from helpers import Crash, CrashAfterChunks, done_chunks, leftover_tmp
from helpers import make_job as _job
from helpers import read_output as _read
from helpers import vectors as _vectors

from batchinfer.commands.export import export_folder
from batchinfer.control import Quiet
from batchinfer.errors import OutputError, ResumeError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job
from batchinfer.output.records import error_counts
from batchinfer.output.status import FolderStatus


def test_embed_output_schema_order_and_report(sms_parquet, sms_table, tiny_embed, tmp_path):
    report = run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"))
    table = _read(tmp_path / "out")
    assert table.column_names == ["source", "row", "sms_id", "gold", "embedding", "truncated"]
    assert str(table.schema.field("embedding").type) == "fixed_size_list<element: float>[32]"
    assert table.column("sms_id").to_pylist() == sms_table.column("sms_id").to_pylist()[:600]  # input order
    assert table.column("source").to_pylist()[199:201] == ["part-0.parquet", "part-1.parquet"]
    assert np.allclose(np.linalg.norm(_vectors(table, "embedding"), axis=1), 1.0, atol=1e-5)  # Normalize module
    assert report["complete"] and report["rows"] == report["rows_ok"] == 600 and report["chunks_total"] == 6
    assert 0 < report["padding_efficiency"] <= 1 and report["tokens"] > 0
    assert (tmp_path / "out" / "_SUCCESS").exists() and (tmp_path / "out" / "_report.json").exists()


@pytest.mark.parametrize(
    "task,column,model",
    [
        ("embed", "embedding", "tiny_embed"),
        ("embed", "embedding", "tiny_embed_cls"),
        ("classify", "scores", "tiny_classify"),
    ],
)
def test_batching_does_not_change_results(sms_parquet, tmp_path, request, task, column, model):
    """Each row's result equals the result of running that row alone."""
    model = request.getfixturevalue(model)
    scores = task == "classify"
    rows = sms_parquet / "part-0.parquet"  # 200 rows: 200 runs of one row each
    run_job(_job(rows, model, tmp_path / "alone", task, batching__max_rows=1, output__scores=scores))
    run_job(_job(rows, model, tmp_path / "batched", task, batching__max_tokens=4096, output__scores=scores))
    alone, batched = _vectors(_read(tmp_path / "alone"), column), _vectors(_read(tmp_path / "batched"), column)
    assert np.abs(alone - batched).max() < 1e-4


def test_classify_agrees_with_transformers_pipeline(sms_table, sms_parquet, tiny_classify, tmp_path):
    from transformers import pipeline

    run_job(_job(sms_parquet, tiny_classify, tmp_path / "out", "classify"))
    table = _read(tmp_path / "out")
    texts = sms_table.column("text").to_pylist()[:600]
    expected = pipeline("text-classification", model=str(tiny_classify), device="cpu")(
        texts, batch_size=16, truncation=True, max_length=128
    )
    assert table.column("label").to_pylist() == [e["label"] for e in expected]
    assert np.allclose(table.column("score").to_numpy(), [e["score"] for e in expected], atol=1e-5)
    labels = dict(zip(table.column("label_id").to_pylist(), table.column("label").to_pylist()))
    assert all({0: "negative", 1: "neutral", 2: "positive"}[k] == v for k, v in labels.items())


def test_a_tokenizer_that_truncates_on_the_left_keeps_each_rows_end(sms_table, tiny_classify, tmp_path):
    """truncation_side: left (tokenizer_config.json) cuts as transformers cuts: the scores of long rows are those
    of their last tokens, and the rows are flagged truncated."""
    import json

    import pyarrow.parquet as pq
    from transformers import pipeline

    model = tmp_path / "left"
    shutil.copytree(tiny_classify, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "truncation_side": "left"}))
    rows = sms_table.slice(0, 40)
    pq.write_table(rows, tmp_path / "rows.parquet")
    run_job(_job(tmp_path / "rows.parquet", model, tmp_path / "out", "classify", model__max_length=12))
    table = _read(tmp_path / "out").sort_by("row")
    expected = pipeline("text-classification", model=str(model), device="cpu")(
        rows.column("text").to_pylist(), truncation=True, max_length=12
    )
    assert np.allclose(table.column("score").to_numpy(), [e["score"] for e in expected], atol=1e-5)
    assert all(table.column("truncated").to_pylist()[:5])


@pytest.mark.parametrize("model", ["tiny_embed", "tiny_embed_cls", "minilm_path"])
def test_embeddings_agree_with_sentence_transformers(sms_table, tmp_path, request, model):
    """Cosine >= 0.9999 against sentence-transformers encode, for the real MiniLM too."""
    import pyarrow.parquet as pq
    from sentence_transformers import SentenceTransformer

    model = request.getfixturevalue(model)
    rows = sms_table.slice(1000, 300)
    pq.write_table(rows, tmp_path / "rows.parquet")
    run_job(_job(tmp_path / "rows.parquet", model, tmp_path / "out", model__max_length=128))
    ours = _vectors(_read(tmp_path / "out"), "embedding")
    st = SentenceTransformer(str(model), device="cpu")
    st.max_seq_length = 128
    theirs = st.encode(rows.column("text").to_pylist(), batch_size=32, convert_to_numpy=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999


class _PassesAtCommit(Quiet):
    """Counts forward passes, and notes the count each time a chunk is committed."""

    def __init__(self):
        self.calls, self.at_commit = 0, []

    def count(self, runner):
        original = runner.run

        def run(ids):
            self.calls += 1
            return original(ids)

        runner.run = run
        return runner

    def start(self, total_rows, done_rows, since):
        pass

    def advance(self, rows, tokens):
        self.at_commit.append(self.calls)

    def log(self, message):
        pass


def _crash_after(batches: int):
    """A runner wrapper that dies after `batches` forward passes, as a killed process would."""

    def wrap(runner):
        original, calls = runner.run, [0]

        def run(ids):
            calls[0] += 1
            if calls[0] > batches:
                raise Crash()
            return original(ids)

        runner.run = run
        return runner

    return wrap


@pytest.mark.parametrize("crash_at", [0, 10, 40])  # forward passes before the crash
def test_crash_then_resume_equals_uninterrupted_run(sms_parquet, sms_table, tiny_embed, tmp_path, crash_at):
    passes = _PassesAtCommit()
    run_job(
        _job(sms_parquet, tiny_embed, tmp_path / "whole", batching__max_rows=16),
        on_runner=passes.count,
        progress=passes,
    )
    job = _job(sms_parquet, tiny_embed, tmp_path / "out", batching__max_rows=16)
    with pytest.raises(Crash):
        run_job(job, on_runner=_crash_after(crash_at))
    assert not (tmp_path / "out" / "_SUCCESS").exists()
    finished = done_chunks(tmp_path / "out")
    assert finished == sum(1 for n in passes.at_commit if n <= crash_at)  # every chunk whose passes all ran
    # A half-written temporary file, and a whole part of the next chunk whose marker was never written,
    # as kills leave them.
    leftover_tmp(tmp_path / "out", "part-00002-00001.parquet").write_bytes(b"PAR1 half")
    if finished:
        chunk = [f"{s:05d}-{c:05d}" for s in range(3) for c in range(2)][finished]
        shutil.copy(tmp_path / "out" / "part-00000-00000.parquet", tmp_path / "out" / f"part-{chunk}.parquet")
    report = run_job(job)
    assert report["complete"] and report["run"]["rows"] == 600 - 100 * finished
    resumed, whole = _read(tmp_path / "out"), _read(tmp_path / "whole")
    ids = resumed.column("sms_id").to_pylist()
    assert ids == sms_table.column("sms_id").to_pylist()[:600]  # exact id set, no duplicate, in order
    assert np.array_equal(_vectors(resumed, "embedding"), _vectors(whole, "embedding"))
    assert not list((tmp_path / "out").glob(".tmp-*"))


def test_resume_of_finished_job_does_nothing(sms_parquet, tiny_embed, tmp_path):
    job = _job(sms_parquet, tiny_embed, tmp_path / "out")
    run_job(job)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*")}
    report = run_job(job)
    assert report["complete"] and report["run"]["rows"] == 0 and report["rows"] == 600
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("part-*")}


def test_changed_job_refuses_to_resume_then_restart(sms_parquet, tiny_embed, tiny_embed_cls, tmp_path):
    run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"))
    with pytest.raises(ResumeError) as info:
        run_job(_job(sms_parquet, tiny_embed_cls, tmp_path / "out", model__max_length=64))
    assert "model.hash" in info.value.message and "model.max_length: 128 -> 64" in info.value.message
    assert "--restart" in info.value.hint
    # Batching limits do not change results, so they may change on resume.
    run_job(_job(sms_parquet, tiny_embed, tmp_path / "out", batching__max_tokens=999))
    report = run_job(_job(sms_parquet, tiny_embed_cls, tmp_path / "out", model__max_length=64), restart=True)
    assert report["run"]["rows"] == 600


def test_template_and_row_errors(tmp_path, tiny_embed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pa.table({"title": ["A", None, "C", "D"], "body": ["one", "two", "   ", "four"], "k": [1, 2, 3, 4]})
    pq.write_table(rows, tmp_path / "t.parquet")
    job = validate_job(
        {
            "input": {"path": str(tmp_path / "t.parquet"), "text": "{title}: {body}", "keep": ["k"]},
            "model": {"path": str(tiny_embed), "task": "embed"},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    report = run_job(job)
    assert _read(tmp_path / "out").column("k").to_pylist() == [1, 3, 4]  # "C:    " is not blank
    errors = ds.dataset(str(tmp_path / "out" / "_errors"), format="parquet").to_table().to_pylist()
    assert errors == [
        {"id": None, "source": "t.parquet", "row": 1, "reason": "null_text", "message": "column 'title' is null"}
    ]
    assert report["errors_by_reason"] == {"null_text": 1} and report["rows"] == 4


def test_truncation_flag_and_error_mode(tmp_path, tiny_embed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["short", "word " * 300]}), tmp_path / "t.parquet")
    base = {
        "input": {"path": str(tmp_path / "t.parquet"), "text": "text"},
        "model": {"path": str(tiny_embed), "task": "embed", "max_length": 32},
    }
    run_job(validate_job({**base, "output": {"path": str(tmp_path / "flag")}}))
    assert _read(tmp_path / "flag").column("truncated").to_pylist() == [False, True]
    base["model"]["truncation"] = "error"
    report = run_job(validate_job({**base, "output": {"path": str(tmp_path / "err")}}))
    assert _read(tmp_path / "err").num_rows == 1 and report["errors_by_reason"] == {"too_long": 1}


class Recorder(Quiet):
    """A progress display that remembers what it was told."""

    def __init__(self):
        self.started, self.rows = None, 0

    def start(self, total: int, done: int, since: float) -> None:
        self.started = (total, done)

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows

    def log(self, message: str) -> None:
        pass

    def stop(self) -> None:
        pass


def test_retry_errors_after_raising_max_length(sms_parquet, sms_table, tiny_embed, tiny_embed_cls, tmp_path):
    short = _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=24, model__truncation="error")
    first = run_job(short)
    too_long = first["errors_by_reason"]["too_long"]
    assert 0 < too_long < 600 and first["rows_ok"] == 600 - too_long
    with pytest.raises(ResumeError, match="model.hash"):  # only what decides whether a row fits may change
        run_job(_job(sms_parquet, tiny_embed_cls, tmp_path / "out", model__max_length=128), retry_errors=True)
    middle = run_job(
        _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=40, model__truncation="error"),
        retry_errors=True,
    )
    still = middle["errors_by_reason"]["too_long"]
    assert 0 < still < too_long
    bar = Recorder()
    retried = run_job(
        _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=128, model__truncation="error"),
        retry_errors=True,
        progress=bar,
    )
    assert bar.started == (still, 0) and bar.rows == still  # only error rows run: they alone are counted
    assert retried["rows_ok"] == 600 and retried["errors_by_reason"] == {} and retried["rows"] == 600
    # the whole job's rows are its rows: those two retry passes ran again are counted once (they were 600 + more)
    assert retried["job"]["runs"] == 3 and retried["job"]["rows"] == 600
    assert not list((tmp_path / "out" / "_errors").glob("*.parquet"))
    table = _read(tmp_path / "out")
    assert sorted(table.column("sms_id").to_pylist()) == sorted(sms_table.column("sms_id").to_pylist()[:600])
    assert list((tmp_path / "out").glob("part-00000-00000-r1.parquet"))
    # An export is in input order: the retried rows among their chunk's (by name, the -r1 parts came first).
    export_folder(str(tmp_path / "out"), "jsonl", tmp_path / "all.jsonl")
    exported = [json.loads(line)["sms_id"] for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert exported == sms_table.column("sms_id").to_pylist()[:600]
    # Nothing left to retry: a second retry changes nothing.
    assert (
        run_job(
            _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=128, model__truncation="error"),
            retry_errors=True,
        )["run"]["rows"]
        == 0
    )


def test_retry_errors_on_an_unfinished_job_is_refused_until_its_own_settings_have_run_every_chunk(
    sms_parquet, tiny_embed, tmp_path
):
    """--retry-errors may change max_length for the rows in _errors/; on a job not finished (a --limit trial, a
    stop) it also ran the chunks not run yet with the new settings, beside those run with the old ones, and the
    folder then said the new settings held for all. Refused now, naming how many chunks and the fix."""
    old = _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=24, model__truncation="error")
    new = _job(sms_parquet, tiny_embed, tmp_path / "out", model__max_length=128, model__truncation="error")
    run_job(old, limit=150, command="batchinfer run job.yaml --limit 150")
    with pytest.raises(ResumeError) as refused:
        run_job(new, retry_errors=True)
    assert "--retry-errors would run the 5 chunk(s) of this job not run yet with changed settings" in str(refused.value)
    assert "model.max_length: 24 -> 128" in str(refused.value) and "beside the 2 run with the old ones" in str(
        refused.value
    )
    assert refused.value.hint.startswith("finish the job with its own settings first (batchinfer run job.yaml)")
    assert run_job(old)["rows"] == 600  # its own settings finish it; then the errors may be retried
    retried = run_job(new, retry_errors=True)
    assert retried["rows"] == 600 and retried["errors_by_reason"] == {}


def test_retry_keeps_rows_that_fail_again_and_survives_a_crash(tmp_path, tiny_embed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["fine", None, "word " * 100, "  ", "also fine", "more " * 100]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet")
    job = {
        "input": {"path": str(tmp_path / "t.parquet"), "text": "text"},
        "model": {"path": str(tiny_embed), "task": "embed", "max_length": 16, "truncation": "error"},
        "batching": {"chunk_rows": 2},  # chunk 0: a null text alone among the errors; chunks 1, 2: a long text each
        "output": {"path": str(tmp_path / "out")},
    }
    assert run_job(validate_job(job))["errors_by_reason"] == {"empty_text": 1, "null_text": 1, "too_long": 2}
    job["model"]["max_length"] = 256
    with pytest.raises(Crash):
        run_job(validate_job(job), retry_errors=True, on_runner=_crash_after(0))
    bar = Recorder()
    report = run_job(validate_job(job), retry_errors=True, progress=bar)
    assert bar.started == (2, 0) and report["run"]["rows"] == 2  # the too_long rows; no setting cures the others
    assert report["errors_by_reason"] == {"empty_text": 1, "null_text": 1} and report["rows_ok"] == 4
    errors = ds.dataset(str(tmp_path / "out" / "_errors"), format="parquet").to_table().to_pylist()
    assert [(e["row"], e["reason"]) for e in errors] == [(1, "null_text"), (3, "empty_text")]
    assert sorted(_read(tmp_path / "out").column("row").to_pylist()) == [0, 2, 4, 5]
    assert not (tmp_path / "out" / "_done" / "00000-00000-r1.json").exists()  # a pass would only fail again


def test_a_retry_beside_input_errors_leaves_a_folder_that_status_export_and_a_resume_read(tmp_path, tiny_embed):
    """A retry pass keeps its chunk's input errors (null, empty text) in its error file without running them;
    its marker counted them in `errors` but not in `rows`, so every later status, export and run refused the
    folder as damaged and told the user to --restart. A marker the earlier batchinfer wrote so is read too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [None, "word " * 100, "fine", "  ", "more " * 100, "also fine"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet")
    job = {
        "input": {"path": str(tmp_path / "t.parquet"), "text": "text"},
        "model": {"path": str(tiny_embed), "task": "embed", "max_length": 16, "truncation": "error"},
        "batching": {"chunk_rows": 2},  # chunk 0: a null text beside a long one; chunk 2: a long text alone
        "output": {"path": str(tmp_path / "out")},
    }
    run_job(validate_job(job))
    job["model"]["max_length"] = 256
    run_job(validate_job(job), retry_errors=True)
    marker = tmp_path / "out" / "_done" / "00000-00000-r1.json"
    written = json.loads(marker.read_text())
    for old in (False, True):  # as this batchinfer writes the marker, then as the earlier one did
        if old:
            marker.write_text(json.dumps({k: v for k, v in written.items() if k != "carried"}))
        state = FolderStatus.of_run(str(tmp_path / "out"))
        assert error_counts(state.done) == {"null_text": 1, "empty_text": 1}
        assert sum(r.ok for r in state.done.values()) == 4
        exported = export_folder(str(tmp_path / "out"), "jsonl", tmp_path / f"all-{old}.jsonl")
        assert (exported.rows, exported.errors) == (4, 2)
        again = run_job(validate_job(job))
        assert again["run"]["rows"] == 0 and (again["rows"], again["rows_ok"]) == (6, 4)
        assert again["errors_by_reason"] == {"empty_text": 1, "null_text": 1}
    # the pass ran 1 row (ok now) and kept the null text without running it
    assert (written["rows"], written["ok"], written["errors"], written["carried"]) == (1, 1, {"null_text": 1}, 1)
    marker.write_text(json.dumps({**written, "carried": 0}))  # counts that do not add up are still refused
    with pytest.raises(OutputError, match="its counts do not add up"):
        FolderStatus.of_run(str(tmp_path / "out"))


def test_int8_quantization_stays_close_to_fp32(sms_parquet, minilm_path, tmp_path):
    rows = sms_parquet / "part-0.parquet"  # 200 rows of the real MiniLM, twice
    run_job(_job(rows, minilm_path, tmp_path / "fp32"))
    report = run_job(_job(rows, minilm_path, tmp_path / "int8", model__quantize="int8"))
    fp32, int8 = _vectors(_read(tmp_path / "fp32"), "embedding"), _vectors(_read(tmp_path / "int8"), "embedding")
    assert report["rows_ok"] == 200 and not np.array_equal(fp32, int8)  # quantized for real
    cosine = (fp32 * int8).sum(1)  # both normalized: the dot product is the cosine
    assert cosine.mean() > 0.95 and cosine.min() > 0.8  # lossy, as the docs say, but the same embedding space


def test_disk_full_and_unwritable_folder_say_what_to_do(sms_parquet, tiny_embed, tmp_path, monkeypatch):
    import errno
    import os

    import batchinfer.storage as storage  # the rename and the folder's creation live there
    from batchinfer.errors import OutputError

    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith(".parquet"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(storage.os, "replace", full)
    with pytest.raises(OutputError, match="is full") as info:
        run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"))
    assert "rerun the same command to resume" in info.value.hint
    assert not list((tmp_path / "out").glob(".tmp-*"))  # no half-written file left behind
    monkeypatch.setattr(storage.os, "replace", real_replace)
    run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"))  # space is back: the same job resumes
    assert _read(tmp_path / "out").num_rows == 600

    def unwritable(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(storage.Path, "mkdir", unwritable)
    with pytest.raises(OutputError, match="cannot create output folder .*: Permission denied"):
        run_job(_job(sms_parquet, tiny_embed, tmp_path / "elsewhere"))


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_shard_rewritten_between_crash_and_resume_is_refused(sms_table, tiny_embed, tmp_path, kind):
    """Same name, same row count, different texts: the finished chunks hold results of the old texts."""
    import json

    import pyarrow.parquet as pq

    rows = sms_table.slice(0, 300)
    data = tmp_path / "in"
    data.mkdir()

    def write(table):
        if kind == "parquet":
            pq.write_table(table, data / "sms.parquet")
        else:
            (data / "sms.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))

    write(rows)
    job = _job(data, tiny_embed, tmp_path / "out")
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(1))
    assert done_chunks(tmp_path / "out") == 1
    texts = rows.column("text").to_pylist()
    texts[250] = texts[250].swapcase()  # one row of a chunk not yet run; same byte length
    write(rows.set_column(rows.column_names.index("text"), "text", pa.array(texts)))
    with pytest.raises(ResumeError) as info:
        run_job(job)
    assert f"sms.{kind} changed since this folder's first run" in info.value.message
    assert "--restart" in info.value.hint
    report = run_job(job, restart=True)
    assert report["complete"] and report["run"]["rows"] == 300


class SwapAfterChunks(CrashAfterChunks):
    """A progress display that calls `swap` once `chunks` chunks are committed, and goes on."""

    def __init__(self, chunks: int, swap):
        super().__init__(chunks)
        self.swap = swap

    def advance(self, rows, tokens):
        self.left -= 1
        if self.left == 0:
            self.swap()


def _write_shard(table, path):
    import csv
    import json

    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=64)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    else:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=table.column_names)
            writer.writeheader()
            writer.writerows(table.to_pylist())


@pytest.mark.parametrize(
    "name,on_bad_shard",
    [("sms.parquet", "fail"), ("sms.jsonl", "fail"), ("sms.csv", "fail"), ("sms.parquet", "skip")],
)
def test_a_shard_replaced_during_the_run_is_never_mixed_into_the_result(
    sms_table, tiny_embed, tmp_path, name, on_bad_shard
):
    """A new file renamed over a shard after its first chunks were committed: the run stops that shard's
    rows (fail: the run stops naming the file; skip: its remaining rows are bad_shard errors); no row of
    the new file reaches the output, and _SUCCESS is not written over a mix."""
    import os

    import pyarrow.compute as pc

    rows = sms_table.slice(0, 400)
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / name
    _write_shard(rows, path)
    os.utime(path, ns=(1_600_000_000 * 10**9,) * 2)  # written long before the job
    new = rows.set_column(0, "sms_id", pc.binary_join_element_wise("new-", rows.column("sms_id"), ""))

    def swap():
        _write_shard(new, tmp_path / f"new-{name}")
        os.replace(tmp_path / f"new-{name}", path)

    job = _job(tmp_path / "in", tiny_embed, tmp_path / "out", input__on_bad_shard=on_bad_shard)
    if on_bad_shard == "fail":
        from batchinfer.errors import InputError

        with pytest.raises(InputError) as info:
            run_job(job, progress=SwapAfterChunks(1, swap))
        assert f"of {name} cannot be read: the file changed while the job ran" in info.value.message
        assert "--restart" in info.value.hint
    else:
        report = run_job(job, progress=SwapAfterChunks(1, swap))
        assert report["rows"] == 400 and report["rows_ok"] + report["errors_by_reason"]["bad_shard"] == 400
    ids = _read(tmp_path / "out").column("sms_id").to_pylist()
    assert ids and not any(i.startswith("new-") for i in ids)
    assert set(ids) <= set(rows.column("sms_id").to_pylist())
    assert (tmp_path / "out" / "_SUCCESS").exists() == (on_bad_shard == "skip")


def test_success_is_never_written_over_a_part_that_vanished_during_the_run(sms_parquet, tiny_embed, tmp_path):
    from batchinfer.errors import OutputError

    out = tmp_path / "out"
    with pytest.raises(OutputError) as info:
        run_job(
            _job(sms_parquet, tiny_embed, out), progress=SwapAfterChunks(2, (out / "part-00000-00000.parquet").unlink)
        )
    assert "part-00000-00000.parquet of finished chunks vanished" in info.value.message
    assert not (out / "_SUCCESS").exists() and _read(out).num_rows == 500
    report = run_job(_job(sms_parquet, tiny_embed, out))  # as the fix says
    assert report["complete"] and report["run"]["rows"] == 100 and _read(out).num_rows == 600


def test_output_inside_the_input_folder_is_never_read_back(sms_parquet, tiny_embed, tmp_path):
    """With the text kept in the output, a rerun that read its own parts would find every row twice."""
    job = _job(sms_parquet, tiny_embed, sms_parquet / "embedded", input__keep=["text"])
    first = run_job(job)
    second = run_job(job, restart=True)
    assert first["rows"] == second["rows"] == 600 and second["run"]["rows"] == 600
    assert _read(sms_parquet / "embedded").num_rows == 600


def test_polars_and_duckdb_read_the_output_by_the_readmes_glob(sms_parquet, tiny_embed, tmp_path):
    import duckdb
    import polars as pl

    run_job(_job(sms_parquet, tiny_embed, tmp_path / "out"))
    frame = pl.read_parquet(str(tmp_path / "out" / "*.parquet"))
    assert frame.height == 600 and frame["sms_id"].to_list() == _read(tmp_path / "out").column("sms_id").to_pylist()
    assert duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 'out'}/*.parquet'").fetchall() == [(600,)]


def test_a_probe_choice_as_an_earlier_batchinfer_recorded_it_settles_a_resumed_runs_batching(tmp_path):
    """_batchinfer.json's `tuning` as batchinfer wrote it before the choice was typed (a null precision, rates as
    whole numbers, a key this one does not know) reads back as the ProbeChoice the driver starts from, and is
    written again with every value it held."""
    from batchinfer.batching.budget import Batching, ProbeChoice
    from batchinfer.batching.probe import DEFAULT_BUDGET
    from batchinfer.execution.driver import settle_budget
    from batchinfer.output.job_record import JobRecord, probe_choice
    from batchinfer.output.layout import FORMAT

    old = {
        "max_tokens": 4096,
        "strategy": "packed",
        "backend": "torch",
        "precision": None,
        "tokens_per_s": {"padded@4096": 1157, "packed@4096": 4226},
        "seconds": 2,
        "rows": 80,
        "notes": ["strategy: no candidate clearly faster than padded, kept"],
        "added_later": {"by": "a later batchinfer"},
    }
    record = {"batchinfer": FORMAT, "job_id": "0" * 32, "fingerprint": {}, "tuning": old}
    JobRecord.model_validate(record)  # read_job's check: the folder is not damaged
    choice = probe_choice(record)
    assert isinstance(choice, ProbeChoice) and choice.tokens_per_s == {"padded@4096": 1157.0, "packed@4096": 4226.0}
    auto = _job(
        tmp_path / "in.parquet", tmp_path / "m", tmp_path / "out", batching={"max_tokens": "auto", "strategy": "auto"}
    )
    assert settle_budget(auto, choice) == (Batching(4096, "packed", "torch", None), True)
    assert settle_budget(auto, None)[0] == Batching(DEFAULT_BUDGET, "padded")
    assert pickle.loads(pickle.dumps(choice)) == choice  # as Ray hands it to the other workers' actors
    written = choice.record()
    assert written == {k: v for k, v in old.items() if v is not None} and ProbeChoice.model_validate(written) == choice
