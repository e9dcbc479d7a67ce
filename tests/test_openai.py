"""OpenAI Batch API files run locally: request lines as OpenAI's documentation writes them in,
response lines in OpenAI's batch output shape out, errors as lines, resume without repeats."""

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import Crash
from helpers import generate_alone as _alone
from typer.testing import CliRunner

from batchinfer.cli import app
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai" / "requests.jsonl"
runner = CliRunner()


def _requests(tmp_path, extra_lines=()):
    path = tmp_path / "requests.jsonl"
    path.write_text(EXAMPLE.read_text() + "".join(line + "\n" for line in extra_lines))
    return path


BAD_LINES = [
    '{"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [',
    json.dumps({"custom_id": "wrong-url", "method": "POST", "url": "/v1/images", "body": {}}),
    json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}),
    json.dumps(
        {"custom_id": "bad-messages", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": "hi"}}
    ),
    json.dumps(
        {
            "custom_id": "completion",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "x", "prompt": "Free entry in 2 a wkly comp", "max_tokens": 5, "stop": "\n"},
        }
    ),
]


def test_openai_batch_command_writes_openai_shaped_lines(tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    requests = _requests(tmp_path, BAD_LINES)
    result = runner.invoke(
        app, ["openai-batch", str(requests), "--model", str(tiny_llama), "-o", str(tmp_path / "results.jsonl"), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 3 responses" in result.output and "4 failed requests" in result.output
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["request-1", "request-2", "completion"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    for line, source in zip(lines[:2], EXAMPLE.read_text().splitlines()):
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == str(tiny_llama)
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
        messages = json.loads(source)["body"]["messages"]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        expected = _alone(tiny_llama, tokenizer(prompt, add_special_tokens=False)["input_ids"], 1000)
        assert choice["message"]["content"] == tokenizer.decode(expected, skip_special_tokens=True)
        usage = body["usage"]
        assert usage["completion_tokens"] == len(expected)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    completion = lines[2]["response"]["body"]
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] <= 5
    assert "\n" not in completion["choices"][0]["text"]
    errors = [json.loads(line) for line in (tmp_path / "results.errors.jsonl").read_text().splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("broken", "bad_json"),
        ("wrong-url", "bad_request"),
        (None, "bad_request"),
        ("bad-messages", "bad_request"),
    ]
    assert all(e["response"] is None and e["error"]["message"] for e in errors)
    # a line without a custom_id is named by its place: the 5th line of the file
    assert errors[2]["error"]["message"] == "custom_id is missing (line 5 of requests.jsonl)"


def test_embeddings_requests(tmp_path, tiny_embed):
    lines = [
        _embedding_request(f"e{i}", text)
        for i, text in enumerate(["Ok lar... Joking wif u oni...", "Free entry in 2 a wkly comp"])
    ]
    path = tmp_path / "embed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "out.jsonl"), "-q"]
    )
    assert result.exit_code == 0, result.output
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    body = out[0]["response"]["body"]
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert len(body["data"][0]["embedding"]) == 32 and body["usage"]["prompt_tokens"] > 0
    assert "no failed request (so no errors file)" in result.output and not (tmp_path / "out.errors.jsonl").exists()
    work = tmp_path / "out.jsonl.batchinfer"  # the checkpoint stays, but no second copy of the results in it
    assert not list(work.glob("*.jsonl")) and "keeps the checkpoint: a rerun resumes from it" in result.output
    again = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "out.jsonl")])
    assert again.exit_code == 0 and (tmp_path / "out.jsonl").read_text().splitlines()[0].startswith('{"id"')


