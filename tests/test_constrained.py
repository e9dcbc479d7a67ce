"""Constrained generation: every output of a json_schema, choices or regex job is complete and valid, or
its row is an error with a reason; OpenAI Batch lines bring their own response_format; serve answers
the same as offline."""

import asyncio
import json
import re
from functools import partial

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_job, write_job
from helpers import read_output as _read
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.constrained.spec import job_constraint
from batchinfer.errors import ConfigError
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job, validate_with_overrides

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    # not in sorted order: the properties come out in the schema's order (a reasoning before its answer)
    "properties": {"why": {"type": "string", "maxLength": 12}, "spam": {"type": "boolean"}},
    "required": ["why", "spam"],
    "additionalProperties": False,
}
CHOICES = ["ham", "spam", 'not "sure"']
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}


def _prompts(tmp_path, sms_table, n=24):
    path = tmp_path / "prompts.parquet"
    pq.write_table(
        pa.table({"id": [f"p{i}" for i in range(n)], "text": sms_table.column("text").to_pylist()[:n]}), path
    )
    return path


_generate = partial(
    make_job,
    task="generate",
    input__id="id",
    input__keep=None,
    model__max_length=96,
    model__backend=None,
    model__chat=False,  # prompts as written, as serve's /v1/completions sends them
    batching=None,
    generation__max_new_tokens=40,
)


def _results(out):
    table = _read(out).to_pylist()
    errors = pq.read_table(out / "_errors").to_pylist() if (out / "_errors").exists() else []
    return {r["id"]: r for r in table}, {e["id"]: e for e in errors}


@pytest.mark.parametrize("engine", ["transformers", "static"])
def test_every_json_schema_output_validates_or_its_row_says_why(tmp_path, sms_table, tiny_llama, engine):
    prompts = _prompts(tmp_path, sms_table)
    run_job(
        _generate(
            prompts, tiny_llama, tmp_path / "out", generation__engine=engine, generation__response_format=JSON_SCHEMA
        )
    )
    ok, errors = _results(tmp_path / "out")
    assert len(ok) + len(errors) == 24 and len(ok) >= 6  # the schema leaves a random model room to finish
    for row in ok.values():
        jsonschema.validate(json.loads(row["text"]), SCHEMA)  # strict JSON: no raw control characters
        assert list(json.loads(row["text"])) == ["why", "spam"]  # the schema's order (it was sorted)
        assert row["finish_reason"] == "stop"
    # invalid_output: a random model can spell broken UTF-8 in byte tokens, which xgrammar lets into a
    # bounded string; the final check catches it
    assert {e["reason"] for e in errors.values()} <= {"length", "invalid_output"}
    run_job(
        _generate(
            prompts,
            tiny_llama,
            tmp_path / "short",
            generation__engine=engine,
            generation__response_format=JSON_SCHEMA,
            generation__max_new_tokens=3,
        )
    )
    ok, errors = _results(tmp_path / "short")
    assert not ok and {e["reason"] for e in errors.values()} == {"length"}  # 3 tokens never close the object
    assert "max_new_tokens (3) cut the output before it was JSON that follows the schema" in errors["p0"]["message"]
    assert "with --restart, since --retry-errors keeps" in errors["p0"]["message"]  # a retry refused the raise


def test_a_schemas_key_order_is_in_the_fingerprint(tmp_path, sms_table, tiny_llama):
    """The grammar generates the properties in the schema's order, so a folder of one order is not resumed with
    another; a schema given sorted fingerprints as before (every schema compiled sorted then)."""
    from batchinfer.job.plan import SCHEMA_ORDER, describe_changes, fingerprint

    def fingerprinted(schema):
        response_format = {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}
        job = _generate(
            _prompts(tmp_path, sms_table), tiny_llama, tmp_path / "o", generation__response_format=response_format
        )
        return fingerprint(job, "hash", {})

    reordered = {**SCHEMA, "properties": dict(reversed(SCHEMA["properties"].items()))}
    changes = describe_changes(fingerprinted(SCHEMA), fingerprinted(reordered))
    assert list(changes) == [SCHEMA_ORDER] and "keys are in another order" in changes[SCHEMA_ORDER]
    given_sorted = fingerprinted(json.loads(json.dumps(SCHEMA, sort_keys=True)))
    assert SCHEMA_ORDER not in given_sorted  # as every fingerprint was: a folder of it resumes
    # ... and so does one written as usual, "type" first: only its properties' order is generated
    usual = {"type": "object", "properties": dict(sorted(SCHEMA["properties"].items())), "required": ["why"]}
    assert SCHEMA_ORDER not in fingerprinted(usual)
    assert "sorted order" in describe_changes(given_sorted, fingerprinted(SCHEMA))[SCHEMA_ORDER]


