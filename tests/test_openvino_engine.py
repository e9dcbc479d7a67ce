"""The OpenVINO GenAI engine (runners/openvino_engine.py) over the tiny random Llama, its conversion built
offline and cached (backends/openvino_causal.py): in f32 the same greedy tokens as the transformers engine, chosen
by generation.engine: auto on a CPU, a fallback with a note where it cannot run the job, one precision per model
and CPU kind (bf16 only where model.dtype asks for it) that a resume keeps, and serve and openai-batch reaching it
through the Engine protocol."""

import asyncio
import json
import threading

import httpx
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import Crash, CrashAfterChunks, generate_alone, generate_job, make_job, prompt_table, stand_in_for_cpu_kind
from typer.testing import CliRunner

from batchinfer.backends.models import resolve_model_path
from batchinfer.backends.openvino import CPU_KINDS
from batchinfer.errors import ConfigError, ModelError, ResumeError
from batchinfer.execution.driver import run_job
from batchinfer.runners import openvino_engine

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
    assert reference["engine"] == {"name": "transformers", "precision": "f32"}
    assert _ran_on(report) == ("openvino", "f32")  # on every CPU kind: bf16 only where model.dtype asks for it
    # the worker's cache may hold other tests' conversions: this model's is among them, and none is made again
    built = {entry: (entry / "openvino_model.bin").stat().st_mtime_ns for entry in _conversions(conversion_cache)}
    assert built
    for entry in built:
        manifest = json.loads((entry / "batchinfer.json").read_text())
        assert {"openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml"} <= set(manifest["files"])
    auto, again = _run(tmp_path, "auto", tiny_llama, generation__engine="auto", model__dtype="float32")
    assert _ran_on(auto) == ("openvino", "f32") and again == expected
    assert {
        entry: (entry / "openvino_model.bin").stat().st_mtime_ns for entry in _conversions(conversion_cache)
    } == built