def _killed_in_third_chunk(path, model, out, chunk_rows: int):
    """Run the request file `path` as a job until it crashes in its third chunk; returns the job, to resume."""
    job = validate_job(
        {
            "input": {"path": str(path), "format": "openai"},
            "model": {"path": str(model), "task": "generate"},
            "batching": {"chunk_rows": chunk_rows},
            "output": {"path": str(out), "format": "openai"},
        }
    )
    calls = {"n": 0}

    def die_in_third_chunk(runner):
        original = runner.generate

        def generate(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 3:
                raise Crash()
            return original(*args, **kwargs)

        runner.generate = generate
        return runner

    with pytest.raises(Crash):
        run_job(job, on_runner=die_in_third_chunk)
    return job


def test_resume_neither_repeats_nor_loses_a_custom_id(tmp_path, tiny_llama):
    lines = [_completion(f"r{i}", f"message number {i}", model="x", max_tokens=4) for i in range(40)]
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    job = _killed_in_third_chunk(path, tiny_llama, tmp_path / "out", chunk_rows=10)
    assert not (tmp_path / "out" / "output.jsonl").exists()
    report = run_job(job)
    assert report["run"]["rows"] == 20 and report["openai"] == {"output.jsonl": 40, "errors.jsonl": 0}
    ids = [json.loads(line)["custom_id"] for line in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    assert ids == [f"r{i}" for i in range(40)]


def test_a_request_longer_than_max_length_is_a_too_long_error_line_never_a_cut_answer(tmp_path, tiny_llama):
    """An OpenAI response line has no `truncated` field: a prompt cut to its last max_length tokens was answered
    as if whole. It is now that request's too_long error line (the others answered), and truncation: true, which
    would cut it, is refused for input.format openai."""
    lines = [_completion("short", "Free entry", max_tokens=2), _completion("long", "word " * 40, max_tokens=2)]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    command = ["openai-batch", str(path), "-m", str(tiny_llama), "-o", str(out), "-q", "--set", "model.max_length=16"]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["short"]
    (failed,) = map(json.loads, (tmp_path / "results.errors.jsonl").read_text().splitlines())
    assert failed["custom_id"] == "long" and failed["error"]["code"] == "too_long"
    refused = runner.invoke(app, [*command, "--set", "model.truncation=true", "--restart"])
    assert refused.exit_code == 2 and "cannot say so" in refused.output, refused.output
    # given room, --retry-errors answers it, in its place among the file's lines
    retried = runner.invoke(app, [*command[:-1], "model.max_length=256", "--retry-errors"])
    assert retried.exit_code == 0, retried.output
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["short", "long"]
    assert not (tmp_path / "results.errors.jsonl").exists()


def test_openai_config_errors(tmp_path):
    from batchinfer.errors import ConfigError

    with pytest.raises(ConfigError, match="text, messages and id come from the request lines"):
        validate_job(
            {
                "input": {"path": "x", "format": "openai", "text": "t"},
                "model": {"path": "m", "task": "generate"},
                "output": {"path": "o"},
            }
        )
    with pytest.raises(ConfigError, match="set input.format: openai"):
        validate_job(
            {
                "input": {"path": "x", "text": "t"},
                "model": {"path": "m", "task": "generate"},
                "output": {"path": "o", "format": "openai"},
            }
        )
    result = runner.invoke(
        app, ["openai-batch", str(tmp_path / "none.jsonl"), "-m", "m", "-o", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code == 1 and "error:" in result.output and "Traceback" not in result.output


def _embedding_request(custom_id, text):
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": text},
        }
    )


def test_repeated_custom_ids_and_hostile_lines_become_error_lines(tmp_path, tiny_embed):
    lines = [_embedding_request("dup", f"repeat {i}") for i in range(1000)]
    lines += [_embedding_request(f"u{i}", f"unique {i}") for i in range(5)]
    lines += [
        '{"custom_id": "deep", "body": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"custom_id": "surrogate", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a \\ud800"}}',
        '{"custom_id": "huge", "method": "POST", "url": "/v1/embeddings", "body": {"input": "' + "x" * 20000 + '"}}',
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app,
        [
            "openai-batch",
            str(path),
            "-m",
            str(tiny_embed),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--set",
            "input.max_line_bytes=16384",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    responses = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    out = [line["custom_id"] for line in responses]
    assert out == ["dup"] + [f"u{i}" for i in range(5)]  # one response per custom_id, the first request's
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    ids = [line["id"] for line in responses + errors]
    assert len(set(ids)) == len(ids) == 6 + 1002  # a duplicate_id line has an id of its own
    codes = [(e["custom_id"], e["error"]["code"]) for e in errors]
    assert codes == [("dup", "duplicate_id")] * 999 + [
        ("deep", "bad_json"),
        ("surrogate", "bad_utf8"),
        ("huge", "too_long"),
    ]
    assert "repeats line 1 of requests.jsonl" in errors[0]["error"]["message"]


def test_an_existing_response_file_is_replaced_only_if_batchinfer_wrote_it(tmp_path, tiny_embed):
    path = tmp_path / "requests.jsonl"
    path.write_text(_embedding_request("a", "hello") + "\n")
    (tmp_path / "out.jsonl").write_text("my own notes\n")
    command = ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "out.jsonl"), "-q"]
    result = runner.invoke(app, command)
    assert result.exit_code == 1 and "was not written by batchinfer" in result.output
    assert (tmp_path / "out.jsonl").read_text() == "my own notes\n" and not (tmp_path / "out.jsonl.batchinfer").exists()
    (tmp_path / "out.jsonl").unlink()
    result = runner.invoke(app, command)
    assert result.exit_code == 0 and f"wrote 1 response to {tmp_path / 'out.jsonl'} and no failed" in result.output
    assert runner.invoke(app, command + ["--restart"]).exit_code == 0  # its own file: replaced
    assert json.loads((tmp_path / "out.jsonl").read_text())["custom_id"] == "a"
    path.write_text(_embedding_request("b", "") + "\n")  # every request fails: no results file is written
    (tmp_path / "out.jsonl").unlink()
    result = runner.invoke(app, command[:-1] + ["-o", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 0 and "wrote no response (every request failed, so no results file) and 1 failed" in (
        result.output.replace("\n", " ")
    ), result.output
    assert not (tmp_path / "none.jsonl").exists() and (tmp_path / "none.errors.jsonl").exists()
    (tmp_path / "folder").mkdir()
    result = runner.invoke(app, command[:4] + ["-o", str(tmp_path / "folder"), "-q"])
    assert result.exit_code == 1 and "is a folder" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "body, said",
    [
        ({"prompt": "t", "stop": 5}, "body.stop: must be a string or a list of strings (got 5)"),
        ({"prompt": "t", "stop": ["a", 5]}, "body.stop: must be a string or a list of strings (got ['a', 5])"),
        ({"prompt": "t", "max_tokens": -3}, f"body.max_tokens: must be a whole number from 1 to {2**63 - 1} (got -3)"),
        ({"prompt": "t", "max_tokens": 0}, f"body.max_tokens: must be a whole number from 1 to {2**63 - 1} (got 0)"),
        ({"prompt": "t", "max_tokens": True}, "body.max_tokens: input should be a valid integer (got True)"),
        ({"prompt": "t", "max_tokens": 10**30}, f"body.max_tokens: must be a whole number from 1 to {2**63 - 1} (got"),
        ({"prompt": "t", "top_p": 5}, "body.top_p: must be a number above 0 and at most 1 (got 5)"),
        ({"prompt": "t", "top_p": 0}, "body.top_p: must be a number above 0 and at most 1 (got 0)"),
        ({"prompt": "t", "temperature": -1}, "body.temperature: must be a number from 0 to 2 (got -1)"),
        ({"prompt": "t", "temperature": float("nan")}, "body.temperature: must be a number from 0 to 2 (got nan)"),
        ({"prompt": "t", "temperature": "0.5"}, "body.temperature: input should be a valid number (got '0.5')"),
        ({"prompt": "t", "seed": 2**70}, f"body.seed: must be a whole number from 0 to {2**63 - 1} (got"),
        ({"prompt": "t", "seed": -1}, f"body.seed: must be a whole number from 0 to {2**63 - 1} (got -1)"),
        ({"prompt": "t", "n": 0}, f"body.n: must be a whole number from 1 to {2**63 - 1} (got 0)"),
        ({"prompt": 5}, "body.prompt: must be a text or a list of texts, not a number (got 5)"),
        ({"prompt": None}, "body.prompt: must be a text or a list of texts, not null (got None)"),
        ({"prompt": ["a", 5]}, "body.prompt[1]: input should be a valid string (got 5)"),
        ({"prompt": [[1, 2], [3]]}, "body.prompt: token-id lists are not accepted; send the text itself, a string"),
        ({"prompt": ["x"] * 2049}, "body.prompt: 2,049 texts, more than the 2,048 one request may hold; split it"),
        ({"prompt": []}, "body.prompt: an empty list; give a text or a list of texts"),
    ],
)
def test_a_bad_setting_is_that_requests_error_line(body, said):
    from batchinfer.openai_compat.batch_files import parse_request

    record = {"custom_id": "r", "method": "POST", "url": "/v1/completions", "body": body}
    reason, message = parse_request(record)[1]
    assert reason == "bad_request" and message.startswith(said), message


def test_a_model_that_cannot_run_the_files_url_says_where_the_task_came_from(tmp_path, tiny_embed):
    path = tmp_path / "mixed.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": chat},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {"input": "hi"}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 1 and "follows from the url of the first request" in result.output
    assert not (tmp_path / "r.jsonl.batchinfer").exists()
    result = runner.invoke(
        app, ["openai-batch", str(path), "-m", str(tmp_path / "nope"), "-o", str(tmp_path / "r.jsonl")]
    )
    assert result.exit_code == 2 and "follows from the url" not in result.output  # not the url's fault
    assert "no folder at" in result.output


CHAT_URL = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "url, body, said",
    [
        (CHAT_URL, {"messages": HI, "logprobs": True}, "unsupported: logprobs (no log-probabilities"),
        (CHAT_URL, {"messages": HI, "top_logprobs": 3}, "unsupported: top_logprobs"),
        (CHAT_URL, {"messages": HI, "n": 2}, "unsupported: n (one completion per request"),
        (CHAT_URL, {"messages": HI, "presence_penalty": 0.5}, "unsupported: presence_penalty"),
        (CHAT_URL, {"messages": HI, "frequency_penalty": -1}, "unsupported: frequency_penalty"),
        (CHAT_URL, {"messages": HI, "logit_bias": {"50256": -100}}, "unsupported: logit_bias"),
        (CHAT_URL, {"messages": HI, "reasoning_effort": "high"}, "unsupported: reasoning_effort"),
        (CHAT_URL, {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]}, "unsupported: tools"),
        (CHAT_URL, {"messages": HI, "tool_choice": "required"}, "unsupported: tool_choice"),
        (CHAT_URL, {"messages": HI, "functions": [{"name": "f"}]}, "unsupported: functions"),
        (CHAT_URL, {"messages": HI, "stream": True}, "unsupported: stream (a batch file's responses"),
        (CHAT_URL, {"messages": HI, "reasoning_effort": "high"}, "unsupported: reasoning_effort"),
        (CHAT_URL, {"messages": HI, "temprature": 0.2}, "unsupported: temprature (not a field of /v1/chat"),
        (CHAT_URL, {"messages": HI, "top_k": 5}, "unsupported: top_k (not a field"),
        (CHAT_URL, {"messages": HI, "prompt": "x"}, "unsupported: prompt (a field of /v1/completions, not of"),
        ("/v1/completions", {"prompt": "t", "echo": True}, "unsupported: echo"),
        ("/v1/completions", {"prompt": "t", "best_of": 3}, "unsupported: best_of"),
        ("/v1/completions", {"prompt": "t", "suffix": "end"}, "unsupported: suffix"),
        ("/v1/completions", {"prompt": "t", "logprobs": 0}, "unsupported: logprobs"),
        ("/v1/embeddings", {"input": "t", "dimensions": 8}, "unsupported: dimensions"),
        ("/v1/embeddings", {"input": "t", "encoding_format": "base64"}, "unsupported: encoding_format"),
        (
            CHAT_URL,
            {"messages": [{"role": "user", "content": "hi", "name": "ann"}]},
            "unsupported: body.messages[0].name",
        ),
        (
            CHAT_URL,
            {"messages": [{"role": "tool", "content": "4", "tool_call_id": "c1"}]},
            "unsupported: body.messages[0].tool_call_id",
        ),
        (
            CHAT_URL,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}]},
            "unsupported: body.messages[0].content[1] is a content part of type image_url",
        ),
    ],
)
def test_a_field_batchinfer_does_not_implement_makes_the_request_an_error_line_naming_it(url, body, said):
    from batchinfer.openai_compat.batch_files import parse_request

    reason, message = parse_request({"custom_id": "r", "method": "POST", "url": url, "body": body})[1]
    assert reason == "unsupported" and message.startswith(said), message


