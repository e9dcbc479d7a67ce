"""model.backend: OpenVINO agrees with torch on every encoder task, bf16 within its bounds, conversions are
cached per model identity (a changed or damaged model is never served from the cache), and a job killed on
one backend resumes on the other with every id once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    Crash,
    CrashAfterChunks,
    assert_rows_agree,
    job_record,
    make_job,
    ran_in,
    read_output,
    stand_in_for_cpu_kind,
    vectors,
    write_job,
)
from tokenizer_families import FAMILIES, TRICKY

from batchinfer.backends.openvino import CPU_KINDS
from batchinfer.control import Quiet
from batchinfer.errors import ConfigError, ModelError, ResumeError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job
from batchinfer.machine import load_so_far

pytest.importorskip("openvino", reason="the OpenVINO backend needs the openvino package (pip install -e '.[cpu]')")


def _run(data, model, out, task, backend, dtype="float32", **extra):
    return run_job(make_job(data, model, out, task, model__backend=backend, model__dtype=dtype, **extra))


def _entries(cache) -> list:
    root = cache / "openvino"
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.exists() else []


@pytest.mark.parametrize(
    "fixture,task,column",
    [
        ("tiny_embed", "embed", "embedding"),
        ("tiny_embed_cls", "embed", "embedding"),
        ("tiny_classify", "classify", "scores"),
    ],
)
def test_openvino_f32_equals_torch(request, sms_parquet, tmp_path, fixture, task, column):
    model = request.getfixturevalue(fixture)
    extra = {"output__scores": True} if task == "classify" else {}
    reports = {b: _run(sms_parquet, model, tmp_path / b, task, b, **extra) for b in ("torch", "openvino")}
    assert (
        reports["openvino"]["batching"]["backend"] == "openvino" and reports["torch"]["batching"]["backend"] == "torch"
    )
    ours, theirs = read_output(tmp_path / "openvino"), read_output(tmp_path / "torch")
    assert ours.column("sms_id").to_pylist() == theirs.column("sms_id").to_pylist()
    assert np.abs(vectors(ours, column) - vectors(theirs, column)).max() < 1e-5
    if task == "classify":
        assert ours.column("label").to_pylist() == theirs.column("label").to_pylist()


def test_openvino_f32_equals_torch_on_minilm_and_bf16_stays_within_bounds(sms_parquet, minilm_path, tmp_path):
    rows = sms_parquet / "part-0.parquet"  # 200 rows of the real MiniLM, three times
    torch_report = _run(rows, minilm_path, tmp_path / "torch", "embed", "torch")
    _run(rows, minilm_path, tmp_path / "f32", "embed", "openvino")
    reference = vectors(read_output(tmp_path / "torch"), "embedding")
    assert torch_report["rows_ok"] == 200
    assert np.abs(vectors(read_output(tmp_path / "f32"), "embedding") - reference).max() < 1e-5
    _run(rows, minilm_path, tmp_path / "bf16", "embed", "openvino", dtype="bfloat16")
    bf16 = vectors(read_output(tmp_path / "bf16"), "embedding")
    cosine = (bf16 * reference).sum(1) / np.linalg.norm(bf16, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.999


def test_openvino_cross_encoder_scores_token_entities_and_zero_shot_equal_torch(
    sms_table, tiny_cross_encoder, tiny_ner, tiny_nli, tmp_path
):
    texts = sms_table.column("text").to_pylist()[:120]
    rows = pa.table({"sms_id": [f"p{i}" for i in range(120)], "text": texts, "query": [t[:20] for t in texts[::-1]]})
    pq.write_table(rows, tmp_path / "rows.parquet")
    cases = {
        "score": (tiny_cross_encoder, {"input": {"text": "query", "text_pair": "text"}}, "score"),
        "token-classify": (tiny_ner, {}, "entities"),
        "zero-shot": (tiny_nli, {"model": {"labels": ["bill", "love", "spam"]}}, "scores"),
    }
    for task, (model, sections, column) in cases.items():
        tables = {}
        for backend in ("torch", "openvino"):
            job = {
                "input": {"path": str(tmp_path / "rows.parquet"), "text": "text", "id": "sms_id"},
                "model": {"path": str(model), "task": task, "max_length": 64, "backend": backend, "dtype": "float32"},
                "batching": {"chunk_rows": 50, "max_tokens": 2048, "strategy": "padded"},
                "output": {"path": str(tmp_path / f"{task}-{backend}")},
            }
            for section, values in sections.items():
                job[section] = {**job[section], **values}
            assert run_job(validate_job(job))["rows_ok"] == 120
            tables[backend] = read_output(tmp_path / f"{task}-{backend}")
        ours, theirs = tables["openvino"].column(column).to_pylist(), tables["torch"].column(column).to_pylist()
        if task == "token-classify":
            assert [[(e["label"], e["start"], e["end"]) for e in row] for row in ours] == [
                [(e["label"], e["start"], e["end"]) for e in row] for row in theirs
            ]
            assert sum(len(row) for row in ours) > 0
            ours = [[e["score"] for e in row] for row in ours]
            theirs = [[e["score"] for e in row] for row in theirs]
            ours, theirs = sum(ours, []), sum(theirs, [])
        assert np.abs(np.array(ours, dtype=np.float64) - np.array(theirs, dtype=np.float64)).max() < 1e-5, task


def test_auto_records_backend_and_precision_and_a_resume_reuses_them(
    sms_parquet, sms_table, tiny_embed, tmp_path, monkeypatch
):
    monkeypatch.setattr("batchinfer.batching.probe.SAMPLE_TOKENS", 300)
    job = make_job(sms_parquet, tiny_embed, tmp_path / "out", model__backend="auto")
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(1))
    tuning = job_record(tmp_path / "out")["tuning"]
    assert tuning["backend"] in ("torch", "openvino") and "precision" in tuning
    if tuning["backend"] == "openvino":
        assert tuning["precision"] in ("bf16", "f32")
    probes, loads = [], []
    monkeypatch.setattr("batchinfer.runners.base.probe", lambda *args: probes.append(args))
    from batchinfer import backends

    real = backends.load_encoders
    monkeypatch.setattr(
        backends, "load_encoders", lambda cfg, path, names, *a: loads.append(names) or real(cfg, path, names, *a)
    )
    report = run_job(job)
    assert report["complete"] and probes == [] and loads == [[tuning["backend"]]]  # only the chosen backend loads
    assert report["batching"]["backend"] == tuning["backend"] and report["batching"]["precision"] == tuning["precision"]
    assert read_output(tmp_path / "out").column("sms_id").to_pylist() == sms_table.column("sms_id").to_pylist()[:600]


def test_a_failed_precision_check_falls_back_to_f32_with_a_note(sms_parquet, tiny_classify, tmp_path, monkeypatch):
    from batchinfer import backends

    monkeypatch.setattr(
        backends, "precisions", lambda cfg, backend: ["bf16", "f32"] if backend == "openvino" else [None]
    )
    monkeypatch.setattr("batchinfer.backends.precision.agree", lambda how, ref, got: (False, {"labels_equal": 0.5}))
    notes = []

    class Log(Quiet):
        def log(self, message):
            notes.append(message)

    report = run_job(
        make_job(
            sms_parquet, tiny_classify, tmp_path / "out", "classify", model__backend="openvino", output__scores=True
        ),
        progress=Log(),
    )
    check = report["batching"]["probe"]["precision_check"]
    assert report["batching"]["precision"] == "f32" and check["fell_back"] and check["labels_equal"] == 0.5
    assert any("precision f32 (bf16 failed)" in note for note in notes)
    _run(sms_parquet, tiny_classify, tmp_path / "torch", "classify", "torch", output__scores=True)
    assert (
        np.abs(
            vectors(read_output(tmp_path / "out"), "scores") - vectors(read_output(tmp_path / "torch"), "scores")
        ).max()
        < 1e-5
    )


@pytest.mark.parametrize("no_bf16", [False, True], ids=["this-cpu", "BATCHINFER_NO_BF16"])
def test_dtype_auto_on_minilm_takes_bf16_where_the_cpu_has_it_and_says_why_not(
    sms_parquet, minilm_path, tmp_path, monkeypatch, no_bf16
):
    """bf16 present: its check passes and is recorded; absent (or turned off): f32, and the report says why."""
    from batchinfer.backends.openvino import bf16_supported

    # both cases set here, so a suite run under BATCHINFER_NO_BF16=1 still checks this CPU's own path
    monkeypatch.setenv("BATCHINFER_NO_BF16", "1" if no_bf16 else "0")
    report = _run(sms_parquet / "part-0.parquet", minilm_path, tmp_path / "out", "embed", "openvino", dtype="auto")
    batching = report["batching"]
    check = batching.get("probe", {}).get("precision_check")  # no probe at all where nothing is left to choose
    if bf16_supported():
        assert batching["precision"] == "bf16" and check["min_cosine"] >= 0.9999 and "precision_note" not in batching
        return
    assert batching["precision"] == "f32" and check is None
    assert batching["precision_note"].startswith("f32: ")
    assert ("BATCHINFER_NO_BF16 is set" in batching["precision_note"]) == no_bf16


@pytest.mark.parametrize("native", [True, False], ids=["bf16-cpu", "avx2-cpu"])
def test_no_bf16_turns_off_bf16_on_any_cpu_and_keeps_its_rates_apart(monkeypatch, native):
    from batchinfer.backends import openvino, precisions
    from batchinfer.job.config import ModelConfig

    # Both kinds of CPU, as OpenVINO describes them, whichever this machine is.
    monkeypatch.setattr(openvino, "_cpu_capabilities", lambda: ("FP32", "BF16") if native else ("FP32",))
    monkeypatch.delenv("BATCHINFER_NO_BF16", raising=False)  # a suite run under it: the CPU's own answer first
    cfg = ModelConfig(path="unused", task="embed", dtype="auto")
    assert precisions(cfg, "openvino") == (["bf16", "f32"] if native else ["f32"])
    before = openvino.cpu_id()
    monkeypatch.setenv("BATCHINFER_NO_BF16", "1")
    assert not openvino.bf16_supported() and precisions(cfg, "openvino") == ["f32"]
    assert (openvino.cpu_id() != before) == native  # rates timed in f32 never stand for bf16's
    pinned = ModelConfig(path="unused", task="embed", dtype="bfloat16")
    assert precisions(pinned, "openvino") == ["bf16"]  # a pinned dtype stays pinned
    monkeypatch.setenv("BATCHINFER_NO_BF16", "0")
    assert openvino.bf16_supported() == native


def test_a_changed_model_is_never_served_from_the_cache(sms_parquet, tiny_classify, tmp_path, conversion_cache):
    from transformers import AutoModelForSequenceClassification

    folder = tmp_path / "model"
    shutil.copytree(tiny_classify, folder)
    _run(sms_parquet, folder, tmp_path / "a", "classify", "openvino", output__scores=True)
    before = set(_entries(conversion_cache))  # the copy's conversion among them (the same identity as the fixture's)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    for parameter in model.parameters():
        parameter.data.mul_(1.5)  # same shapes, same file names: only the weights differ
    model.save_pretrained(folder)
    _run(sms_parquet, folder, tmp_path / "b", "classify", "openvino", output__scores=True)
    assert len(set(_entries(conversion_cache)) - before) == 1  # a conversion of its own for the new weights
    _run(sms_parquet, folder, tmp_path / "t", "classify", "torch", output__scores=True)
    new, torch_new = vectors(read_output(tmp_path / "b"), "scores"), vectors(read_output(tmp_path / "t"), "scores")
    assert np.abs(new - torch_new).max() < 1e-5
    assert np.abs(new - vectors(read_output(tmp_path / "a"), "scores")).max() > 1e-3


def test_a_conversion_sends_openvino_no_telemetry(sms_parquet, tiny_embed, tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # the one switch OpenVINO's converter reads
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))  # empty: this run converts
    forks = []
    os.register_at_fork(before=lambda: forks.append(1) if armed else None)  # a report is a forked process
    armed = True
    _run(sms_parquet, tiny_embed, tmp_path / "out", "embed", "openvino")
    armed = False
    assert _entries(tmp_path / "cache") and not forks


def test_importing_openvino_beside_batchinfer_reports_nothing_and_writes_nothing_in_the_home(tmp_path):
    """openvino's import alone wrote a client id and usage counts under ~/intel and took the user's silence for
    consent to report to Google Analytics; its converter package is not imported, so openvino runs its stub."""
    pytest.importorskip("openvino_genai")
    code = "import batchinfer, openvino, openvino_genai; from openvino.tools import ovc; print(type(ovc.telemetry))"
    env = {key: value for key, value in os.environ.items() if key != "CI"} | {"HOME": str(tmp_path)}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "telemetry_stub" in shown and not list(tmp_path.iterdir())


def test_a_damaged_cache_entry_is_rebuilt_and_a_foreign_one_refused(
    sms_parquet, tiny_embed, tmp_path, conversion_cache, monkeypatch
):
    _run(sms_parquet, tiny_embed, tmp_path / "a", "embed", "openvino")
    (entry,) = [e for e in _entries(conversion_cache) if (e / "model.bin").exists() and _is_for(e, tiny_embed)]
    weights = (entry / "model.bin").read_bytes()
    (entry / "model.bin").write_bytes(weights[: len(weights) // 2])  # a copy cut short
    _run(sms_parquet, tiny_embed, tmp_path / "b", "embed", "openvino")
    assert (entry / "model.bin").read_bytes() == weights
    assert np.array_equal(
        vectors(read_output(tmp_path / "a"), "embedding"), vectors(read_output(tmp_path / "b"), "embedding")
    )
    (entry / "model.bin").write_bytes(b"")
    (entry / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="notes.txt"):
        _run(sms_parquet, tiny_embed, tmp_path / "c", "embed", "openvino")
    assert (entry / "notes.txt").read_text() == "mine"
    shutil.rmtree(entry)
    entry.write_text("mine too")  # a file in the entry's place: refused before any conversion runs
    monkeypatch.setattr("openvino.convert_model", lambda *args, **kwargs: pytest.fail("converted"))
    with pytest.raises(ModelError, match="is a file where batchinfer keeps a conversion"):
        _run(sms_parquet, tiny_embed, tmp_path / "d", "embed", "openvino")
    assert entry.read_text() == "mine too"
    entry.unlink()


def _is_for(entry, model) -> bool:
    """Whether a cache entry is the conversion of `model` (its key covers the model identity)."""
    from batchinfer.backends.models import model_identity

    return json.loads((entry / "batchinfer.json").read_text())["model"] == model_identity(model)


def test_a_job_killed_on_openvino_resumes_on_torch_with_every_id_once(sms_parquet, sms_table, tiny_embed, tmp_path):
    with pytest.raises(Crash):
        run_job(
            make_job(sms_parquet, tiny_embed, tmp_path / "out", model__backend="openvino", model__dtype="float32"),
            progress=CrashAfterChunks(2),
        )
    report = run_job(
        make_job(sms_parquet, tiny_embed, tmp_path / "out", model__backend="torch", model__dtype="float32")
    )
    assert report["complete"] and report["rows_ok"] == 600 and report["run"]["rows"] == 400
    table = read_output(tmp_path / "out")
    assert table.column("sms_id").to_pylist() == sms_table.column("sms_id").to_pylist()[:600]
    run_job(make_job(sms_parquet, tiny_embed, tmp_path / "plain", model__backend="torch", model__dtype="float32"))
    assert np.abs(vectors(table, "embedding") - vectors(read_output(tmp_path / "plain"), "embedding")).max() < 1e-5


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"model__task": "generate"}, "model.backend: openvino runs encoder tasks"),
        ({"model__task": "classify", "model__labels": ["ham", "spam"]}, "not a causal LM scoring labels"),
        ({"model__quantize": "int8"}, "does not run model.quantize"),
        ({"batching__strategy": "packed"}, "runs padded batches only"),
    ],
)
def test_jobs_openvino_cannot_run_are_refused_with_the_fix(
    sms_parquet, tiny_embed, tiny_llama, tmp_path, settings, message
):
    model = tiny_llama if settings.get("model__task") in ("generate", "classify") else tiny_embed
    task = settings.pop("model__task", "embed")
    with pytest.raises(ConfigError, match=message):
        run_job(make_job(sms_parquet, model, tmp_path / "out", task, model__backend="openvino", **settings))


def test_without_openvino_auto_runs_torch_and_openvino_says_what_to_install(
    sms_parquet, tiny_embed, tmp_path, monkeypatch
):
    monkeypatch.setattr("batchinfer.backends.openvino.available", lambda: False)
    report = run_job(make_job(sms_parquet, tiny_embed, tmp_path / "out", model__backend="auto"))
    assert report["complete"] and report["batching"]["backend"] == "torch"
    with pytest.raises(ConfigError, match="needs the openvino package") as refused:
        run_job(make_job(sms_parquet, tiny_embed, tmp_path / "out2", model__backend="openvino"))
    assert 'pip install -e ".[cpu]"' in refused.value.hint


@pytest.mark.parametrize(
    "ratio,loaded", [(3.0, ["openvino"]), (1.12, ["openvino"]), (1.05, ["openvino", "torch"]), (0.5, ["torch"])]
)
def test_a_warm_run_loads_only_the_backend_that_was_clearly_faster_on_this_cpu_before(
    sms_parquet, tiny_embed, tmp_path, conversion_cache, monkeypatch, ratio, loaded
):
    """Clearly (by the probe's own 10%) faster either way: the other is not loaded; closer: both, timed again."""
    from batchinfer import backends
    from batchinfer.backends import openvino

    run_job(make_job(sms_parquet, tiny_embed, tmp_path / "first", model__backend="openvino", model__dtype="float32"))
    (entry,) = [e for e in _entries(conversion_cache) if _is_for(e, tiny_embed)]
    (entry / openvino.RATES).write_text(json.dumps({"cpu-of-another-machine": {"openvino": 1.0, "torch": 100.0}}))
    openvino.remember(entry, {"openvino": ratio, "torch": 1.0}, load_so_far().as_dict())
    real, kept = backends.load_encoders, []
    monkeypatch.setattr(backends, "load_encoders", lambda *a: kept.append(sorted((got := real(*a))[1])) or got)
    report = run_job(make_job(sms_parquet, tiny_embed, tmp_path / "out", model__backend="auto"))
    assert report["complete"] and kept == [loaded]
    assert ("torch_load" in report["startup"]["load"]) == ("torch" in loaded)
    if len(loaded) == 1:
        notes = " ".join(report["batching"]["probe"]["notes"])
        assert report["batching"]["backend"] == loaded[0]
        faster, times = ("OpenVINO", ratio) if ratio > 1 else ("torch", 1 / ratio)
        assert f"not loaded: {faster} ran this model at {times:.1f}x its speed" in notes, notes
        assert "measured 0 hours ago, while " in notes  # when, and under what load
    (entry / openvino.RATES).unlink()


WARM_RUN = """
import sys
from batchinfer.cli import app

from batchinfer import backends, machine
backends.load_so_far = lambda: machine.Load(1.0, 0.0, 0.0, 2, 0.0)  # as quiet as the kept rates' (a shared machine)
try:
    app(["run", sys.argv[1], "-q"], standalone_mode=False)
except SystemExit:
    pass
modeling = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "transformers")))
print("imported:", modeling[:5])
"""


@pytest.mark.parametrize("task", ["classify", "score"])
def test_a_warm_classify_or_score_run_on_openvino_imports_no_torch_and_equals_torch(
    sms_table, tiny_classify, tiny_cross_encoder, tmp_path, conversion_cache, task
):
    """Every backend's forward returns numpy and these heads compute in numpy: with the conversion cached and
    rates that say OpenVINO, a classify or score job imports neither torch nor transformers."""
    import subprocess
    import sys

    from batchinfer.backends import openvino

    model = {"classify": tiny_classify, "score": tiny_cross_encoder}[task]
    texts = sms_table.column("text").to_pylist()[:60]
    rows = pa.table({"sms_id": [f"p{i}" for i in range(60)], "text": texts, "query": [t[:20] for t in texts[::-1]]})
    pq.write_table(rows, tmp_path / "rows.parquet")

    def job(backend, out, **model_keys):
        pair = {"text_pair": "text", "text": "query"} if task == "score" else {"text": "text"}
        return {
            "input": {"path": str(tmp_path / "rows.parquet"), "id": "sms_id", **pair},
            "model": {"path": str(model), "task": task, "max_length": 64, "backend": backend, **model_keys},
            "batching": {"max_tokens": 2048, "strategy": "padded"},
            "output": {"path": str(tmp_path / out), "scores": True},
        }

    run_job(validate_job(job("torch", "torch")))
    run_job(validate_job(job("openvino", "first", dtype="float32")))
    (entry,) = [e for e in _entries(conversion_cache) if _is_for(e, model)]
    openvino.remember(entry, {"openvino": 3.0, "torch": 1.0}, {"cores": 2, "other_cores": 0.0, "steal_cores": 0.0})
    path = write_job(tmp_path, job("auto", "warm", dtype="float32"))
    done = subprocess.run([sys.executable, "-c", WARM_RUN, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported: []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((tmp_path / "warm" / "_report.json").read_text())["batching"]["backend"] == "openvino"
    ours, theirs = (read_output(tmp_path / name).sort_by("sms_id") for name in ("warm", "torch"))
    assert ours.schema.field("scores").metadata == theirs.schema.field("scores").metadata
    assert np.abs(vectors(ours, "scores") - vectors(theirs, "scores")).max() < 1e-4
    (entry / openvino.RATES).unlink()


@pytest.mark.parametrize("kind", list(CPU_KINDS))
def test_a_warm_embed_run_on_openvino_imports_neither_torch_nor_transformers_and_equals_torch_in_its_precision(
    sms_parquet, tiny_embed, tmp_path, conversion_cache, monkeypatch, kind
):
    """Cached conversion, rates that say OpenVINO: the tokenizer from tokenizer.json, the config from
    config.json, the graph (and its compiled blob) from the cache; on each CPU kind (stood in for) the
    precision dtype auto gives there, and torch's vectors within that precision's bound."""
    import subprocess
    import sys

    from batchinfer.backends import openvino

    stand_in_for_cpu_kind(kind, monkeypatch)
    torch_run = tmp_path / "torch"
    run_job(make_job(sms_parquet, tiny_embed, torch_run))
    run_job(make_job(sms_parquet, tiny_embed, tmp_path / "first", model__backend="openvino", model__dtype="float32"))
    (entry,) = [e for e in _entries(conversion_cache) if _is_for(e, tiny_embed)]
    openvino.remember(entry, {"openvino": 3.0, "torch": 1.0}, {"cores": 2, "other_cores": 0.0, "steal_cores": 0.0})
    warm = tmp_path / "warm"
    job = write_job(tmp_path, make_job(sms_parquet, tiny_embed, warm, raw=True, model__backend="auto"))
    command = [sys.executable, "-c", WARM_RUN, str(job)]  # the stand-in's CPU kind is in its environment
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported: []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((warm / "_report.json").read_text())
    assert report["complete"] and report["batching"]["backend"] == "openvino"
    assert "torch_load" not in report["startup"]["load"]
    assert (entry / openvino.BLOBS).is_dir()  # the compile left its blob for the next start
    assert ran_in(warm) == CPU_KINDS[kind][1], report["batching"]
    ours, theirs = (read_output(folder).sort_by("sms_id") for folder in (warm, torch_run))
    checked = assert_rows_agree(vectors(ours, "embedding"), vectors(theirs, "embedding"), (ran_in(warm), "f32"), 1e-5)
    assert checked == CPU_KINDS[kind][1]  # bf16 ran: bf16's bound against f32, not f32's 1e-5
    (entry / openvino.RATES).unlink()


@pytest.mark.parametrize(
    "started,resumed,why",
    [
        ("avx512_bf16", {"kind": "avx2"}, "this CPU has no native bf16"),
        ("amx", {"no_bf16": True}, "BATCHINFER_NO_BF16 is set"),
        ("amx", {"backend": "torch"}, "model.backend is torch"),
    ],
)
def test_a_job_started_in_bf16_is_not_resumed_in_f32(
    sms_parquet, tiny_embed, tmp_path, monkeypatch, started, resumed, why
):
    """Its first chunks ran in bf16 (a CPU kind stood in for); the same command where bf16 cannot run would
    write f32 chunks beside them, and refuses instead, before any chunk, naming why and the fix."""
    stand_in_for_cpu_kind(started, monkeypatch)
    job = partial(make_job, sms_parquet, tiny_embed, tmp_path / "out", model__backend="openvino")
    with pytest.raises(Crash):
        run_job(job(), progress=CrashAfterChunks(2))
    assert job_record(tmp_path / "out")["tuning"]["precision"] == "bf16"
    stand_in_for_cpu_kind(resumed.get("kind", started), monkeypatch)
    if resumed.get("no_bf16"):
        monkeypatch.setenv("BATCHINFER_NO_BF16", "1")
    parts = sorted(p.name for p in (tmp_path / "out").glob("part-*"))
    with pytest.raises(ResumeError, match=f"ran on openvino in bf16.*{why}") as refused:
        run_job(job(model__backend=resumed.get("backend", "openvino")))
    assert "--restart" in refused.value.hint and "avx512_bf16" in refused.value.hint
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == parts  # nothing written
    stand_in_for_cpu_kind("avx512_bf16", monkeypatch)  # another bf16 kind goes on with it
    report = run_job(job())
    assert report["complete"] and report["run"]["rows"] == 400 and ran_in(tmp_path / "out") == "bf16"


def test_in_the_precision_this_cpu_gives_a_row_alone_in_a_batch_or_resumed_agrees_within_its_bound(
    sms_parquet, tiny_embed, tmp_path
):
    """model.dtype auto on OpenVINO, as a user runs it here: a row alone and in batches (1e-4 in f32), a job
    killed and resumed and the same job whole (1e-5 in f32); in bf16, each row's cosine between the two runs."""
    rows = sms_parquet / "part-0.parquet"
    job = partial(make_job, rows, tiny_embed, model__backend="openvino", model__dtype="auto")
    run_job(job(tmp_path / "alone", batching__max_rows=1))
    run_job(job(tmp_path / "whole", batching__chunk_rows=50))
    with pytest.raises(Crash):
        run_job(job(tmp_path / "resumed", batching__chunk_rows=50), progress=CrashAfterChunks(2))
    run_job(job(tmp_path / "resumed", batching__chunk_rows=50))
    alone, whole, resumed = (vectors(read_output(tmp_path / n), "embedding") for n in ("alone", "whole", "resumed"))
    precisions = {n: ran_in(tmp_path / n) for n in ("alone", "whole", "resumed")}
    assert len(set(precisions.values())) == 1, precisions  # one CPU, one precision
    assert_rows_agree(alone, whole, (precisions["alone"], precisions["whole"]), 1e-4)
    assert_rows_agree(resumed, whole, (precisions["resumed"], precisions["whole"]), 1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_warm_openvino_start_tokenizes_as_transformers_does(family, tokenizer_family, tmp_path, few_rows):
    """The first start (converting) and a warm one (the conversion cached, no transformers needed) split tricky
    text into the ids transformers' own tokenizer gives, for every family whose tokenizer transformers rebuilds
    from its class and tokenizer_config.json."""
    from transformers import AutoTokenizer

    from batchinfer.runners import make_runner

    path = tokenizer_family(family)
    theirs = AutoTokenizer.from_pretrained(path)
    cold = theirs(TRICKY, truncation=True, max_length=128)["input_ids"]
    job = make_job(few_rows, path, tmp_path / "out", model__backend="openvino", model__dtype="float32")
    for start in ("converting", "warm"):
        runner = make_runner(job, path)
        assert runner.backend == "openvino" and "torch" not in runner.backends
        assert runner.tokenize(TRICKY).ids == cold, start
        assert runner.pad_id == theirs.pad_token_id, start


def test_a_kept_tokenizer_is_not_read_once_its_files_or_transformers_changed(tokenizer_family, tmp_path):
    from transformers import AutoTokenizer

    from batchinfer.backends import folder

    path = shutil.copytree(tokenizer_family("roberta_prefix_space"), tmp_path / "model")
    record = folder.tokenizer_record(AutoTokenizer.from_pretrained(path), path)
    assert folder.read_tokenizer(record, path) is not None
    assert folder.read_tokenizer({**record, "transformers": "0.0.1"}, path) is None
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "add_prefix_space": False}))
    assert folder.read_tokenizer(record, path) is None


def test_a_limited_run_resumed_warm_on_openvino_embeds_as_torch_does(sms_parquet, tokenizer_family, tmp_path):
    """The course-recipe BERT: a --limit run converts, the resume runs warm; every vector is torch's, so the
    folder holds one tokenization."""
    path = tokenizer_family("course_bert")
    run_job(make_job(sms_parquet, path, tmp_path / "torch"))
    out = tmp_path / "openvino"
    job = make_job(sms_parquet, path, out, model__backend="openvino", model__dtype="float32")
    run_job(job, limit=150)
    report = run_job(job)
    assert report["complete"] and report["batching"]["backend"] == "openvino"
    ours, theirs = (read_output(folder).sort_by("sms_id") for folder in (out, tmp_path / "torch"))
    assert ours.column("sms_id").to_pylist() == theirs.column("sms_id").to_pylist()
    np.testing.assert_allclose(vectors(ours, "embedding"), vectors(theirs, "embedding"), atol=1e-5)


def test_a_decoder_embedder_converts_and_equals_torch_and_auto_checks_it_on_the_jobs_rows(
    sms_parquet, tiny_llama_embedder, tmp_path
):
    """A Llama with last-token pooling: OpenVINO converts it (no KV cache in the graph) and gives torch's vectors;
    under auto the conversion is checked against torch on the job's own rows, and the report says so."""
    rows = sms_parquet / "part-0.parquet"
    reports = {b: _run(rows, tiny_llama_embedder, tmp_path / b, "embed", b) for b in ("torch", "openvino")}
    made = reports["openvino"]["startup"]["load"]["conversion_check"]  # checked when converted, on random rows
    assert made["against"] == "torch" and made["items"] == 4 and made["min_cosine"] > 0.9999
    ours, theirs = read_output(tmp_path / "openvino"), read_output(tmp_path / "torch")
    np.testing.assert_allclose(vectors(ours, "embedding"), vectors(theirs, "embedding"), atol=1e-5)
    report = _run(rows, tiny_llama_embedder, tmp_path / "auto", "embed", "auto", dtype="auto", batching__strategy=None)
    check = report["batching"]["probe"]["conversion_check"]
    assert report["complete"] and check["against"] == "torch" and check["items"] > 0 and check["min_cosine"] > 0.9999


def _unconvertible(*args, **kwargs):
    from openvino._pyopenvino import OpConversionFailure

    raise OpConversionFailure(  # the converter's report, shortened: every failed operation, then a summary
        "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
        "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted. Failed operations detailed log:"
        "\n-- aten::cat with a message:\nAxis -2 out of the tensor rank range [-1, 0].\n\nSummary:\n"
        "-- Conversion is failed for: SequenceMark, aten::cat\n"
    )


def test_a_model_openvino_cannot_convert_runs_on_torch_under_auto_and_is_refused_when_pinned(
    few_rows, tiny_embed, tmp_path, monkeypatch
):
    monkeypatch.setattr("openvino.convert_model", _unconvertible)  # the converter's own failure, as Llama gave it
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))  # no conversion of tiny_embed to find
    report = _run(few_rows, tiny_embed, tmp_path / "auto", "embed", "auto", dtype="auto", batching__strategy=None)
    note = report["startup"]["load"]["note"]
    assert report["complete"] and report["batching"]["backend"] == "torch"
    assert note.startswith("OpenVINO not used, torch runs the job: OpenVINO cannot convert the model")
    assert note.endswith("(BertModel): Conversion is failed for: SequenceMark, aten::cat (set model.backend: torch)")
    assert note in report["batching"]["probe"]["notes"]
    with pytest.raises(ModelError, match=f"OpenVINO cannot convert the model {tiny_embed}") as refused:
        _run(few_rows, tiny_embed, tmp_path / "pinned", "embed", "openvino")
    assert "model.backend: torch" in refused.value.hint