def test_a_warm_run_loads_no_transformers_weights_beside_the_pipeline(sms_table, tmp_path, tiny_llama, monkeypatch):
    import transformers

    pq.write_table(prompt_table(sms_table, 12), tmp_path / "prompts.parquet")
    _, expected = _run(tmp_path, "cold", tiny_llama)  # converts, unless an earlier test did

    def no_weights(*args, **kwargs):
        raise AssertionError("a warm OpenVINO run loaded the transformers model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    # nor, free rows only, xgrammar's view of the vocabulary (seconds on a real tokenizer)
    monkeypatch.setattr("batchinfer.constrained.grammar.Grammars.__init__", no_weights)
    # the pipeline compiles on a thread of its own while the config and tokenizer load, and is the one used
    compiled, real = [], openvino_engine.pipeline
    monkeypatch.setattr(
        openvino_engine, "pipeline", lambda *a: compiled.append(threading.current_thread().name) or real(*a)
    )
    report, got = _run(tmp_path, "warm", tiny_llama)
    assert report["engine"]["name"] == "openvino" and got == expected
    assert compiled == ["batchinfer-compile"]


def test_an_early_pipeline_is_taken_only_for_what_build_compiles_and_its_failure_is_builds(tmp_path, monkeypatch):
    from batchinfer.job.config import GenerationConfig

    monkeypatch.setattr(openvino_engine, "pipeline", lambda folder, precision, gen: (folder, precision))
    early, gen = openvino_engine.EarlyPipeline(), GenerationConfig()
    early.start(tmp_path, "f32", gen)
    assert early.take(tmp_path, "f32", gen) == (tmp_path, "f32")
    assert early.take(tmp_path, "f32", gen) is None  # taken once
    early.start(tmp_path, "f32", gen)
    assert early.take(tmp_path, "f32", GenerationConfig(engine_options={"max_num_seqs": 8})) is None
    assert early.take(tmp_path, "f32", gen) is None  # another job's compile is dropped, not kept for later
    monkeypatch.setattr(openvino_engine, "pipeline", lambda *a: (_ for _ in ()).throw(ModelError("refused")))
    early.start(tmp_path, "f32", gen)
    with pytest.raises(ModelError, match="refused"):  # raised where build takes it, as its own compile's
        early.take(tmp_path, "f32", gen)


def test_the_generate_runner_imports_no_transformers_engine_where_openvino_runs_the_job():
    """The OpenVINO engine is the default on a CPU: what only the transformers engine uses (its continuous
    batching, the grammar's sampling hooks) is imported by that engine alone, not by every generation job's
    start-up and plan (3 s of a quiet plan's 7 s of start-up on a 2-core EPYC, four times that under load)."""
    import subprocess
    import sys

    heavy = ("transformers.generation.continuous_batching", "batchinfer.constrained.sampling")
    code = (
        "import sys; import batchinfer.runners.generate, batchinfer.runners.openvino_engine; "
        f"print('imported:', [m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "imported: []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_engine_auto_runs_transformers_with_a_note_where_openvino_cannot_run_the_job(
    sms_table, tmp_path, tiny_llama, tiny_gpt2, monkeypatch
):
    pq.write_table(prompt_table(sms_table, 6), tmp_path / "prompts.parquet")
    gpt2, _ = _run(tmp_path, "gpt2", tiny_gpt2)
    assert gpt2["engine"]["name"] == "transformers"
    assert "checked on llama" in gpt2["engine"]["notes"][0] and "not gpt2" in gpt2["engine"]["notes"][0]
    monkeypatch.setattr("batchinfer.runners.openvino_engine.available", lambda: False)
    missing, _ = _run(tmp_path, "missing", tiny_llama)
    assert "openvino-genai is not installed" in missing["engine"]["notes"][0]
    with pytest.raises(ConfigError, match="generation.engine openvino: openvino-genai is not installed"):
        _run(tmp_path, "pinned", tiny_llama, generation__engine="openvino")


SCHEMA = {
    "type": "object",
    "properties": {"why": {"type": "string", "maxLength": 12}, "spam": {"type": "boolean"}},  # in this order
    "required": ["why", "spam"],
}
CONSTRAINTS = {  # each kind, as the job file asks for it
    "choices": {"generation__choices": ["ham", "spam", 'not "sure"']},
    "regex": {"generation__regex": r"[0-9]{2}-[a-z]{1,3}"},
    "schema": {"generation__response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}},
}


def _constrained(tmp_path, name, model, kind, **settings):
    """A constrained job's report, its rows ({id: text}) and its errors ({id: reason})."""
    job = generate_job(
        tmp_path / "prompts.parquet",
        model,
        tmp_path / name,
        model__dtype="float32",
        generation__max_new_tokens=40,
        generation__max_new_tokens_column=None,
        **CONSTRAINTS[kind],
        **settings,
    )
    report = run_job(job)
    rows = ds.dataset(str(tmp_path / name), format="parquet").to_table().to_pylist()
    errors = pq.read_table(tmp_path / name / "_errors").to_pylist() if (tmp_path / name / "_errors").exists() else []
    return report, {r["id"]: r["text"] for r in rows}, {e["id"]: e["reason"] for e in errors}


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_constrained_jobs_run_on_the_openvino_engine_and_answer_as_the_transformers_engine(
    sms_table, tmp_path, tiny_llama, kind
):
    from transformers import AutoTokenizer

    from batchinfer.constrained.grammar import Grammars
    from batchinfer.constrained.spec import job_constraint

    pytest.importorskip("xgrammar")
    pq.write_table(prompt_table(sms_table, 40), tmp_path / "prompts.parquet")
    _, expected, refused = _constrained(tmp_path, "transformers", tiny_llama, kind, generation__engine="transformers")
    report, got, errors = _constrained(tmp_path, "auto", tiny_llama, kind)
    assert report["engine"]["name"] == "openvino" and report["engine"]["precision"] == "f32"
    # greedy in f32 under the same grammar: each row's answer, or the reason it has none, is the transformers engine's
    assert (got, errors) == (expected, refused)
    assert len(got) >= 20 and set(errors.values()) <= {"length", "invalid_output"}
    job = generate_job("-", tiny_llama, "-", **CONSTRAINTS[kind])
    constraint = job_constraint(job.generation)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    grammars = Grammars(tokenizer, len(tokenizer), {tokenizer.eos_token_id}, job.generation.grammar_limits)
    for text in got.values():  # every answer is whole and valid by the project's own check
        assert grammars.complete(constraint, tokenizer.encode(text, add_special_tokens=False), text), text
        assert kind != "schema" or list(json.loads(text)) == ["why", "spam"]  # the schema's order, not sorted


def test_a_grammar_the_pipeline_cannot_take_runs_on_the_transformers_engine_with_a_note(
    sms_table, tmp_path, tiny_llama, monkeypatch
):
    from transformers import AutoTokenizer

    from batchinfer.constrained.grammar import Grammars
    from batchinfer.runners.generate import GenerateRunner

    pytest.importorskip("xgrammar")
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    prompts = [tokenizer(t)["input_ids"] for t in sms_table.column("text").to_pylist()[:8]]

    def answers(engine: str) -> tuple[dict, list, list]:
        """The engine's description and answers for the 8 prompts, every other one held to the schema."""
        settings = {"model__dtype": "float32", "generation__engine": engine, **CONSTRAINTS["schema"]}
        job = generate_job("-", tiny_llama, "-", **settings)
        runner = GenerateRunner.load(job, tiny_llama)
        constraints = [runner.constraint if i % 2 else None for i in range(len(prompts))]
        out = runner.generate(prompts, [24] * len(prompts), 8, constraints=constraints)
        return runner.engine.described, out.text, sorted(out.failed.items())

    _, expected, failed = answers("transformers")
    # xgrammar 0.2's own spelling of an unbounded repeat, which the pipeline's older xgrammar refuses
    monkeypatch.setattr("batchinfer.runners.openvino_engine.portable", lambda grammar: grammar)
    described, got, problems = answers("auto")
    assert described["name"] == "openvino"
    assert any("run on the transformers engine: OpenVINO GenAI's xgrammar refuses" in n for n in described["notes"])
    assert (got, problems) == (expected, failed)  # the free rows ran on the pipeline after it refused the grammar
    monkeypatch.undo()
    built = Grammars.__init__

    def another_reading(self, *args):  # a tokenizer whose bytes for one token the pipeline would read otherwise
        built(self, *args)
        self.vocabulary = [*self.vocabulary[:5], b"?", *self.vocabulary[6:]]

    monkeypatch.setattr(Grammars, "__init__", another_reading)
    described, got, problems = answers("auto")
    assert any("the converted tokenizer reads 1 of" in n for n in described["notes"])
    assert (got, problems) == (expected, failed)


def test_portable_spells_unbounded_repeats_as_openvino_genais_xgrammar_reads_them_and_leaves_literals():
    from batchinfer.runners.openvino_engine import portable

    grammar = 'root ::= (("[" item{0, -1} "{1, -1}" [{2, -1}\\]] digit{1, -1} item{0, 3}))'
    assert portable(grammar) == 'root ::= (("[" item{0,} "{1, -1}" [{2, -1}\\]] digit{1,} item{0, 3}))'


def _ran_on(report) -> tuple[str, str]:
    """The one engine and precision the report's chunks ran on (entries that differ in their notes alone: one)."""
    entries = report["engine"] if isinstance(report["engine"], list) else [report["engine"]]
    (ran,) = {(e["name"], e["precision"]) for e in entries}
    return ran


@pytest.mark.parametrize("kind", list(CPU_KINDS))
def test_generation_runs_one_precision_per_dtype_and_cpu_kind_and_says_which(
    sms_table, tmp_path, tiny_llama, monkeypatch, kind
):
    """dtype auto: f32 on every kind (bf16 changes generated text), with a note on the kinds that have bf16;
    bfloat16: bf16 on OpenVINO where the CPU has it, else the transformers engine in bf16 with the reason; its
    constrained rows run on the transformers engine, as serve's do."""
    stand_in_for_cpu_kind(kind, monkeypatch)
    native = CPU_KINDS[kind][1] == "bf16"
    pq.write_table(prompt_table(sms_table, 6), tmp_path / "prompts.parquet")
    auto, _ = _run(tmp_path, "auto", tiny_llama)
    assert _ran_on(auto) == ("openvino", "f32")
    assert any("model.dtype: bfloat16" in note for note in auto["engine"].get("notes", [])) == native
    opted, _ = _run(tmp_path, "bf16", tiny_llama, model__dtype="bfloat16", generation__choices=["yes", "no"])
    if native:
        assert _ran_on(opted) == ("openvino", "bf16")
        assert any("transformers engine" in note and "bf16" in note for note in opted["engine"]["notes"])
    else:
        assert _ran_on(opted) == ("transformers", "bf16")
        assert "needs a CPU with native bf16" in " ".join(opted["engine"]["notes"])


@pytest.mark.parametrize(
    "resumed,why",
    [
        ({"no_bf16": True}, "would run on transformers in bf16.*BATCHINFER_NO_BF16 is set"),
        ({"no_genai": True}, "would run on transformers in bf16.*openvino-genai is not installed"),
    ],
)
def test_a_generation_job_resumes_on_its_first_engine_and_precision_or_refuses(
    sms_table, tmp_path, tiny_llama, monkeypatch, resumed, why
):
    """Its first chunks ran on OpenVINO in bf16 (an AMX CPU stood in for); a resume that would change the engine
    or the precision refuses before any chunk, naming both and the fix; one that keeps them finishes the folder."""
    stand_in_for_cpu_kind("amx", monkeypatch)
    pq.write_table(prompt_table(sms_table, 12), tmp_path / "prompts.parquet")
    job = lambda **kw: generate_job(  # noqa: E731
        tmp_path / "prompts.parquet", tiny_llama, tmp_path / "out", batching__chunk_rows=4, **kw
    )
    with pytest.raises(Crash):
        run_job(job(model__dtype="bfloat16"), progress=CrashAfterChunks(1))
    with monkeypatch.context() as elsewhere:
        if resumed.get("no_bf16"):
            elsewhere.setenv("BATCHINFER_NO_BF16", "1")
        if resumed.get("no_genai"):
            elsewhere.setattr("batchinfer.runners.openvino_engine.available", lambda: False)
        parts = sorted(p.name for p in (tmp_path / "out").glob("part-*"))
        with pytest.raises(ResumeError, match=f"ran on the openvino engine in bf16.*{why}") as refused:
            run_job(job(model__dtype="bfloat16"))
    assert "--restart" in refused.value.hint
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == parts  # nothing written
    report = run_job(job(model__dtype="bfloat16"))
    assert report["complete"] and report["rows_ok"] == 12 and _ran_on(report) == ("openvino", "bf16")


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


def test_max_num_seqs_is_refused_where_the_pipelines_scheduling_would_ignore_it(tmp_path, monkeypatch):
    """OpenVINO GenAI's default scheduling (dynamic_split_fuse) fills a step with max_num_batched_tokens tokens of
    as many rows as the KV cache holds and ignores max_num_seqs: batchinfer set it to 32 and ran 100 rows at once,
    and a job that set it changed nothing. It is left at the pipeline's own default, passed where the job also
    turns the vLLM-like scheduling on, and refused alone, saying both ways out."""
    import openvino_genai

    from batchinfer.job.config import GenerationConfig
    from batchinfer.runners.openvino_engine import OpenVINOEngine

    built = []
    monkeypatch.setattr(openvino_genai, "ContinuousBatchingPipeline", lambda *args: built.append(args[1]))

    def engine(**options):
        return OpenVINOEngine(tmp_path, GenerationConfig(engine_options=options), ["f32"], {0}, None, None)

    engine()
    engine(max_num_seqs=8, dynamic_split_fuse=False)
    default = openvino_genai.SchedulerConfig()
    assert [(s.dynamic_split_fuse, s.max_num_seqs) for s in built] == [(True, default.max_num_seqs), (False, 8)]
    assert built[0].enable_prefix_caching
    check = openvino_engine.check_scheduling
    for alone in ({"max_num_seqs": 8}, {"max_num_seqs": 8, "dynamic_split_fuse": True}):
        with pytest.raises(ConfigError, match="only with dynamic_split_fuse: false") as info:
            check(alone, 64)
        assert "remove max_num_seqs, or add dynamic_split_fuse: false" in info.value.hint
    with pytest.raises(ConfigError, match=r"^generation.engine_options.dynamic_split_fuse: 0 is no value"):
        check({"max_num_seqs": 8, "dynamic_split_fuse": 0}, 64)  # pybind takes 0 as false; a typo, named
    for value in (-4, "x", 2.5):  # pybind refused them unnamed: an internal error
        with pytest.raises(ConfigError, match=rf"^generation.engine_options.max_num_seqs: {value!r} is no value"):
            engine(max_num_seqs=value, dynamic_split_fuse=False)


def test_a_vllm_like_scheduling_whose_steps_hold_less_than_a_prompt_is_refused_before_a_row_runs(
    sms_table, tmp_path, tiny_llama
):
    """dynamic_split_fuse: false runs each prompt in one step: with steps of fewer tokens than a prompt, the
    pipeline failed every row of the chunk ("Sequence length (69) is longer than max number of tokens in batch
    (64)", SmolLM2) under a hint about the model's device, as it did with steps of fewer tokens than max_num_seqs
    (GenAI asserts it). Refused before the model converts, naming both numbers; steps that hold model.max_length
    run the job."""
    check = openvino_engine.check_scheduling
    vllm_like = {"dynamic_split_fuse": False}
    with pytest.raises(
        ConfigError, match=r"max_num_batched_tokens \(64\) is below max_num_seqs \(100 tokens\)"
    ) as info:
        check(vllm_like | {"max_num_batched_tokens": 64, "max_num_seqs": 100}, 64)  # GenAI asserts it, every row
    assert (
        info.value.hint == "set max_num_batched_tokens to at least 100, or remove dynamic_split_fuse and max_num_seqs"
    )
    with pytest.raises(ConfigError, match=r"\(256, the pipeline's default\) is below a prompt a row may have \(512"):
        check(vllm_like, 512)
    check(vllm_like | {"max_num_batched_tokens": 512, "max_num_seqs": 32}, 512)
    pq.write_table(prompt_table(sms_table, 6), tmp_path / "prompts.parquet")
    short = {"dynamic_split_fuse": False, "max_num_batched_tokens": 16, "max_num_seqs": 4}
    with pytest.raises(
        ConfigError, match=r"max_num_batched_tokens \(16\) is below a prompt a row may have \(64 tokens\)"
    ) as info:
        _run(tmp_path, "short", tiny_llama, model__max_length=64, generation__engine_options=short)
    assert "at least 64" in info.value.hint
    assert not list((tmp_path / "short").glob("part-*"))
    report, _ = _run(
        tmp_path,
        "whole",
        tiny_llama,
        model__max_length=64,
        generation__engine_options=short | {"max_num_batched_tokens": 64},
    )
    assert report["complete"] and report["rows_ok"] == 6 and report["engine"]["name"] == "openvino"


def test_pipelines_are_constructed_one_at_a_time(tmp_path, monkeypatch):
    """GenAI's binding sets the path of its tokenizers library for the length of a construction only: one that
    ended beside another unset it for the other ("Failed to load shared object ... libopenvino_tokenizers.so",
    the early compile beside build's own)."""
    import time

    import openvino_genai

    from batchinfer.job.config import GenerationConfig

    inside, overlaps = [], []

    def constructed(*args):
        overlaps.append(len(inside))
        inside.append(1)
        time.sleep(0.05)
        inside.pop()

    monkeypatch.setattr(openvino_genai, "ContinuousBatchingPipeline", constructed)
    threads = [
        threading.Thread(target=openvino_engine.pipeline, args=(tmp_path, "f32", GenerationConfig())) for _ in range(3)
    ]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    assert overlaps == [0, 0, 0]


def test_an_openvino_property_the_device_refuses_is_named_as_the_jobs_not_blamed_on_the_model(
    sms_table, tmp_path, tiny_llama
):
    """OpenVINO's own words name the property; the message said the cached model could not load, which invites
    deleting the cache, and gave no fix."""
    pq.write_table(prompt_table(sms_table, 2), tmp_path / "prompts.parquet")
    for options, said in (({"KV_CACHE_PRECISION": "u9"}, "Wrong value u9"), ({"NO_SUCH_KEY": 1}, "Unsupported")):
        key = next(iter(options))
        with pytest.raises(ConfigError, match=rf"^generation.engine_options.{key}: OpenVINO refuses .*{said}") as info:
            _run(tmp_path, key, tiny_llama, generation__engine_options=options)
        assert info.value.hint.startswith(f"check {key}'s name and value") and "cannot load" not in info.value.message


def test_a_folder_auto_started_on_transformers_goes_on_there_where_openvino_would_now_run(
    sms_table, tmp_path, tiny_llama, monkeypatch
):
    """bfloat16 on an AVX2 CPU ran on the transformers engine (auto's choice there); resumed on a bf16 CPU, where auto
    would take OpenVINO GenAI, the job keeps to the engine its first chunks ran on and finishes."""
    stand_in_for_cpu_kind("avx2", monkeypatch)
    pq.write_table(prompt_table(sms_table, 12), tmp_path / "prompts.parquet")
    job = generate_job(
        tmp_path / "prompts.parquet", tiny_llama, tmp_path / "out", batching__chunk_rows=4, model__dtype="bfloat16"
    )
    with pytest.raises(Crash):
        run_job(job, progress=CrashAfterChunks(1))
    stand_in_for_cpu_kind("amx", monkeypatch)
    report = run_job(job)
    assert report["complete"] and report["rows_ok"] == 12 and _ran_on(report) == ("transformers", "bf16")