@pytest.mark.parametrize(
    "url, body",
    [
        (
            CHAT_URL,
            {
                "messages": HI,
                "model": "gpt-4o",
                "user": "u-1",
                "metadata": {"run": "7"},
                "store": False,
                "n": 1,
                "presence_penalty": 0,
                "frequency_penalty": 0.0,
                "logprobs": False,
                "logit_bias": {},
                "tools": [],
                "tool_choice": "none",
                "response_format": {"type": "text"},
                "stream": False,
                "seed": 3,
                "max_completion_tokens": 4,
                "service_tier": "auto",
            },
        ),
        ("/v1/completions", {"prompt": "t", "echo": False, "best_of": 1, "suffix": None, "logprobs": None}),
        ("/v1/embeddings", {"input": "t", "encoding_format": "float", "user": "u", "model": "text-embedding-3-small"}),
        (
            CHAT_URL,  # an assistant message as an SDK sends it back
            {"messages": HI + [{"role": "assistant", "content": "hello", "refusal": None, "tool_calls": []}]},
        ),
    ],
)
def test_fields_at_values_that_change_nothing_are_taken(url, body):
    from batchinfer.openai_compat.batch_files import parse_request

    row, problem = parse_request({"custom_id": "r", "method": "POST", "url": url, "body": body})
    assert problem is None, problem
    if "max_completion_tokens" in body:
        assert row["max_tokens"] == 4 and row["seed"] == 3