def test_choices_and_regex_are_always_kept_and_both_engines_agree(tmp_path, sms_table, tiny_llama):
    prompts = _prompts(tmp_path, sms_table)
    texts = {}
    for engine in ("transformers", "static"):
        run_job(
            _generate(prompts, tiny_llama, tmp_path / engine, generation__engine=engine, generation__choices=CHOICES)
        )
        ok, errors = _results(tmp_path / engine)
        assert len(ok) == 24 and not errors
        texts[engine] = [ok[f"p{i}"]["text"] for i in range(24)]
        assert set(texts[engine]) <= set(CHOICES)
    assert texts["transformers"] == texts["static"]  # greedy, the same masks: the same answers
    run_job(
        _generate(
            prompts,
            tiny_llama,
            tmp_path / "regex",
            generation__regex=r"[0-9]{2}-[a-z]{1,3}",
            generation__max_new_tokens=12,
        )
    )
    ok, errors = _results(tmp_path / "regex")
    assert len(ok) == 24 and all(re.fullmatch(r"[0-9]{2}-[a-z]{1,3}", r["text"]) for r in ok.values())
    run_job(_generate(prompts, tiny_llama, tmp_path / "object", generation__response_format={"type": "json_object"}))
    ok, errors = _results(tmp_path / "object")
    assert all(isinstance(json.loads(r["text"]), dict) for r in ok.values())
    assert len(ok) + len(errors) == 24 and {e["reason"] for e in errors.values()} <= {"length"}