def test_a_conversion_that_disagrees_with_torch_when_made_is_not_kept(few_rows, tiny_embed, tmp_path, monkeypatch):
    monkeypatch.setattr("batchinfer.backends.openvino.COSINE_FLOOR", 1.5)  # no cosine reaches it
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelError, match="OpenVINO's conversion of the model .* disagrees with torch: min cosine"):
        _run(few_rows, tiny_embed, tmp_path / "pinned", "embed", "openvino")
    report = _run(few_rows, tiny_embed, tmp_path / "auto", "embed", "auto", dtype="auto", batching__strategy=None)
    assert report["batching"]["backend"] == "torch" and "disagrees with torch" in report["startup"]["load"]["note"]
    assert _entries(tmp_path / "cache") == []  # nothing kept that a later job could take


def test_a_conversion_that_disagrees_with_torch_on_the_jobs_rows_is_not_used(
    few_rows, tiny_embed, tmp_path, monkeypatch
):
    from batchinfer.backends.openvino import OpenVINOBackend

    answer = OpenVINOBackend.forward
    # a graph that loses the second half of every vector (as a wrong conversion would)
    monkeypatch.setattr(OpenVINOBackend, "forward", lambda self, batch: _halved(answer(self, batch)))
    report = _run(few_rows, tiny_embed, tmp_path / "auto", "embed", "auto", dtype="auto", batching__strategy=None)
    check = report["batching"]["probe"]["conversion_check"]
    assert report["batching"]["backend"] == "torch" and check["min_cosine"] < 0.9999
    assert any("conversion f32, checked against torch" in note for note in report["batching"]["probe"]["notes"])