def test_chat_content_given_as_text_parts_is_read_as_the_same_text(tmp_path, tiny_llama):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!\nHow are you?"}]
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hello world!"}, {"type": "text", "text": "How are you?"}],
        },
    ]
    lines = [
        {"custom_id": "plain", "method": "POST", "url": CHAT_URL, "body": {"messages": plain, "max_tokens": 6}},
        {"custom_id": "parts", "method": "POST", "url": CHAT_URL, "body": {"messages": parts, "max_tokens": 6}},
        {"custom_id": "lp", "method": "POST", "url": CHAT_URL, "body": {"messages": plain, "logprobs": True}},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    result = runner.invoke(app, ["openai-batch", str(path), "--model", str(tiny_llama), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    answers = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert sorted(answers) == ["parts", "plain"]
    assert answers["parts"]["response"]["body"]["choices"] == answers["plain"]["response"]["body"]["choices"]
    assert answers["parts"]["response"]["body"]["usage"] == answers["plain"]["response"]["body"]["usage"]
    failed = [json.loads(line) for line in (tmp_path / "results.errors.jsonl").read_text().splitlines()]
    assert [(f["custom_id"], f["error"]["code"]) for f in failed] == [("lp", "unsupported")]
    assert failed[0]["error"]["message"].startswith("unsupported: logprobs")


def _completion(custom_id, prompt, **body):
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"prompt": prompt, **body}}
    )


def _counting_passes(passes: list):
    """on_runner for run_job: counts the continuous-batching engine's passes (rows per pass) into `passes`."""

    def count(runner):
        original = runner.engine.run

        def run(rows, *args):
            passes.append(len(rows.prompts))
            return original(rows, *args)

        runner.engine.run = run
        return runner

    return count


def _answers(tmp_path, model, name, lines, passes=None, engine="auto"):
    """Run `lines` as an OpenAI Batch file → (responses by custom_id, error lines)."""
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    job = {
        "input": {"path": str(path), "format": "openai"},
        "model": {"path": str(model), "task": "generate"},
        "generation": {"max_new_tokens": 6, "engine": engine},
        "output": {"path": str(tmp_path / name), "format": "openai"},
    }
    run_job(validate_job(job), on_runner=_counting_passes(passes if passes is not None else []))
    read = lambda file: [json.loads(line) for line in (tmp_path / name / file).read_text().splitlines()]  # noqa: E731
    return {line["custom_id"]: line for line in read("output.jsonl")}, read("errors.jsonl")