def test_bad_or_uncompilable_constraints_name_their_key(tmp_path, sms_table, tiny_llama):
    prompts = _prompts(tmp_path, sms_table, n=2)
    with pytest.raises(ConfigError, match="generation.response_format: xgrammar cannot compile this schema: Unsupp"):
        run_job(
            _generate(prompts, tiny_llama, tmp_path / "a", generation__response_format=_with_schema({"type": "strin"}))
        )
    with pytest.raises(ConfigError, match="generation.regex: xgrammar cannot compile this regex"):
        run_job(_generate(prompts, tiny_llama, tmp_path / "b", generation__regex="(ab"))
    # validate refuses them as the run does, without the model (it said ok, and every run then refused)
    for key, value, said in (
        ("regex", "[a-", "generation.regex: xgrammar cannot compile this regex: Regex parsing error"),
        ("response_format", _with_schema({"type": "strin"}), "generation.response_format: xgrammar cannot compile"),
    ):
        job = write_job(tmp_path, _generate(prompts, tiny_llama, tmp_path / "v", raw=True, generation={key: value}))
        result = CliRunner().invoke(app, ["validate", str(job)])
        assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, result.output
    job = write_job(tmp_path, _generate(prompts, tiny_llama, tmp_path / "v", raw=True, generation__regex="(ab|c)"))
    assert CliRunner().invoke(app, ["validate", str(job)]).exit_code == 0
    # a job file's constraint cleared from the command line: choices=[] was refused and null not a list
    raw = _generate(prompts, tiny_llama, tmp_path / "v", raw=True, generation__choices=CHOICES)
    assert job_constraint(validate_job(raw).generation).kind == "choices"
    assert job_constraint(validate_with_overrides(raw, ["generation.choices=null"], "job.yaml").generation) is None
    for settings, said in (
        ({"response_format": {"type": "xml"}}, "type must be text, json_object or json_schema"),
        ({"response_format": {"type": "json_schema"}}, "json_schema.schema must be a JSON schema object"),
        ({"choices": ["a"], "regex": "a"}, "give one of response_format, choices and regex"),
        ({"choices": ["a", "a"]}, "each choice once"),
        ({"choices": ["a", "b"], "stop": ["\n"]}, "a stop string could cut the choices output"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            _generate(prompts, tiny_llama, tmp_path / "c", generation=settings)


def _with_schema(schema):
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _request(custom_id, url, **body):
    if url == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m", **body}})


def test_openai_batch_lines_with_response_format_are_answered(tmp_path, tiny_llama):
    lines = [
        _request("schema", "/v1/chat/completions", prompt="Free prize, call now", response_format=JSON_SCHEMA),
        _request("object", "/v1/completions", prompt="Are you home?", response_format={"type": "json_object"}),
        _request("text", "/v1/completions", prompt="Are you home?", response_format={"type": "text"}, max_tokens=5),
        _request("bad", "/v1/completions", prompt="x", response_format=_with_schema({"$ref": "#/$defs/none"})),
        _request("stop", "/v1/completions", prompt="x", response_format={"type": "json_object"}, stop="}"),
        _request("kind", "/v1/completions", prompt="x", response_format={"type": "yaml"}),
        _request("many", "/v1/completions", prompt="x", response_format=_with_schema({"enum": list(range(6000))})),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    job = {
        "input": {"path": str(path), "format": "openai"},
        "model": {"path": str(tiny_llama), "task": "generate"},
        "generation": {"max_new_tokens": 60},
        "output": {"path": str(tmp_path / "out"), "format": "openai"},
    }
    run_job(validate_job(job))
    answered = {json.loads(line)["custom_id"]: json.loads(line) for line in (tmp_path / "out" / "output.jsonl").open()}
    failed = {json.loads(line)["custom_id"]: json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").open()}
    assert set(answered) | set(failed) == {"schema", "object", "text", "bad", "stop", "kind", "many"}
    content = answered["schema"]["response"]["body"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), SCHEMA)
    if "object" in answered:  # or an error line with reason length
        assert isinstance(json.loads(answered["object"]["response"]["body"]["choices"][0]["text"]), dict)
    else:
        assert failed["object"]["error"]["code"] == "length"
    assert "text" in answered  # type text: free text, as OpenAI reads it
    assert failed["bad"]["error"]["code"] == "bad_request"
    assert failed["bad"]["error"]["message"].startswith("body.response_format: xgrammar cannot compile this schema")
    assert "a stop string could cut" in failed["stop"]["error"]["message"]
    assert "body.response_format.type must be" in failed["kind"]["error"]["message"]
    assert failed["many"]["error"]["code"] == "bad_request"  # refused before it compiles
    assert "6,000 values to choose between, past generation.grammar_max_choices" in failed["many"]["error"]["message"]


def test_serve_answers_constrained_requests_as_the_offline_job(tmp_path, sms_table, tiny_llama):
    pytest.importorskip("fastapi")
    import httpx

    from batchinfer.backends.models import resolve_model_path
    from batchinfer.serve import create_app

    prompts = _prompts(tmp_path, sms_table, n=4)
    run_job(_generate(prompts, tiny_llama, tmp_path / "choices", generation__choices=CHOICES))
    run_job(_generate(prompts, tiny_llama, tmp_path / "schema", generation__response_format=JSON_SCHEMA))
    offline = {kind: _results(tmp_path / kind)[0] for kind in ("choices", "schema")}
    texts = sms_table.column("text").to_pylist()[:4]
    job = _generate(
        prompts, tiny_llama, tmp_path / "unused", generation__choices=CHOICES
    )  # the server's default constraint

    async def go():
        app = create_app(job, resolve_model_path(job.model.path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://b", timeout=60) as client:
                default = [await client.post("/v1/completions", json={"prompt": t}) for t in texts]
                schema = [
                    await client.post("/v1/completions", json={"prompt": t, "response_format": JSON_SCHEMA})
                    for t in texts
                ]
                short = await client.post(
                    "/v1/completions", json={"prompt": texts[0], "response_format": JSON_SCHEMA, "max_tokens": 3}
                )
                bad = await client.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "x"}], "response_format": _with_schema({"type": 1})},
                )
                events = []
                async with client.stream(
                    "POST", "/v1/completions", json={"prompt": texts[1], "response_format": JSON_SCHEMA, "stream": True}
                ) as streamed:
                    async for line in streamed.aiter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            events.append(json.loads(line[6:]))
                return default, schema, short, bad, events

    default, schema, short, bad, events = asyncio.run(go())
    for i, answer in enumerate(default):
        assert answer.json()["choices"][0]["text"] == offline["choices"][f"p{i}"]["text"]
    for i, answer in enumerate(schema):
        if f"p{i}" in offline["schema"]:
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["text"] == offline["schema"][f"p{i}"]["text"]
        else:
            assert answer.status_code == 422 and answer.json()["error"]["code"] == "length"
    assert short.status_code == 422 and short.json()["error"]["code"] == "length"
    assert bad.status_code == 400 and "xgrammar cannot compile this schema" in bad.json()["error"]["message"]
    # the stream ends as the plain answer does: finished, or an error event naming the reason
    if schema[1].status_code == 200:
        assert events[-1]["choices"][0]["finish_reason"] == "stop"
        assert len("".join(e["choices"][0]["text"] for e in events)) == len(schema[1].json()["choices"][0]["text"])
    else:
        assert events[-1]["error"]["code"] == schema[1].json()["error"]["code"]


def _nested(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _grammars(tiny_llama, **limits):
    from transformers import AutoTokenizer

    from batchinfer.constrained.grammar import Grammars
    from batchinfer.constrained.spec import GrammarLimits

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    settings = {"seconds": 10.0, "bytes": 1 << 18, "depth": 64, "choices": 5000, **limits}
    return Grammars(tokenizer, len(tokenizer), {tokenizer.eos_token_id}, GrammarLimits(**settings))


def test_a_constraint_past_the_size_limits_is_refused_before_it_compiles(tmp_path, sms_table, tiny_llama):
    from batchinfer.constrained.grammar import Uncompilable
    from batchinfer.constrained.spec import choices, response_format

    grammars = _grammars(tiny_llama, depth=20, choices=50, bytes=4000)
    deep = response_format(_with_schema(_nested(300)), "body.response_format")[0]  # 17 s to compile, unbounded
    assert response_format(_with_schema(_nested(3000)), "body.response_format")[1].endswith(
        "nests too deep to read; flatten it"
    )
    enum = response_format(_with_schema({"enum": [f"v{i}" for i in range(60)]}), "body.response_format")[0]
    for constraint, said in (
        (deep, "body.response_format: this schema is too large to compile: "),
        (enum, "60 values to choose between, past generation.grammar_max_choices (50)"),
        (choices([f"choice {i}" for i in range(400)], "generation.choices"), "past generation.grammar_max_bytes"),
    ):
        with pytest.raises(Uncompilable, match=re.escape(said)):
            grammars.compile(constraint)
    with pytest.raises(Uncompilable, match=r"it nests \d+ deep, past generation.grammar_max_depth \(20\)"):
        grammars.compile(response_format(_with_schema(_nested(12)), "x")[0])
    grammars.compile(response_format(_with_schema(_nested(4)), "x")[0])  # within them: compiled
    prompts = _prompts(tmp_path, sms_table, n=2)
    with pytest.raises(ConfigError, match=re.escape("generation.response_format: this schema is too large")):
        run_job(
            _generate(
                prompts,
                tiny_llama,
                tmp_path / "deep",
                generation__response_format=_with_schema(_nested(40)),
                generation__grammar_max_depth=16,
            )
        )


def test_each_schema_compiles_once_within_the_time_limit_and_the_cache_is_bounded(tiny_llama, monkeypatch):
    import threading
    import time

    from batchinfer.constrained import grammar
    from batchinfer.constrained.grammar import Grammars, Uncompilable
    from batchinfer.constrained.spec import choices, response_format

    monkeypatch.setattr(grammar, "CACHE_BYTES", 300_000)
    grammars = _grammars(tiny_llama, seconds=0.2)
    compiled, compile = [], Grammars._compile

    def slow(self, constraint, loose):
        compiled.append(constraint)
        time.sleep(0.5)
        return compile(self, constraint, loose)

    monkeypatch.setattr(Grammars, "_compile", slow)
    schema = response_format(JSON_SCHEMA, "response_format")[0]
    outcomes = []

    def ask():
        try:
            outcomes.append(grammars.compile(schema))
        except Uncompilable as exc:
            outcomes.append(str(exc))

    askers = [threading.Thread(target=ask) for _ in range(3)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    said = "response_format: xgrammar took longer than generation.grammar_seconds (0.2 s) to compile this schema"
    assert outcomes == [said + "; simplify it"] * 3
    monkeypatch.setattr(Grammars, "_compile", compile)
    deadline = time.monotonic() + 30
    while not grammars.compiler.get_cache_size_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)  # the compile goes on, and what it compiled is kept
    assert compiled == [schema] and grammars.compiler.get_cache_size_bytes() > 0
    assert grammars.compile(schema) is not None
    for n in range(8):  # distinct grammars of about 100 kB each: xgrammar's cache keeps within its bound
        grammars.compile(choices([f"option {n} {i}" for i in range(1000)], "generation.choices"))
    assert grammars.compiler.cache_limit_bytes == 300_000
    assert 0 < grammars.compiler.get_cache_size_bytes() <= 400_000


def test_serve_compiles_off_the_event_loop_once_per_schema_and_within_the_limits(
    tmp_path, sms_table, tiny_llama, monkeypatch
):
    pytest.importorskip("fastapi")
    import time

    import httpx

    from batchinfer.backends.models import resolve_model_path
    from batchinfer.constrained.grammar import Grammars
    from batchinfer.serve import create_app

    calls, seen, compile = [], set(), Grammars._compile

    def slow(self, constraint, loose):  # as long as a large schema's compile, off the GIL as xgrammar's is
        started = time.monotonic()
        if (constraint, loose) not in seen:  # later calls find it in xgrammar's cache
            seen.add((constraint, loose))
            time.sleep(2.0 if "slow" in constraint.spec else 0.6)
        calls.append((constraint, started, time.monotonic()))
        return compile(self, constraint, loose)

    monkeypatch.setattr(Grammars, "_compile", slow)
    job = _generate(
        _prompts(tmp_path, sms_table, n=1),
        tiny_llama,
        tmp_path / "unused",
        generation__grammar_seconds=1.2,
        generation__grammar_max_depth=16,
    )
    slow_schema = _with_schema({"type": "object", "properties": {"slow": {"type": "boolean"}}})

    async def go():
        app = create_app(job, resolve_model_path(job.model.path))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://b", timeout=60) as client:
                post = lambda schema: client.post(  # noqa: E731
                    "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "response_format": schema}
                )
                same = [asyncio.ensure_future(post(JSON_SCHEMA)) for _ in range(3)]
                await asyncio.sleep(0.1)
                health = await client.get("/health")
                answered = time.monotonic()
                return (
                    await asyncio.gather(*same),
                    health,
                    answered,
                    await post(slow_schema),
                    await post(_with_schema(_nested(20))),
                )

    same, health, answered, too_slow, too_deep = asyncio.run(go())
    (first, compiled), *later = sorted((start, end) for c, start, end in calls if '"spam"' in c.spec)
    assert all(start >= compiled for start, _ in later)  # the three requests shared one compile
    assert [a.status_code for a in same] == [422] * 3  # 2 tokens: cut short (length)
    assert health.status_code == 200 and answered < compiled  # answered while the schema compiled
    assert too_slow.status_code == 400
    assert "xgrammar took longer than generation.grammar_seconds (1.2 s)" in too_slow.json()["error"]["message"]
    assert (
        too_deep.status_code == 400 and "past generation.grammar_max_depth (16)" in too_deep.json()["error"]["message"]
    )


def test_refused_at_names_the_first_token_the_masks_refuse(tiny_llama):
    """What the OpenVINO engine's note quotes when the pipeline's masks let a row through that batchinfer's refuse:
    the first refused token, not a guess at why."""
    from transformers import AutoTokenizer

    from batchinfer.constrained.spec import choices

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    grammars = _grammars(tiny_llama)
    constraint = choices(["ham", "spam"], "generation.choices")
    spam = tokenizer.encode("spam", add_special_tokens=False)
    assert grammars.refused_at(constraint, spam) is None  # an answer
    assert grammars.refused_at(constraint, spam[:1]) is None  # the start of one
    ham_then_more = tokenizer.encode("ham", add_special_tokens=False) + tokenizer.encode(
        "xyz", add_special_tokens=False
    )
    assert grammars.refused_at(constraint, ham_then_more) == len(tokenizer.encode("ham", add_special_tokens=False))