@pytest.mark.parametrize("wrong", [False, True])
def test_serve_checks_the_conversion_against_torch_before_it_answers(
    few_rows, tiny_embed, tmp_path, monkeypatch, wrong
):
    """serve has no chunk to probe: its start settles on OpenVINO only where the conversion gives torch's vectors
    on a few sentences."""
    from batchinfer.backends.openvino import OpenVINOBackend
    from batchinfer.runners import make_runner

    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))  # no rates from other tests: both load

    if wrong:
        answer = OpenVINOBackend.forward
        monkeypatch.setattr(OpenVINOBackend, "forward", lambda self, batch: _halved(answer(self, batch)))
    job = make_job(few_rows, tiny_embed, tmp_path / "out", model__backend="auto", model__dtype="auto")
    runner = make_runner(job, tiny_embed)
    runner.settle_default()
    assert list(runner.backends) == (["torch"] if wrong else ["openvino"])


def _halved(pooled):
    pooled[:, pooled.shape[1] // 2 :] = 0
    return pooled


def test_a_probe_that_timed_both_backends_keeps_their_rates_for_this_cpu(tmp_path):
    from batchinfer.backends import openvino

    model = openvino.OpenVINOBackend.__new__(openvino.OpenVINOBackend)
    model.entry = tmp_path
    quiet = {"cores": 2, "other_cores": 0.0, "steal_cores": 0.0, "load_avg": 0.1}
    model.remember({"openvino": 30_000, "torch": 10_000}, quiet)
    model.remember({"openvino": 20_000, "torch": 12_000}, quiet)
    (known,) = json.loads((tmp_path / openvino.RATES).read_text()).values()
    assert known["openvino"] == 20_000 and known["torch"] == 12_000 and known["load"] == quiet
    assert known["best"] == {"openvino": 30_000, "torch": 12_000} and model.best_rates() == known["best"]


@pytest.fixture
def few_rows(sms_table, tmp_path):
    """Rows enough for the cache's own tests: what they check happens before the first batch."""
    pq.write_table(sms_table.slice(0, 8), tmp_path / "few.parquet")
    return tmp_path / "few.parquet"


class _Logged(Quiet):
    def __init__(self):
        self.lines = []

    def log(self, message):
        self.lines.append(message)


def _read_only(monkeypatch):
    """A cache that cannot be written, as on a read-only mount (root writes through chmod, so the lock
    file's opening is what fails, as EROFS makes it fail)."""
    import errno
    import os

    from filelock import FileLock

    def no_writes(lock, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), lock.lock_file)

    monkeypatch.setattr(FileLock, "acquire", no_writes)