@pytest.mark.parametrize("engine, parts", [("transformers", [3, 4]), ("openvino", [7])])
def test_a_seed_or_stop_per_request_shares_one_engine_pass_and_a_bad_value_is_one_error_line(
    tmp_path, tiny_llama, engine, parts
):
    if engine == "openvino":
        pytest.importorskip("openvino_genai")
    prompts = ["Free entry in 2 a wkly comp", "Ok lar joking wif u oni", "Nah I don't think he goes"]
    greedy = [_completion(f"g{i}", p, seed=i, stop=[f"{i}"], max_tokens=6) for i, p in enumerate(prompts)]
    hot = [_completion(f"s{i}", p, seed=100 + i, temperature=1.0, max_tokens=6) for i, p in enumerate(prompts)]
    # a temperature too small to divide logits by in float32 is greedy (it was the vocabulary's last token)
    tiny = [_completion("tiny", prompts[0], seed=7, stop=["0"], temperature=1e-300, max_tokens=6)]
    bad = [_completion("top_p", "x", top_p=5), _completion("cold", "x", temperature=-1)]
    passes: list = []
    answers, errors = _answers(tmp_path, tiny_llama, "all", greedy + hot + tiny + bad, passes, engine)
    # transformers: one pass for the greedy rows, one for the sampled, not one per seed; openvino: one pass
    assert sorted(passes) == parts
    assert sorted(answers) == ["g0", "g1", "g2", "s0", "s1", "s2", "tiny"]
    assert answers["tiny"]["response"]["body"]["choices"] == answers["g0"]["response"]["body"]["choices"]
    assert [(e["custom_id"], e["error"]["code"], e["error"]["message"]) for e in errors] == [
        ("top_p", "bad_request", "body.top_p: must be a number above 0 and at most 1 (got 5)"),
        ("cold", "bad_request", "body.temperature: must be a number from 0 to 2 (got -1)"),
    ]
    alone, _ = _answers(tmp_path, tiny_llama, "alone", [hot[1], greedy[2]], engine=engine)
    for key in ("s1", "g2"):  # a request's own seed: the same completion beside others as alone
        assert alone[key]["response"]["body"]["choices"] == answers[key]["response"]["body"]["choices"], key


