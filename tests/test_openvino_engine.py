"""The OpenVINO GenAI engine (runners/openvino_engine.py) over the tiny random Llama, its conversion built
offline and cached (backends/openvino_causal.py): in f32 the same greedy tokens as the transformers engine, chosen
by generation.engine: auto on a CPU, a fallback with a note where it cannot run the job, bf16 only after a check
on the job's rows, and serve and openai-batch reaching it through the Engine protocol."""

import asyncio
import json

import httpx
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import generate_alone, generate_job, make_job, prompt_table
from typer.testing import CliRunner

from batchinfer.backends.models import resolve_model_path
from batchinfer.errors import ConfigError
from batchinfer.execution.driver import run_job

pytest.importorskip("openvino_genai")

COMPARED = ["id", "text", "finish_reason", "prompt_tokens", "completion_tokens"]


def _run(tmp_path, name, model, **settings):
    report = run_job(generate_job(tmp_path / "prompts.parquet", model, tmp_path / name, **settings))
    return report, ds.dataset(str(tmp_path / name), format="parquet").to_table().select(COMPARED).to_pylist()


def _conversions(cache) -> list:
    return [p for p in (cache / "openvino").iterdir() if (p / "openvino_model.xml").exists()]


def test_in_f32_the_openvino_engine_gives_the_transformers_engines_tokens_and_converts_once(
    sms_table, tmp_path, tiny_llama, conversion_cache
):
    pq.write_table(prompt_table(sms_table), tmp_path / "prompts.parquet")
    reference, expected = _run(tmp_path, "transformers", tiny_llama, generation__engine="transformers")
    report, got = _run(tmp_path, "openvino", tiny_llama, generation__engine="openvino")
    assert got == expected  # every row's text, finish reason and token counts
    assert reference["engine"] == {"name": "transformers"}
    assert report["engine"] == {"name": "openvino", "precision": "f32"}  # this CPU kind aside: f32 unless bf16 checked
    # the worker's cache may hold other tests' conversions: this model's is among them, and none is made again
    built = {entry: (entry / "openvino_model.bin").stat().st_mtime_ns for entry in _conversions(conversion_cache)}
    assert built
    for entry in built:
        manifest = json.loads((entry / "batchinfer.json").read_text())
        assert {"openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml"} <= set(manifest["files"])
    auto, again = _run(tmp_path, "auto", tiny_llama, generation__engine="auto", model__dtype="float32")
    assert auto["engine"] == {"name": "openvino", "precision": "f32"} and again == expected
    assert {
        entry: (entry / "openvino_model.bin").stat().st_mtime_ns for entry in _conversions(conversion_cache)
    } == built


def test_engine_auto_runs_transformers_with_a_note_where_openvino_cannot_run_the_job(
    sms_table, tmp_path, tiny_llama, tiny_gpt2, monkeypatch
):
    pq.write_table(prompt_table(sms_table, 6), tmp_path / "prompts.parquet")
    gpt2, _ = _run(tmp_path, "gpt2", tiny_gpt2)
    assert gpt2["engine"]["name"] == "transformers"
    assert "checked on llama" in gpt2["engine"]["notes"][0] and "not gpt2" in gpt2["engine"]["notes"][0]
    pytest.importorskip("xgrammar")
    constrained, rows = _run(tmp_path, "choices", tiny_llama, generation__choices=["yes", "no"])
    assert constrained["engine"]["name"] == "transformers" and "constrained output" in constrained["engine"]["notes"][0]
    assert {r["text"] for r in rows} <= {"yes", "no"}  # never unconstrained
    monkeypatch.setattr("batchinfer.runners.openvino_engine.available", lambda: False)
    missing, _ = _run(tmp_path, "missing", tiny_llama)
    assert "openvino-genai is not installed" in missing["engine"]["notes"][0]
    with pytest.raises(ConfigError, match="generation.engine openvino: openvino-genai is not installed"):
        _run(tmp_path, "pinned", tiny_llama, generation__engine="openvino")