TRY_LOCK = """
import sys
from filelock import FileLock, Timeout
try:
    FileLock(sys.argv[1]).acquire(timeout=0)
    print("free")
except Timeout:
    print("held")
"""


def test_while_a_conversion_is_written_another_process_cannot_take_its_lock_and_afterwards_it_can(
    tmp_path, monkeypatch
):
    import subprocess
    import sys

    from batchinfer.backends import openvino

    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "cache"))
    of = {"model": "a stand-in"}
    lock = openvino.entry_of(of).parent / f".{openvino.entry_of(of).name}.lock"

    def other_process() -> str:
        return subprocess.run([sys.executable, "-c", TRY_LOCK, str(lock)], capture_output=True, text=True).stdout

    seen = []

    def write(folder):  # a conversion: another worker asks for the lock meanwhile
        seen.append(other_process())
        (folder / "model.xml").write_text("<net/>")

    entry, seconds = openvino.cached(of, write)
    assert seen == ["held\n"] and "convert" in seconds and (entry / "model.xml").is_file()
    assert other_process() == "free\n"
    assert openvino.cached(of, write) == (entry, {}) and len(seen) == 1  # found whole: not converted again


def test_staging_a_killed_conversion_left_is_removed_and_a_read_only_cache_serves_its_entry_or_auto_runs_torch(
    few_rows, tiny_embed, tmp_path, monkeypatch
):
    import fcntl

    cache = tmp_path / "cache"
    monkeypatch.setenv("BATCHINFER_CACHE", str(cache))
    root = cache / "openvino"
    dead, live = root / f".tmp-{'a' * 24}-0badf00d", root / f".tmp-{'b' * 24}-0badf00d"
    for staging in (dead, live):
        staging.mkdir(parents=True)
        (staging / "model.bin").write_bytes(b"\0" * 1024)
    (root / f".{'a' * 24}.lock").touch()  # its converter was killed: the lock is free
    with open(root / f".{'b' * 24}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process converting now (a bare flock: any locker's)
        _run(few_rows, tiny_embed, tmp_path / "a", "embed", "openvino")
    assert not dead.exists() and live.exists() and len(_entries(cache)) == 1

    _read_only(monkeypatch)
    report = _run(few_rows, tiny_embed, tmp_path / "b", "embed", "openvino")  # the valid entry, only read
    assert report["complete"] and "convert" not in report["startup"]["load"]
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="cache .*empty.* cannot be written") as refused:
        _run(few_rows, tiny_embed, tmp_path / "c", "embed", "openvino")
    assert "set BATCHINFER_CACHE to a writable folder" in refused.value.hint
    logged = _Logged()
    report = run_job(
        make_job(few_rows, tiny_embed, tmp_path / "d", model__backend="auto", model__dtype="float32"),
        progress=logged,
    )
    assert report["complete"] and report["batching"]["backend"] == "torch"
    note = report["startup"]["load"]["note"]
    assert note.startswith("OpenVINO not used, torch runs the job") and "cannot be written" in note
    assert any(note in line for line in logged.lines)


def test_a_full_disk_during_conversion_is_named_and_auto_runs_torch(few_rows, tiny_embed, tmp_path, monkeypatch):
    import openvino as ov

    cache = tmp_path / "cache"
    monkeypatch.setenv("BATCHINFER_CACHE", str(cache))

    def full(*args, **kwargs):  # what OpenVINO raises when the disk fills while it writes model.bin
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp:1234:\nbasic_ios::clear: iostream error")

    monkeypatch.setattr(ov, "save_model", full)
    report = _run(few_rows, tiny_embed, tmp_path / "a", "embed", "auto")
    assert report["complete"] and report["batching"]["backend"] == "torch"
    note = report["startup"]["load"]["note"]
    assert f"cache {cache / 'openvino'} could not take the conversion (basic_ios::clear: iostream error)" in note
    assert "set BATCHINFER_CACHE to a writable folder" in note
    assert [p.name for p in (cache / "openvino").iterdir() if not p.name.endswith(".lock")] == []  # no staging