@pytest.mark.parametrize("engine", ["transformers", "openvino"])
def test_a_negative_seed_is_that_lines_error_and_the_other_lines_are_answered(tmp_path, tiny_llama, engine):
    """OpenVINO GenAI's rng_seed is unsigned: a negative seed was its TypeError, and openai-batch stopped with an
    internal error, the valid lines beside it unanswered. Every engine takes a seed from 0 to 2**63-1. A top_p
    of 1e-300 is 0 in float32, which OpenVINO GenAI refused for the whole pass: it keeps the likeliest token."""
    if engine == "openvino":
        pytest.importorskip("openvino_genai")
    prompt = "Free entry in 2 a wkly comp"
    lines = [
        _completion("negative", prompt, seed=-5, temperature=1.0, max_tokens=4),
        _completion("seeded", prompt, seed=5, temperature=1.0, max_tokens=4),
        _completion("tiny_top_p", prompt, seed=5, temperature=1.0, top_p=1e-300, max_tokens=4),
        _completion("greedy", prompt, max_tokens=4),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "results.jsonl"
    command = ["openai-batch", str(path), "-m", str(tiny_llama), "-o", str(out), "-q"]
    result = runner.invoke(app, [*command, "--set", f"generation.engine={engine}"])
    assert result.exit_code == 0, result.output
    answers = {line["custom_id"]: line["response"]["body"] for line in map(json.loads, out.read_text().splitlines())}
    assert sorted(answers) == ["greedy", "seeded", "tiny_top_p"]
    assert answers["tiny_top_p"]["choices"] == answers["greedy"]["choices"]
    (failed,) = [json.loads(line) for line in (tmp_path / "results.errors.jsonl").read_text().splitlines()]
    assert failed["custom_id"] == "negative" and failed["error"] == {
        "code": "bad_request",
        "message": f"body.seed: must be a whole number from 0 to {2**63 - 1} (got -5)",
    }


def test_chat_requests_to_a_model_without_a_chat_template_are_error_lines_until_model_chat_template_is_set(
    tmp_path, tiny_llama, tiny_llama_plain
):
    sys.path.insert(0, str(EXAMPLE.parents[1] / "models"))
    from make_tiny_causal import CHAT_TEMPLATE

    chat = {"messages": [{"role": "user", "content": "Ok lar"}], "max_tokens": 5}
    lines = [
        {"custom_id": "chat", "method": "POST", "url": CHAT_URL, "body": chat},
        {
            "custom_id": "text",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "Ok lar", "max_tokens": 5},
        },
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "chat.jinja").write_text(CHAT_TEMPLATE)

    def answers(model, out, *extra):
        command = ["openai-batch", str(path), "--model", str(model), "-o", str(tmp_path / out), "-q", *extra]
        result = runner.invoke(app, command)
        assert result.exit_code == 0, result.output
        errors = tmp_path / out.replace(".jsonl", ".errors.jsonl")
        read = lambda file: [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []  # noqa: E731
        return {line["custom_id"]: line for line in read(tmp_path / out)}, read(errors)

    answered, failed = answers(tiny_llama_plain, "plain.jsonl")
    assert list(answered) == ["text"] and [(f["custom_id"], f["error"]["code"]) for f in failed] == [
        ("chat", "bad_request")
    ]
    message = failed[0]["error"]["message"]
    assert message.startswith("body.messages: chat messages need a chat template") and "model.chat_template" in message
    answered, failed = answers(
        tiny_llama_plain, "templated.jsonl", "--set", f"model.chat_template={tmp_path / 'chat.jinja'}"
    )
    own, _ = answers(tiny_llama, "own.jsonl")  # the same model with the same template of its own
    assert sorted(answered) == ["chat", "text"] and not failed
    assert answered["chat"]["response"]["body"]["choices"] == own["chat"]["response"]["body"]["choices"]


def test_a_list_input_is_one_response_line_with_a_vector_per_text_in_order(tmp_path, tiny_embed):
    texts = ["Ok lar... Joking wif u oni...", "Free entry in 2 a wkly comp", "hi"]
    inputs = {
        "many": texts,
        **{f"alone{i}": text for i, text in enumerate(texts)},
        "blank": ["fine", " "],
        "huge": ["x"] * 2049,
        "tokens": [1, 2, 3],  # token ids, as OpenAI also takes
        "none": [],
    }
    path = tmp_path / "lists.jsonl"
    path.write_text("".join(_embedding_request(key, value) + "\n" for key, value in inputs.items()))
    command = ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "out.jsonl"), "-q"]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    out = {line["custom_id"]: line for line in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert list(out) == ["many", "alone0", "alone1", "alone2"]  # one line for the list, in input order
    many = out["many"]["response"]["body"]
    assert [d["index"] for d in many["data"]] == [0, 1, 2]
    for i, item in enumerate(many["data"]):  # each text's vector as when it is asked alone
        alone = out[f"alone{i}"]["response"]["body"]
        assert np.allclose(item["embedding"], alone["data"][0]["embedding"], atol=1e-5)
    alone_tokens = sum(out[f"alone{i}"]["response"]["body"]["usage"]["prompt_tokens"] for i in range(3))
    assert many["usage"] == {"prompt_tokens": alone_tokens, "total_tokens": alone_tokens}
    errors = {
        e["custom_id"]: e["error"] for e in map(json.loads, (tmp_path / "out.errors.jsonl").read_text().splitlines())
    }
    assert errors["blank"] == {"code": "empty_text", "message": errors["blank"]["message"]}
    assert errors["blank"]["message"].startswith("body.input[1] is empty")
    assert errors["huge"]["message"] == "body.input: 2,049 texts, more than the 2,048 one request may hold; split it"
    assert errors["tokens"]["message"] == (
        "body.input: token-id lists are not accepted; send the text itself, a string or a list of strings "
        "(got [1, 2, 3])"
    )
    assert errors["none"]["message"].startswith("body.input: an empty list")
    assert {e["code"] for k, e in errors.items() if k != "blank"} == {"bad_request"}


def test_a_list_prompt_is_one_response_line_with_a_choice_per_prompt_and_survives_a_kill(tmp_path, tiny_llama):
    prompts = ["Free entry in 2 a wkly comp", "Ok lar joking wif u oni", "Nah I don't think he goes"]
    lines = [_completion("many", prompts, max_tokens=5)]
    lines += [_completion(f"alone{i}", p, max_tokens=5) for i, p in enumerate(prompts)]
    lines += [_completion("blank", ["fine", " "]), _completion("one", [prompts[2]], max_tokens=5)]
    answers, errors = _answers(tmp_path, tiny_llama, "lists", lines)
    assert list(answers) == ["many", "alone0", "alone1", "alone2", "one"]  # one line for the list, in input order
    many = answers["many"]["response"]["body"]
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    for i, choice in enumerate(many["choices"]):  # each prompt answered as when it is asked alone
        assert choice == answers[f"alone{i}"]["response"]["body"]["choices"][0] | {"index": i}
    alone = [answers[f"alone{i}"]["response"]["body"]["usage"] for i in range(3)]
    assert many["usage"] == {k: sum(u[k] for u in alone) for k in alone[0]}  # the request's usage: the sums
    assert answers["one"]["response"]["body"]["choices"] == answers["alone2"]["response"]["body"]["choices"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("blank", "empty_text")]
    assert errors[0]["error"]["message"].startswith("body.prompt[1] is empty")

    # killed in its third chunk (two lines a chunk, each a list of two or three prompts) and resumed: every
    # line answered once, whole, each prompt of it once
    many = [_completion(f"r{i}", [f"message {i}", f"note {i}", "x"][: 2 + i % 2], max_tokens=3) for i in range(10)]
    path = tmp_path / "many.jsonl"
    path.write_text("".join(line + "\n" for line in many))
    job = _killed_in_third_chunk(path, tiny_llama, tmp_path / "killed", chunk_rows=2)
    assert run_job(job)["run"]["rows"] == 6
    out = [json.loads(line) for line in (tmp_path / "killed" / "output.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in out] == [f"r{i}" for i in range(10)]
    assert [[c["index"] for c in line["response"]["body"]["choices"]] for line in out] == [
        list(range(2 + i % 2)) for i in range(10)
    ]


def test_a_part_written_before_list_inputs_still_answers_one_vector():
    from batchinfer.openai_compat.batch_files import response_lines

    old = pa.table({"custom_id": ["a"], "embedding": [[0.5, 0.25]], "prompt_tokens": [3]})  # one vector a row
    new = pa.table({"custom_id": ["a"], "embedding": [[[0.5, 0.25]]], "prompt_tokens": [3]})  # a list a row
    old_body, new_body = (json.loads(response_lines(t, "m", "embed")[0])["response"]["body"] for t in (old, new))
    assert old_body == new_body and old_body["data"] == [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}]


def test_a_file_that_appears_at_the_target_during_the_run_is_never_replaced(tmp_path, tiny_embed, monkeypatch):
    import batchinfer.cli as cli

    path = tmp_path / "embed.jsonl"
    path.write_text(_embedding_request("e0", "Ok lar... Joking wif u oni...") + "\n")
    target = tmp_path / "out.jsonl"
    real = cli.execute

    def someone_writes_the_target(*args, **kwargs):  # the user's own file, saved there while the run computes
        report = real(*args, **kwargs)
        target.write_text("my own results\n")
        return report

    monkeypatch.setattr(cli, "execute", someone_writes_the_target)
    result = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(target), "-q"])
    assert result.exit_code == 1, result.output
    assert target.read_text() == "my own results\n"
    kept = tmp_path / "out.jsonl.batchinfer" / "output.jsonl"
    message = " ".join(result.output.split())
    assert f"{target} appeared during the run" in message and f"results stay in {kept}" in message
    assert json.loads(kept.read_text())["custom_id"] == "e0"
    monkeypatch.setattr(cli, "execute", real)  # the user moves their file away; the same command delivers
    target.rename(tmp_path / "mine.jsonl")
    again = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(target), "-q"])
    assert again.exit_code == 0, again.output
    assert json.loads(target.read_text())["custom_id"] == "e0"