def test_the_fast_precision_runs_only_after_agreeing_with_f32_on_the_jobs_own_rows(
    sms_table, tmp_path, tiny_llama, monkeypatch
):
    # This CPU may have no bf16: a u8 KV cache in f32 stands in for bf16's compile properties, the same code path
    monkeypatch.setattr("batchinfer.backends.openvino.bf16_supported", lambda: True)
    monkeypatch.setattr(
        "batchinfer.runners.openvino_engine.FAST", {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"}
    )
    pq.write_table(prompt_table(sms_table, 20), tmp_path / "prompts.parquet")
    report, _ = _run(tmp_path, "checked", tiny_llama)
    check = report["engine"]["precision_check"]
    assert check["rows"] == 16 and check["tokens"] == 8 and 0 <= check["agreement"] <= 1
    assert report["engine"]["precision"] == check["kept"] == ("bf16" if check["agreement"] >= 0.9 else "f32")
    pinned, _ = _run(tmp_path, "pinned", tiny_llama, model__dtype="float32")  # the one key that turns it off
    assert pinned["engine"] == {"name": "openvino", "precision": "f32"}


def test_check_precision_keeps_f32_unless_the_first_greedy_tokens_agree():
    from batchinfer.runners.openvino_engine import check_precision

    same = [list(range(10))] * 10
    assert check_precision(lambda precision: same)[0] == "bf16"
    apart = same[:8] + [[0, 1, 9]] * 2  # 80% agree: below the 90% needed
    kept, check = check_precision(lambda precision: same if precision == "f32" else apart)
    assert kept == "f32" and check["agreement"] == 0.8 and check["kept"] == "f32"
    late = same[:8] + [[*range(8), 7, 7]] * 2  # apart only past the 8 tokens compared
    assert check_precision(lambda precision: same if precision == "f32" else late)[0] == "bf16"


def test_serve_answers_completions_on_the_openvino_engine_and_constrained_ones_on_transformers(tiny_llama):
    from transformers import AutoTokenizer

    from batchinfer.serve import create_app

    job = make_job(
        "-",
        tiny_llama,
        "-",
        "generate",
        input__id=None,
        input__keep=None,
        batching__chunk_rows=None,
        generation__max_new_tokens=12,
        generation__engine="openvino",
        serve={"max_wait_ms": 50},
    )
    app = create_app(job, resolve_model_path(job.model.path))
    prompts = ["Free entry in 2 a wkly comp", "Ok lar... Joking wif u oni"]
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"enum": ["yes", "no"]}}}

    async def go():
        async with app.router.lifespan_context(app):
            assert app.state.service.runner.engine.name == "openvino"
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://batchinfer", timeout=60) as client:
                plain = await asyncio.gather(
                    *[client.post("/v1/completions", json={"prompt": p, "max_tokens": 8}) for p in prompts]
                )
                streamed = await client.post(
                    "/v1/completions", json={"prompt": prompts[0], "max_tokens": 8, "stream": True}
                )
                constrained = await client.post(
                    "/v1/completions", json={"prompt": prompts[1], "max_tokens": 8, "response_format": schema}
                )
        return plain, streamed, constrained

    plain, streamed, constrained = asyncio.run(go())
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    for prompt, answer in zip(prompts, plain):
        assert answer.status_code == 200, answer.text
        expected = generate_alone(tiny_llama, tokenizer(prompt)["input_ids"], 8)
        assert answer.json()["choices"][0]["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    pieces = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(p["choices"][0]["text"] for p in pieces) == plain[0].json()["choices"][0]["text"]
    assert constrained.status_code == 200, constrained.text
    assert constrained.json()["choices"][0]["text"] in ('"yes"', '"no"')


def test_openai_batch_runs_on_the_openvino_engine(tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    from batchinfer.cli import app

    prompts = ["Free entry in 2 a wkly comp", "Ok lar... Joking wif u oni", "U dun say so early hor"]
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": p, "max_tokens": 8}}
        for i, p in enumerate(prompts)
    ]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(
        app, ["openai-batch", str(tmp_path / "requests.jsonl"), "--model", str(tiny_llama), "-o", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "results.jsonl.batchinfer" / "_report.json").read_text())
    assert report["engine"]["name"] == "openvino"
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    answers = {json.loads(line)["custom_id"]: json.loads(line) for line in out.read_text().splitlines()}
    for i, prompt in enumerate(prompts):
        expected = generate_alone(tiny_llama, tokenizer(prompt)["input_ids"], 8)
        text = answers[f"r{i}"]["response"]["body"]["choices"][0]["text"]
        assert text == tokenizer.decode(expected, skip_special_tokens=True)