def test_a_response_format_without_xgrammar_fails_that_request_alone(tmp_path, tiny_llama, monkeypatch):
    """Failed requests never abort the file: a constrained request where xgrammar cannot be imported is one
    error line, and every other request is answered."""
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` raises ImportError
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    lines = [
        _completion("free-1", "Free entry in 2 a wkly comp", max_tokens=4),
        _completion("shaped", "Ok lar... Joking wif u oni...", max_tokens=4, response_format=schema),
        _completion("free-2", "U dun say so early hor", max_tokens=4),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app, ["openai-batch", str(path), "-m", str(tiny_llama), "-o", str(tmp_path / "out.jsonl"), "-q"]
    )
    assert result.exit_code == 0, result.output
    answered = [json.loads(line)["custom_id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert answered == ["free-1", "free-2"]
    (failed,) = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert failed["custom_id"] == "shaped" and failed["error"]["code"] == "unsupported"
    assert "needs xgrammar, which is not installed" in failed["error"]["message"]
    assert "pip install 'batchinfer[llm]'" in failed["error"]["message"]


def test_a_lone_surrogate_in_a_list_input_names_the_request_field_not_a_column(tmp_path, tiny_embed):
    path = tmp_path / "requests.jsonl"
    path.write_text(_embedding_request("bad", ["fine", "\ud800"]) + "\n" + _embedding_request("ok", "fine") + "\n")
    result = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 0, result.output
    (error,) = [json.loads(line)["error"] for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert error == {
        "code": "bad_utf8",
        "message": "body.input[1]: not valid Unicode (surrogates not allowed at character 0)",
    }
    assert json.loads((tmp_path / "o.jsonl").read_text())["custom_id"] == "ok"


def test_a_chat_message_of_a_role_openai_does_not_take_is_that_requests_error_line():
    """A 'wizard' message was answered: the model's template wrote <|im_start|>wizard, where OpenAI refuses it."""
    from batchinfer.openai_compat.batch_files import parse_request

    body = {"messages": [{"role": "system", "content": "be brief"}, {"role": "wizard", "content": "hi"}]}
    reason, message = parse_request({"custom_id": "r", "method": "POST", "url": CHAT_URL, "body": body})[1]
    assert reason == "bad_request" and message.startswith("body.messages[1].role: 'wizard' is no role"), message
    for role in ("developer", "assistant"):
        body = {"messages": [{"role": role, "content": "x"}, {"role": "user", "content": "hi"}]}
        assert parse_request({"custom_id": "r", "method": "POST", "url": CHAT_URL, "body": body})[1] is None


def test_every_message_that_names_a_line_counts_blank_lines_as_an_editor_does(tmp_path, tiny_embed):
    """A line without a custom_id is named by its line, as the line a custom_id repeats is: both numbered as an
    editor shows them, blank lines counted (not as requests, which skip them)."""
    lines = [
        "",
        _embedding_request("a", "hello"),
        "   ",
        json.dumps({"method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}),
        "",
        '{"method": "POST", "body": [',
        _embedding_request("a", "again"),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 0, result.output
    errors = [json.loads(line)["error"]["message"] for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert errors[0] == "custom_id is missing (line 4 of requests.jsonl)"
    assert errors[1].startswith("line is not JSON") and errors[1].endswith("(line 6 of requests.jsonl)")
    assert errors[2] == "custom_id 'a' repeats line 2 of requests.jsonl; only the first request runs"


def test_a_folder_as_the_request_file_is_refused_naming_the_job_file_that_reads_one(tmp_path):
    folder = tmp_path / "batches"
    folder.mkdir()
    (folder / "part-1.jsonl").write_text(_embedding_request("a", "hi") + "\n")
    result = runner.invoke(app, ["openai-batch", str(folder), "-m", "m", "-o", str(tmp_path / "o.jsonl")])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in said and "does not exist" not in said
    assert f"error: {folder} is a folder; openai-batch takes one OpenAI Batch API request file (.jsonl)" in said
    assert f"e.g. {folder / 'part-1.jsonl'}" in said and "input.format: openai and output.format: openai" in said


def test_an_output_path_ending_in_a_slash_is_a_folder_and_refused(tmp_path, tiny_embed):
    path = tmp_path / "requests.jsonl"
    path.write_text(_embedding_request("a", "hello") + "\n")
    result = runner.invoke(app, ["openai-batch", str(path), "-m", str(tiny_embed), "-o", f"{tmp_path / 'new'}/"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in said, said
    assert f"-o {tmp_path / 'new'}/ ends in /, so it names a folder" in said
    assert f"-o {tmp_path / 'new' / 'results.jsonl'}" in said
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.batchinfer").exists()


def test_results_of_another_batch_at_the_output_say_to_give_a_new_file(tmp_path, tiny_embed):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(_embedding_request("a", "hello") + "\n")
    second.write_text(_embedding_request("b", "other") + "\n")
    out = tmp_path / "out.jsonl"
    assert runner.invoke(app, ["openai-batch", str(first), "-m", str(tiny_embed), "-o", str(out), "-q"]).exit_code == 0
    result = runner.invoke(app, ["openai-batch", str(second), "-m", str(tiny_embed), "-o", str(out), "-q"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "holds results of a different job" in said, said
    assert "fix: write to a new file with -o NEW.jsonl, which keeps them" in said and "NEW_FOLDER" not in said
    assert json.loads(out.read_text())["custom_id"] == "a"  # kept


def test_a_damaged_work_folder_says_to_give_a_new_file_and_the_fix_survives_a_worker(tmp_path, tiny_embed):
    import pickle

    from batchinfer.errors import Elsewhere
    from batchinfer.output.layout import JOB

    requests, out = tmp_path / "requests.jsonl", tmp_path / "out.jsonl"
    requests.write_text(_embedding_request("a", "hello") + "\n")
    (tmp_path / "out.jsonl.batchinfer").mkdir()
    (tmp_path / "out.jsonl.batchinfer" / JOB).write_text("{not json")
    result = runner.invoke(app, ["openai-batch", str(requests), "-m", str(tiny_embed), "-o", str(out), "-q"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "damaged" in said, said
    assert "fix: write to a new file with -o NEW.jsonl; move this one away" in said and "NEW_FOLDER" not in said
    error = Elsewhere("held", ", which keeps them").at("a new file with -o NEW.jsonl")
    assert (
        pickle.loads(pickle.dumps(error)).hint
        == error.hint
        == "write to a new file with -o NEW.jsonl, which keeps them"
    )


def test_a_request_without_max_tokens_gets_generation_max_new_tokens_as_the_docs_say(tmp_path, tiny_llama):
    from batchinfer.job.config import GenerationConfig

    default = GenerationConfig.model_fields["max_new_tokens"].default
    doc = " ".join((EXAMPLE.parents[2] / "docs" / "openai-batch.md").read_text().split())
    assert "A request without `max_tokens` (or `max_completion_tokens`)" in doc
    assert f"`generation.max_new_tokens` tokens, {default} unless" in doc
    assert "`--set generation.max_new_tokens=N`" in doc
    path = tmp_path / "requests.jsonl"
    path.write_text(_completion("free", "Free entry in 2 a wkly comp") + "\n")
    out = tmp_path / "out.jsonl"
    command = ["openai-batch", str(path), "-m", str(tiny_llama), "-o", str(out), "-q"]
    result = runner.invoke(app, [*command, "--set", "generation.max_new_tokens=3"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["response"]["body"]["usage"]["completion_tokens"] <= 3


def test_a_rerun_of_a_complete_batch_keeps_each_responses_created(tmp_path, tiny_llama, monkeypatch):
    """`created` is when the response's chunk was committed, kept in its marker: a rerun writes the file again
    from the parts, and writes the same lines, however much later it runs."""
    from types import SimpleNamespace

    from batchinfer.openai_compat import batch_files

    path = tmp_path / "requests.jsonl"
    path.write_text("".join(_completion(f"r{i}", f"message {i}", max_tokens=2) + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    command = ["openai-batch", str(path), "-m", str(tiny_llama), "-o", str(out), "-q"]
    start = int(time.time())
    assert runner.invoke(app, command).exit_code == 0
    first = out.read_text()
    assert all(start <= json.loads(line)["response"]["body"]["created"] <= time.time() for line in first.splitlines())
    later = time.time() + 1000  # the rerun, as if much later
    monkeypatch.setattr(batch_files, "time", SimpleNamespace(time=lambda: later))
    again = runner.invoke(app, command)
    assert again.exit_code == 0 and "already complete" in again.output, again.output
    assert out.read_text() == first


def test_a_blank_chat_request_is_empty_text_as_a_blank_prompt_is():
    from batchinfer.openai_compat.batch_files import parse_request

    def parsed(messages):
        return parse_request({"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": messages}})[1]

    blank = parsed([{"role": "system", "content": " "}, {"role": "user", "content": "\u200b"}])
    assert blank[0] == "empty_text" and "every message's content is empty" in blank[1]
    assert parsed([{"role": "user"}])[0] == "bad_request"  # the rest as before
