"""batchinfer serve: concurrent requests share batches, results equal the offline job's, overload is
refused with 429, a bad body is a 400 naming the problem, SIGTERM drains the queue."""

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import sys
import threading
import time

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from helpers import EXAMPLES, Cli, generate_alone, make_job

from batchinfer.backends.models import resolve_model_path
from batchinfer.execution.driver import run_job

pytest.importorskip("fastapi")
from batchinfer.serve import create_app  # noqa: E402
from batchinfer.serve.routes import served_name  # noqa: E402


def _serving(model, task, engine="auto", engine_options=None, **serve):
    return make_job(
        "-",
        model,
        "-",
        task,
        input__id=None,
        input__keep=None,
        input__text_pair="text_pair" if task == "score" else None,
        batching__chunk_rows=None,
        batching__max_tokens=4096,
        generation__max_new_tokens=12 if task == "generate" else None,
        generation__engine=engine if task == "generate" else None,
        generation__engine_options=engine_options,
        serve={"max_wait_ms": 50, **serve},
    )


@contextlib.asynccontextmanager
async def _client(job, app=None):
    """An HTTP client of the app serving `job` (or of `app`, made by the test to reach its service)."""
    app = app or create_app(job, resolve_model_path(job.model.path))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://batchinfer", timeout=60) as client:
            yield client


def _offline(model, task, rows, tmp_path, **input_extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, tmp_path / "rows.parquet")
    rows_job = make_job(
        tmp_path / "rows.parquet",
        model,
        tmp_path / "offline",
        task,
        input={"id": None, "keep": None, **input_extra},
        batching__chunk_rows=None,
        batching__max_tokens=4096,
    )
    run_job(rows_job)
    return ds.dataset(str(tmp_path / "offline"), format="parquet").to_table()


def test_concurrent_embedding_requests_share_batches_and_equal_the_offline_job(sms_table, tiny_embed, tmp_path):
    texts = sms_table.column("text").to_pylist()[:48]
    requests = [texts[i : i + 4] for i in range(0, 48, 4)]  # 12 requests of 4 rows

    async def go():
        async with _client(_serving(tiny_embed, "embed")) as client:
            answers = await asyncio.gather(*(client.post("/v1/embeddings", json={"input": r}) for r in requests))
            metrics = (await client.get("/metrics")).text
            return answers, metrics

    answers, metrics = asyncio.run(go())
    assert all(a.status_code == 200 for a in answers)
    online = np.array([d["embedding"] for a in answers for d in a.json()["data"]])
    offline = np.array(
        _offline(tiny_embed, "embed", pa.table({"text": texts}), tmp_path).column("embedding").to_pylist()
    )
    assert np.abs(online - offline).max() < 1e-5
    assert answers[0].json()["usage"]["prompt_tokens"] > 0 and answers[0].json()["object"] == "list"
    batches = _metric(metrics, "batchinfer_batch_requests_count")
    alone = _metric(metrics, 'batchinfer_batch_requests_bucket{le="1.0"}')
    assert batches < 12 and alone < batches  # some batch held rows of several requests


def test_classify_and_score_equal_the_offline_job(sms_table, tiny_classify, tiny_cross_encoder, tmp_path):
    texts = sms_table.column("text").to_pylist()[:20]
    queries = [" ".join(t.split()[:3]) for t in reversed(texts)]

    async def go():
        async with _client(_serving(tiny_classify, "classify")) as client:
            labels = (await client.post("/classify", json={"input": texts})).json()["data"]
        async with _client(_serving(tiny_cross_encoder, "score")) as client:
            scores = (await client.post("/score", json={"pairs": list(zip(queries, texts))})).json()["data"]
            ranked = (await client.post("/score", json={"query": queries[0], "documents": texts[:3]})).json()["data"]
            both = await client.post("/score", json={"pairs": [["a", "b"]], "query": "q", "documents": ["d"]})
            many = [  # one more than /v1/embeddings and /classify take: the same cap
                await client.post("/score", json=body)
                for body in ({"pairs": [["a", "b"]] * 2049}, {"query": "q", "documents": ["d"] * 2049})
            ]
        return labels, scores, ranked, both, many

    labels, scores, ranked, both, many = asyncio.run(go())
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
    for refused, key in zip(many, ("pairs", "documents")):
        said = refused.json()["error"]["message"]
        assert (
            refused.status_code == 400
            and said == f"{key}: 2,049 items, more than the 2,048 one request may hold; split it"
        )
    offline = _offline(tiny_classify, "classify", pa.table({"text": texts}), tmp_path)
    assert [row["label"] for row in labels] == offline.column("label").to_pylist()
    assert np.allclose([row["score"] for row in labels], offline.column("score").to_pylist(), atol=1e-5)
    pairs = _offline(
        tiny_cross_encoder, "score", pa.table({"text": queries, "doc": texts}), tmp_path / "pairs", text_pair="doc"
    )
    assert np.allclose([row["score"] for row in scores], pairs.column("score").to_pylist(), atol=1e-5)
    assert len(ranked) == 3 and abs(ranked[0]["score"] - scores[0]["score"]) < 1e-5  # the same pair both ways


def test_a_full_queue_answers_429_and_a_bad_body_400_naming_the_problem(tiny_embed):
    async def go():
        async with _client(_serving(tiny_embed, "embed", max_wait_ms=1000, max_queue_tokens=30)) as client:
            long = "word " * 20
            answers = await asyncio.gather(*(client.post("/v1/embeddings", json={"input": [long]}) for _ in range(3)))
            bad = [
                await client.post("/v1/embeddings", json=body)
                for body in (
                    {"input": ["fine", 7]},
                    {"inputs": "x"},
                    {"input": ["fine", " "]},
                    {"input": "x", "encoding_format": "hex"},
                )
            ]
            raw = await client.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"})
            wrong_task = await client.post("/classify", json={"input": "x"})
            json_headers = {"content-type": "application/json"}
            odd = [
                await client.post("/v1/embeddings", content=body, headers=json_headers)
                for body in (b"null", b"[1]", b'{"input": ["ok", "\\ud800"]}')
            ]
            return answers, bad, raw, wrong_task, odd

    answers, bad, raw, wrong_task, odd = asyncio.run(go())
    codes = sorted(a.status_code for a in answers)
    assert codes[0] == 200 and 429 in codes
    busy = next(a for a in answers if a.status_code == 429)
    assert busy.headers["retry-after"] == "1" and "busy" in busy.json()["error"]["message"]
    messages = [b.json()["error"]["message"] for b in bad]
    assert all(b.status_code == 400 for b in bad)
    assert messages[0] == "input[1]: input should be a valid string (got 7)"
    assert messages[1] == "input: field required" and messages[2].startswith("input[1]: empty")
    assert messages[3] == "encoding_format: input should be 'float' or 'base64' (got 'hex')"
    assert raw.status_code == 400 and raw.json()["error"]["message"].startswith("the body is not valid JSON; send")
    assert wrong_task.status_code == 400 and "--task classify" in wrong_task.json()["error"]["message"]
    assert [o.status_code for o in odd] == [400, 400, 400]  # were 500s with a traceback in the log
    assert odd[0].json()["error"]["message"] == "the body must be a JSON object (got None)"
    assert odd[2].json()["error"]["message"].startswith("input[1]: not valid Unicode (surrogates not allowed")


def _held(target, name: str):
    """Hold target.name (a callable the model's side runs) until the returned event is set; `started` says that
    a call is waiting."""
    started, go, real = threading.Event(), threading.Event(), getattr(target, name)

    def held(*args):
        started.set()
        go.wait(30)
        return real(*args)

    setattr(target, name, held)
    return started, go


def _shed_metric(metrics: str) -> float:
    return float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("batchinfer_shed_total")))


def test_a_latency_target_sheds_an_embedding_request_it_cannot_answer_in_time_with_429_and_retry_after(tiny_embed):
    """serve.p99_ms: behind a batch measured to take seconds, a request is answered 429 at once, in OpenAI's
    error shape, with the seconds until it would fit as Retry-After; /metrics counts it and shows the budget."""
    job = _serving(tiny_embed, "embed", p99_ms=1000, max_wait_ms=0)
    app = create_app(job, resolve_model_path(job.model.path))
    service = app.state.service
    started, go = _held(service.runner, "run")
    service.batcher.window.cost.points.clear()  # the warm-up's batch, measured instead as:
    service.batcher.window.cost.add(10, 10.0)  # a second a token, so a batch of a few takes seconds

    async def run():
        async with _client(job, app) as client:
            first = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "good food"}))
            assert await asyncio.to_thread(started.wait, 30)
            late = await client.post("/v1/embeddings", json={"input": "slow service"})
            go.set()
            return await first, late, (await client.get("/metrics")).text

    first, late, metrics = asyncio.run(run())
    assert first.status_code == 200 and late.status_code == 429
    error = late.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] is None and error["param"] is None
    assert error["message"].startswith("the server is busy: a request now would be answered in about ")
    assert "past what serve.p99_ms allows (1,000 ms); retry in " in error["message"]
    assert int(late.headers["retry-after"]) >= 1 and error["message"].endswith(f"{late.headers['retry-after']} s")
    assert _shed_metric(metrics) == 1.0
    assert 'batchinfer_batch_budget{unit="tokens"}' in metrics and 'batchinfer_batch_budget{unit="rows"}' in metrics
    assert 'batchinfer_requests_total{endpoint="/v1/embeddings",status="429"} 1.0' in metrics
    # what the target is held to now: the first answer came sooner than predicted (a second a token), so more
    held_to = next(line.split()[1] for line in metrics.splitlines() if line.startswith("batchinfer_admitted_within"))
    assert float(held_to) == service.batcher.window.admission.allowed > 1.0


def test_the_latency_a_target_holds_runs_from_the_requests_arrival_to_its_answer_sent(tiny_embed):
    """What serve.p99_ms holds is what a client sees: from the request's arrival (before its body is read; a
    busy event loop delays the handler too) to its answer sent, not from the handler's start."""
    job = _serving(tiny_embed, "embed", p99_ms=10_000, max_wait_ms=0)
    app = create_app(job, resolve_model_path(job.model.path))

    async def slow_body():
        yield b'{"input": "good'
        await asyncio.sleep(1.0)
        yield b' food"}'

    async def run():
        async with _client(job, app) as client:
            started = time.perf_counter()
            answer = await client.post("/v1/embeddings", content=slow_body(), headers={"content-type": "x"})
            return answer, time.perf_counter() - started

    answer, seen_by_client = asyncio.run(run())
    held = app.state.service.batcher.window.admission.latencies
    assert answer.status_code == 200 and len(held) == 1
    assert 1.0 <= held[0] <= seen_by_client


def test_a_latency_target_sheds_a_completion_whose_first_token_would_come_too_late(tiny_llama):
    """serve.p99_ms on generation: the time to first token, predicted from the tokens held ahead; with a request
    running, another is 429 at once; its first token is measured (/metrics)."""
    job = _serving(tiny_llama, "generate", p99_ms=1000)
    app = create_app(job, resolve_model_path(job.model.path))
    service = app.state.service
    started, go = _held(service.engine, "add")
    service.target.answered(10, 10.0)  # measured: a second a token held ahead

    async def run():
        async with _client(job, app) as client:
            body = {"prompt": "Hello there", "max_tokens": 4}
            first = asyncio.ensure_future(client.post("/v1/completions", json=body))
            assert await asyncio.to_thread(started.wait, 30)
            late = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
            running = _metric((await client.get("/metrics")).text, "batchinfer_running_requests")
            go.set()
            return await first, late, (await client.get("/metrics")).text, running

    first, late, metrics, running = asyncio.run(run())
    assert first.status_code == 200, first.text
    assert running == 1 and _metric(metrics, "batchinfer_running_requests") == 0  # the batch now, and once done
    assert late.status_code == 429 and "would get its first token in about " in late.text
    assert int(late.headers["retry-after"]) >= 1 and _shed_metric(metrics) == 1.0
    assert "batchinfer_time_to_first_token_seconds_count 1.0" in metrics
    assert _metric(metrics, "batchinfer_tokens_total") == first.json()["usage"]["prompt_tokens"]  # was 0


def test_a_lone_client_sending_its_next_request_once_answered_is_never_shed(tiny_embed):
    """A client that waits for each answer has nothing ahead of it: the window that answered it has ended, even
    where the model's thread has not yet come back from delivering (it marked the window idle only after, and a
    lone client was shed 3 times in 20 under serve.p99_ms=1, MiniLM)."""
    job = _serving(tiny_embed, "embed", p99_ms=0.001, max_wait_ms=0)  # below any request's own latency
    app = create_app(job, resolve_model_path(job.model.path))
    batcher = app.state.service.batcher
    delivered, go, deliver = threading.Event(), threading.Event(), batcher._deliver

    def held(*args):  # the model's thread, once it has delivered a row, waits for the test
        deliver(*args)
        delivered.set()
        go.wait(30)

    batcher._deliver = held

    async def run():
        async with _client(job, app) as client:
            first = await client.post("/v1/embeddings", json={"input": "good food"})
            assert await asyncio.to_thread(delivered.wait, 30)
            then = asyncio.ensure_future(client.post("/v1/embeddings", json={"input": "slow service"}))
            while not then.done() and not batcher._queue:  # until it is refused or queued
                await asyncio.sleep(0.01)
            go.set()
            return first, await then

    first, then = asyncio.run(run())
    assert first.status_code == 200 and then.status_code == 200, then.text


def test_the_latency_target_predicts_the_first_requests_from_the_warm_up(tiny_embed):
    """Before any request, serve.p99_ms has a measured batch (the warm-up's): with none, every request was
    predicted to cost nothing, and a burst at start was admitted whole (40 requests of 30 texts, 8 s for a
    2 s target, MiniLM). /metrics shows the batch budget from the start (it was absent until a first batch)."""
    job = _serving(tiny_embed, "embed", p99_ms=100)
    app = create_app(job, resolve_model_path(job.model.path))
    window = app.state.service.batcher.window
    assert window.cost.known and window.cost.seconds(100) > 0
    metrics = app.state.service.metrics.text()
    assert _metric(metrics, 'batchinfer_batch_budget{unit="tokens"}') == window.tokens > 0
    assert _metric(metrics, 'batchinfer_batch_budget{unit="rows"}') == window.rows > 0


def test_a_window_without_a_wait_bound_runs_once_full_or_at_stop(tiny_embed):
    """serve.max_wait_ms: .inf (batches only when full) killed the batching thread at its first wait
    (OverflowError: timestamp out of range), and every request after it waited for nothing."""
    job = _serving(tiny_embed, "embed", max_wait_ms=float("inf"))
    batcher = create_app(job, resolve_model_path(job.model.path)).state.service.batcher

    async def run():
        pending = batcher.submit([[101, 2000, 102]], asyncio.get_running_loop())
        await asyncio.to_thread(batcher.stop)  # stopping runs what is queued
        return await asyncio.wait_for(pending.future, 30)

    results, failed = asyncio.run(run())
    assert len(results) == 1 and not failed


def test_a_served_request_reads_its_rows_as_the_job_does_and_a_too_long_text_is_a_400(tiny_embed):
    job = _serving(tiny_embed, "embed")
    job = job.model_copy(update={"model": job.model.model_copy(update={"truncation": "error", "max_length": 8})})

    async def go():
        async with _client(job) as client:
            short = await client.post("/v1/embeddings", json={"input": ["ok", "fine"]})
            long = await client.post("/v1/embeddings", json={"input": ["ok", "word " * 20]})
            return short, long

    short, long = asyncio.run(go())
    assert short.status_code == 200 and len(short.json()["data"]) == 2
    assert long.status_code == 400  # model.truncation: error, as a run sends the row to _errors/
    assert long.json()["error"]["message"] == "input[1]: text is longer than max_length=8 tokens"


@pytest.mark.parametrize("task", ["embed", "generate"])
def test_an_openai_route_refuses_a_text_it_would_cut_where_its_answer_cannot_say_so(task, tiny_embed, tiny_llama):
    """With truncation: true (the default) a run flags a cut row in `truncated`; an OpenAI answer has no such field,
    so serve answered the last max_length tokens of a long prompt (the first of a long input) as if they were
    all. Now it is a 400 that names the limit and the fix; a text within it is answered as before."""
    job = _serving(tiny_embed if task == "embed" else tiny_llama, task)
    job = job.model_copy(update={"model": job.model.model_copy(update={"max_length": 16})})
    long = "word " * 40

    async def go():
        async with _client(job) as client:
            if task == "embed":
                return [await client.post("/v1/embeddings", json={"input": ["ok", text]}) for text in ("fine", long)]
            return [
                await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2}),
                await client.post("/v1/completions", json={"prompt": long, "max_tokens": 2}),
                await client.post(
                    "/v1/chat/completions", json={"messages": [{"role": "user", "content": long}], "max_tokens": 2}
                ),
            ]

    short, *cut = asyncio.run(go())
    assert short.status_code == 200, short.text
    for answer, field in zip(cut, ["input[1]"] if task == "embed" else ["prompt", "messages"]):
        assert answer.status_code == 400, answer.text
        message = answer.json()["error"]["message"]
        assert message.startswith(f"{field}: text is longer than max_length=16 tokens")
        assert "--set model.max_length=N" in message


def test_completions_equal_greedy_generate_and_stream_the_same_text(tiny_llama):
    async def go():
        async with _client(_serving(tiny_llama, "generate")) as client:
            plain = await asyncio.gather(
                *(
                    client.post("/v1/completions", json={"prompt": p, "max_tokens": 8})
                    for p in ("Hello there", "Are you coming tonight")
                )
            )
            chunks = []
            async with client.stream(
                "POST", "/v1/completions", json={"prompt": "Hello there", "max_tokens": 8, "stream": True}
            ) as streamed:
                async for line in streamed.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks.append(json.loads(line[6:]))
            chat = await client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
            )
            # what changes nothing under greedy decoding is taken, as a client's defaults send it
            greedy = await client.post(
                "/v1/completions",
                json={"prompt": "Hello there", "max_tokens": 8, "temperature": 0, "top_p": 0.5, "seed": 3},
            )
            odd = [
                await client.post("/v1/completions", json={"prompt": "x", **extra})
                for extra in ({"n": 3}, {"stream": "yes"}, {"max_tokens": 10**11}, {"n": None})
            ]
            return plain, chunks, chat, greedy, odd

    plain, chunks, chat, greedy, odd = asyncio.run(go())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    for answer, prompt in zip(plain, ("Hello there", "Are you coming tonight")):
        expected = generate_alone(tiny_llama, tokenizer(prompt)["input_ids"], 8)
        body = answer.json()
        assert body["choices"][0]["text"] == tokenizer.decode(expected, skip_special_tokens=True)
        assert body["usage"]["completion_tokens"] == len(expected)
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain[0].json()["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert greedy.status_code == 200 and greedy.json()["choices"][0]["text"] == plain[0].json()["choices"][0]["text"]
    assert [o.status_code for o in odd] == [400, 400, 200, 200]  # n and stream are not guessed at
    assert odd[0].json()["error"]["message"].startswith("unsupported: n (one completion per request")
    context = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    assert sum(odd[2].json()["usage"][k] for k in ("prompt_tokens", "completion_tokens")) <= context


def _text(choice: dict) -> str:
    """A completion choice's text, or a chat choice's (a streamed chunk's delta, or the whole message)."""
    return choice["text"] if "text" in choice else (choice.get("delta") or choice["message"]).get("content", "")


async def _streamed(client, path: str, body: dict) -> str:
    """The text a streamed completion's pieces join to."""
    pieces = []
    async with client.stream("POST", path, json=body | {"stream": True}) as streamed:
        async for line in streamed.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(_text(json.loads(line[6:])["choices"][0]))
    return "".join(pieces)


def test_a_stream_joins_to_the_whole_answers_text_whatever_its_stop_strings(tiny_llama, sms_table):
    """A stream holds back a tail that may begin a stop string until a later token rules it out (then sends it)
    or completes it (then ends there, where the whole answer is cut), and a character whose bytes are not all
    in: its pieces join to the whole answer's text, on both endpoints."""
    prompt = sms_table.column("text")[73].as_py()  # the tiny model's completion has a character of two tokens
    chat = {"messages": [{"role": "user", "content": prompt}]}

    async def go():
        answers = []
        async with _client(_serving(tiny_llama, "generate")) as client:
            for path, asked in (("/v1/completions", {"prompt": prompt}), ("/v1/chat/completions", chat)):
                body = asked | {"max_tokens": 40}
                text = _text((await client.post(path, json=body)).json()["choices"][0])
                # spanning tokens; a beginning that the text goes on past; two, the later one first in the text
                stops = [[text[5:12]], [text[20:23] + "~~~"], [text[-6:], text[30:34]], [text[44:46]]]
                for stop in [[], *stops]:
                    whole = _text((await client.post(path, json=body | {"stop": stop})).json()["choices"][0])
                    streamed = await _streamed(client, path, body | {"stop": stop})
                    answers.append((path, stop, text, whole, streamed))
        return answers

    answers = asyncio.run(go())
    assert any(ord(c) > 127 and c != "\ufffd" for c in answers[0][2]), answers[0][2]
    for path, stop, text, whole, streamed in answers:
        assert streamed == whole, (path, stop)
        assert whole == text[: min((text.find(s) for s in stop if s in text), default=len(text))], (path, stop)


@pytest.mark.parametrize("engine", ["transformers", "openvino"])
def test_a_greedy_server_samples_each_request_with_its_own_settings_as_a_batch_file_row(tmp_path, tiny_llama, engine):
    """A client's temperature 0.7 on a server started greedy is sampled, not refused; a request's seed gives
    its text whatever runs beside it, the text the same request gives as an OpenAI Batch file's row."""
    if engine == "openvino":
        pytest.importorskip("openvino_genai")
    prompt = "Free entry in 2 a wkly comp"
    asked = [{"temperature": 2.0, "top_p": 0.95, "seed": seed} for seed in (1, 1, 2)]

    async def go():
        async with _client(_serving(tiny_llama, "generate", engine)) as client:
            openai, api = _openai_client(client)
            default = await api.completions.create(
                model=tiny_llama.name, prompt=prompt, max_tokens=8, temperature=0.7, top_p=0.9
            )
            both = await asyncio.gather(  # the same seed twice, at once, beside a greedy request and another seed
                *(api.completions.create(model=tiny_llama.name, prompt=prompt, max_tokens=8, **a) for a in asked),
                api.completions.create(model=tiny_llama.name, prompt=prompt, max_tokens=8),
            )
            return default, [b.choices[0].text for b in both]

    default, (one, again, other, greedy) = asyncio.run(go())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    assert default.choices[0].text and default.choices[0].finish_reason in ("stop", "length")
    assert one == again and one != other
    assert greedy == tokenizer.decode(
        generate_alone(tiny_llama, tokenizer(prompt)["input_ids"], 8), skip_special_tokens=True
    )
    bodies = [{"prompt": prompt, "max_tokens": 8, **a} for a in asked]
    offline, _ = _as_batch_file(tmp_path, tiny_llama, bodies, generation={"max_new_tokens": 8, "engine": engine})
    assert [offline[0], offline[2]] == [one, other]


def _as_batch_file(tmp_path, model, bodies: list[dict], **job) -> tuple[list[str], dict]:
    """Completion request bodies answered offline, as an OpenAI Batch file's lines: each one's text, and the
    job's report."""
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": b} for i, b in enumerate(bodies)
    ]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    openai = {"input": {"format": "openai", "text": None, "id": None, "keep": None}, "output__format": "openai"}
    report = run_job(make_job(tmp_path / "requests.jsonl", model, tmp_path / "out", "generate", **openai, **job))
    rows = [json.loads(line) for line in (tmp_path / "out" / "output.jsonl").read_text().splitlines()]
    texts = {row["custom_id"]: row["response"]["body"]["choices"][0]["text"] for row in rows}
    return [texts[f"r{i}"] for i in range(len(bodies))], report


CHOICES = ["ham", "spam", "not sure"]
CHOSEN = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {"enum": CHOICES}}}
ALIKE_ASKED = [  # greedy, seeded and constrained: each answered alike by serve and by an offline job
    {"max_tokens": 8},
    {"max_tokens": 8, "temperature": 2.0, "top_p": 0.95, "seed": 7},
    {"max_tokens": 12, "response_format": CHOSEN},
]


@pytest.mark.parametrize(
    "kind,dtype",
    [("avx2", "auto"), ("avx512_bf16", "auto"), ("amx", "bfloat16")],
    ids=["avx2", "avx512_bf16", "amx-bfloat16"],
)
def test_serve_and_an_offline_job_give_one_answer_in_one_precision_on_every_cpu_kind(
    tmp_path, tiny_llama, monkeypatch, kind, dtype
):
    """One precision decision for a model on a machine (the CPU kind stood in for): serve says which precision
    answers (/v1/models), the offline job's report says the same, and greedy, seeded and constrained requests
    get the same text through either. In bf16 a step's rounding depends on the rows it runs beside, so there only
    the constrained requests (run on torch) are held to their text (docs/generation.md, Precision): on a real
    bf16 CPU a greedy or seeded text differed in about 1 serve in 8, its requests meeting in other steps."""
    pytest.importorskip("openvino_genai")
    pytest.importorskip("xgrammar")
    from helpers import stand_in_for_cpu_kind

    stand_in_for_cpu_kind(kind, monkeypatch)
    prompts = ["Free entry in 2 a wkly comp", "Ok lar... Joking wif u oni"]
    asked = [{"prompt": p, **a} for p in prompts for a in ALIKE_ASKED]
    job = _serving(tiny_llama, "generate").model_copy(deep=True)
    job.model.dtype = dtype

    async def go():
        async with _client(job) as client:
            served = (await client.get("/v1/models")).json()["data"][0]["batchinfer"]
            answers = await asyncio.gather(*(client.post("/v1/completions", json=a) for a in asked))
            return served, answers

    served, answers = asyncio.run(go())
    assert [a.status_code for a in answers] == [200] * len(asked), [a.text for a in answers]
    offline, report = _as_batch_file(tmp_path, tiny_llama, asked, model__dtype=dtype, generation__max_new_tokens=12)
    assert served["precision"] == report["engine"]["precision"] == ("bf16" if dtype == "bfloat16" else "f32")
    assert served["engine"] == report["engine"]["name"]
    alike = [i for i, a in enumerate(asked) if dtype != "bfloat16" or "response_format" in a]
    assert [offline[i] for i in alike] == [answers[i].json()["choices"][0]["text"] for i in alike]


def test_a_server_whose_engine_samples_alike_for_every_request_refuses_a_requests_own_settings(tiny_llama):
    job = _serving(tiny_llama, "generate", "transformers", {"use_cuda_graph": True})

    async def go():
        async with _client(job) as client:
            hot = await client.post("/v1/completions", json={"prompt": "x", "temperature": 0.7})
            # what changes nothing under greedy decoding is taken, as a client's defaults send it
            cold = await client.post("/v1/completions", json={"prompt": "x", "temperature": 0, "top_p": 0.5})
            return hot, cold

    hot, cold = asyncio.run(go())
    assert hot.status_code == 400 and cold.status_code == 200
    assert hot.json()["error"]["message"] == (
        "temperature: this server decodes greedily (temperature 0) for every request "
        "(generation.engine_options.use_cuda_graph replays one captured sampler for every request); "
        "start it with --set generation.temperature=0.7, or leave temperature out"
    )


def test_a_chat_the_models_template_refuses_is_a_400_naming_what_it_said(tmp_path, tiny_llama):
    sys.path.insert(0, str(EXAMPLES / "models"))
    from make_tiny_causal import CHAT_TEMPLATE

    no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    (tmp_path / "chat.jinja").write_text(no_system + CHAT_TEMPLATE)
    job = _serving(tiny_llama, "generate").model_copy(deep=True)
    job.model.chat_template = str(tmp_path / "chat.jinja")

    async def chat():
        async with _client(job) as client:
            post = lambda messages: client.post("/v1/chat/completions", json={"max_tokens": 2, "messages": messages})  # noqa: E731
            return await post([{"role": "system", "content": "Be brief."}]), await post(
                [{"role": "user", "content": "Hi"}]
            )

    refused, answered = asyncio.run(chat())
    assert refused.status_code == 400 and answered.status_code == 200
    assert "chat template refuses these messages: TemplateError: System role not supported" in refused.text


def test_every_request_field_is_honoured_or_refused_by_name(tiny_llama, tiny_embed):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    plain = [{"role": "user", "content": "Hi\nthere"}]

    async def chat():
        async with _client(_serving(tiny_llama, "generate")) as client:
            post = lambda extra: client.post("/v1/chat/completions", json={"max_tokens": 5, **extra})  # noqa: E731
            same = [await post({"messages": m}) for m in (plain, parts)]
            neutral = await post(
                {"messages": plain, "n": 1, "presence_penalty": 0, "logprobs": False, "user": "u", "seed": 7}
            )
            refused = [
                await post({"messages": plain, **extra})
                for extra in (
                    {"logprobs": True},
                    {"temprature": 0.5},
                    {"tools": [{"type": "function", "function": {"name": "f"}}]},
                    {"functions": [{"name": "f"}]},
                    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                    {"stream_options": {"include_usage": True}},
                )
            ]
            events = []
            body = {"messages": plain, "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", "/v1/chat/completions", json={"max_tokens": 5, **body}) as streamed:
                async for line in streamed.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
            return same, neutral, refused, events

    async def embed():
        async with _client(_serving(tiny_embed, "embed")) as client:
            return [
                await client.post("/v1/embeddings", json={"input": "hi", **extra})
                for extra in ({"user": "u", "model": tiny_embed.name}, {"dimensions": 8}, {"input_type": "query"})
            ]

    same, neutral, refused, events = asyncio.run(chat())
    assert [a.status_code for a in same] == [200, 200]
    assert same[0].json()["choices"] == same[1].json()["choices"] and same[0].json()["usage"] == same[1].json()["usage"]
    assert neutral.status_code == 200 and neutral.json()["choices"] == same[0].json()["choices"]
    messages = [r.json()["error"]["message"] for r in refused]
    assert [r.status_code for r in refused] == [400] * 6, messages
    for message, said in zip(
        messages,
        (
            "unsupported: logprobs",
            "unsupported: temprature",
            "unsupported: tools",
            "unsupported: functions",
            "unsupported: messages[0].content[0] is a content part of type image_url",
            "stream_options: only with stream: true",
        ),
    ):
        assert message.startswith(said), message
    text = "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"])
    assert text == same[0].json()["choices"][0]["message"]["content"]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == same[0].json()["usage"]
    answers = asyncio.run(embed())
    assert [a.status_code for a in answers] == [200, 400, 400]
    assert answers[1].json()["error"]["message"].startswith("unsupported: dimensions")
    assert answers[2].json()["error"]["message"].startswith("unsupported: input_type (not a field of /v1/embeddings")


def test_a_body_past_max_body_bytes_is_413_before_it_is_read_or_parsed(tiny_embed):
    async def go():
        async with _client(_serving(tiny_embed, "embed", max_body_bytes=50_000)) as client:
            fits = json.dumps({"input": ["a short text here"] * 2000}).encode()  # 42 kB
            large = b'{"input": "' + b"x" * 200_000  # not even JSON: parsed, it would be a 400

            async def chunked():  # no Content-Length: the bytes are counted as they come
                for start in range(0, len(large), 16_384):
                    yield large[start : start + 16_384]

            headers = {"content-type": "application/json"}
            return [
                await client.post("/v1/embeddings", content=body, headers=headers) for body in (fits, large, chunked())
            ]

    fits, large, chunked = asyncio.run(go())
    assert fits.status_code == 200 and len(fits.json()["data"]) == 2000
    for answer in (large, chunked):
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["message"].startswith("the body is larger than serve.max_body_bytes (50,000")


def test_a_full_queue_refuses_before_tokenizing_and_a_burst_leaves_memory_where_it_was(tiny_embed, monkeypatch):
    from batchinfer.heap import rss
    from batchinfer.runners.embed import EmbedRunner

    tokenized = []
    tokenize = EmbedRunner.tokenize
    monkeypatch.setattr(
        EmbedRunner, "tokenize", lambda self, texts: tokenized.append(len(texts)) or tokenize(self, texts)
    )
    words = "the quick brown fox jumps over the lazy dog near the river bank "
    # texts of nearly max_length tokens (a longer one is a 400 on this route: its answer cannot say it was cut)
    body = json.dumps({"input": [" ".join(words.split() * 8)[:500]] * 200}).encode()

    async def go(**serve):
        async with _client(_serving(tiny_embed, "embed", **serve)) as client:
            await client.post("/v1/embeddings", json={"input": ["warm up"]})
            tokenized.clear()  # the server's own warm-up and the request above
            before = rss()
            answers = await asyncio.gather(
                *(
                    client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
                    for _ in range(3)
                )
            )
            return [a.status_code for a in answers], before, rss()

    codes, before, after = asyncio.run(go(max_wait_ms=200, max_queue_tokens=30_000))  # one request: 25,600
    assert sorted(codes) == [200, 429, 429] and tokenized == [200]  # the refused two were never tokenized
    codes, before, after = asyncio.run(go())
    assert codes == [200, 200, 200] and tokenized == [200, 200, 200]
    assert after - before < 64 << 20, f"{(after - before) / 1e6:.0f} MB more after the burst"


def _metric(text: str, name: str) -> float:
    return next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_puts_the_loaded_model_out_of_the_collectors_sight_before_it_listens(tiny_embed, monkeypatch):
    """A full collection walked the model's ~470,000 objects (200 ms for MiniLM on a CPU) while requests waited:
    what is loaded before the server listens is frozen (gc.freeze), so collections walk what requests make."""
    import gc

    from typer.testing import CliRunner

    import batchinfer.cli as cli

    frozen = []

    class Listening:
        def __init__(self, settings):
            pass

        def run(self):
            frozen.append(gc.get_freeze_count())

    monkeypatch.setattr(cli, "_graceful_server", lambda: Listening)
    try:
        args = ["serve", "--model", str(tiny_embed), "--task", "embed", "--port", str(_free_port())]
        result = CliRunner().invoke(cli.app, args)
    finally:
        gc.unfreeze()
    assert result.exit_code == 0, result.output
    assert frozen and frozen[0] > 100_000  # transformers and torch alone are more


def test_a_real_server_drains_its_queue_on_sigterm(tiny_embed, tmp_path):
    port, log = _free_port(), tmp_path / "serve.log"
    args = ["serve", "--model", str(tiny_embed), "--task", "embed", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    with Cli([*args, "--set", "serve.max_wait_ms=5000"], str(log), str(log)) as proc:
        deadline = time.time() + 60
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=1).json()["status"] == "ok":
                    break
            time.sleep(0.2)
        answer = {}
        sender = threading.Thread(
            target=lambda: answer.update(
                r=httpx.post(f"{base}/v1/embeddings", json={"input": ["queued before the stop"]}, timeout=30)
            )
        )
        sender.start()
        while _metric(httpx.get(f"{base}/metrics", timeout=5).text, "batchinfer_queued_tokens") == 0:
            assert sender.is_alive(), answer  # answered before it was seen queued: max_wait 5 s holds it
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # the request is queued (max_wait 5 s), not answered
        sender.join(timeout=30)
        proc.wait(30)
    output = log.read_text()
    assert answer["r"].status_code == 200 and len(answer["r"].json()["data"][0]["embedding"]) == 32
    assert proc.returncode == 0, output


def test_a_failed_batch_answers_500_and_the_server_goes_on(sms_table, tiny_embed):
    texts = sms_table.column("text").to_pylist()[:3]

    async def go():
        job = _serving(tiny_embed, "embed", max_wait_ms=1)
        app = create_app(job, resolve_model_path(job.model.path))
        runner, batcher = app.state.service.runner, app.state.service.batcher
        real_run, real_on_batch = runner.run, batcher.on_batch

        def broken_run(batch):
            raise ValueError("a kernel the test broke")

        def broken_on_batch(stats):
            raise KeyError("metrics the test broke")

        async with _client(job, app) as client:
            runner.run = broken_run  # every row fails, one by one
            rows_failed = await client.post("/v1/embeddings", json={"input": texts})
            runner.run, batcher.on_batch = real_run, broken_on_batch  # the batch loop itself fails
            batch_failed = await client.post("/v1/embeddings", json={"input": texts})
            batcher.on_batch = real_on_batch
            after = await client.post("/v1/embeddings", json={"input": texts})
            health = await client.get("/health")
        return rows_failed, batch_failed, after, health

    rows_failed, batch_failed, after, health = asyncio.run(go())
    assert rows_failed.status_code == 500
    assert rows_failed.json()["error"]["message"] == "input[0]: model_error: ValueError: a kernel the test broke"
    assert batch_failed.status_code == 500
    assert "the batch failed: KeyError" in batch_failed.json()["error"]["message"]
    assert after.status_code == 200 and len(after.json()["data"]) == 3
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("task", ["embed", "score"])
def test_the_model_runs_a_row_then_a_few_before_the_server_takes_a_request(
    task, tiny_embed, tiny_cross_encoder, monkeypatch
):
    """A model's first pass sets up kernels and memory (385 ms for MiniLM on a CPU, then 10 ms): a first
    request that paid for it was late, and serve.p99_ms shed load for a while after it."""
    import batchinfer.serve.services as services

    batches, make_runner = [], services.make_runner

    def counted(job, path):
        runner = make_runner(job, path)
        real = runner.run
        runner.run = lambda batch: batches.append(len(batch)) or real(batch)
        return runner

    monkeypatch.setattr(services, "make_runner", counted)
    job = _serving(tiny_cross_encoder if task == "score" else tiny_embed, task)
    create_app(job, resolve_model_path(job.model.path))
    assert batches == [1, services.WARM_UP_ROWS]


def test_a_bug_is_a_500_in_openais_error_body_not_plain_text_and_the_server_goes_on(tiny_llama):
    """A negative seed was OpenVINO GenAI's TypeError, answered `Internal Server Error` in plain text: whatever
    escapes a route is still an error body a client reads."""

    async def go():
        job = _serving(tiny_llama, "generate")
        app = create_app(job, resolve_model_path(job.model.path))
        service, ask = app.state.service, app.state.service.ask

        async def broken(*args):
            raise TypeError("a bug the test put in")

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # as a server answers
            async with httpx.AsyncClient(transport=transport, base_url="http://batchinfer", timeout=60) as client:
                service.ask = broken
                failed = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                service.ask = ask
                after = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        return failed, after

    failed, after = asyncio.run(go())
    assert failed.status_code == 500 and failed.json()["error"] == {
        "message": "internal error: TypeError: a bug the test put in",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert after.status_code == 200


def test_a_stopped_generation_engine_answers_503_and_health_says_so(tiny_llama):
    async def go():
        job = _serving(tiny_llama, "generate")
        app = create_app(job, resolve_model_path(job.model.path))
        async with _client(job, app) as client:
            ok = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
            app.state.service.engine.stop()
            down = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
            streamed = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2, "stream": True})
            health = await client.get("/health")
        return ok, down, streamed, health

    ok, down, streamed, health = asyncio.run(go())
    assert ok.status_code == 200
    assert down.status_code == 503 and "the generation engine has stopped" in down.json()["error"]["message"]
    assert streamed.status_code == 503 and "has stopped" in streamed.json()["error"]["message"]
    assert health.status_code == 503 and health.json()["status"] == "failed"


def _serve_cli(args: list[str]):
    """`batchinfer serve ...` as the command line runs it, in this process: the errors below come before a
    server would listen, so no process (and no second torch import) is needed to see them."""
    from typer.testing import CliRunner

    from batchinfer.cli import app

    return CliRunner().invoke(app, ["serve", *args])


def test_serve_reports_a_model_that_cannot_load_before_listening(tiny_embed, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_embed, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    result = _serve_cli(["--model", str(broken), "--task", "embed", "--port", str(_free_port())])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "serving embed" not in result.output
    assert str(broken) in result.output or "broken" in result.output, result.output


def test_a_port_already_taken_is_one_message_before_the_model_loads(tiny_embed):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve_cli(["--model", str(tiny_embed), "--task", "embed", "--port", str(port)])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output, result.output
    assert "serving embed" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "listen, said",
    [
        (["--port", "99999"], ["--port 99999 is not a port to listen on", "give --port a number from 1 to 65535"]),
        (["--port", "-1"], ["--port -1 is not a port to listen on", "from 1 to 65535"]),
        (["--port", "0"], ["--port 0 is not a port to listen on", "from 1 to 65535"]),  # it could not say which
        (["--host", "192.0.2.1"], ["cannot listen on 192.0.2.1:", "192.0.2.1 is not an address of this machine"]),
    ],
)
def test_a_port_or_host_serve_cannot_listen_on_is_one_message_saying_why(tiny_embed, listen, said, monkeypatch):
    import batchinfer.cli as cli

    monkeypatch.setattr(cli, "_graceful_server", lambda: pytest.fail("serve went on to listen"))
    result = _serve_cli(["--model", str(tiny_embed), "--task", "embed", "--port", str(_free_port()), *listen])
    assert result.exit_code == 2, result.output
    assert all(words in result.output for words in said), result.output
    assert "internal error" not in result.output and "stop the program" not in result.output


def test_serve_says_at_once_that_it_does_not_run_a_task(tiny_nli):
    result = _serve_cli(["--model", str(tiny_nli), "--task", "zero-shot"])
    assert result.exit_code == 2, result.output
    assert "serve runs tasks embed, classify, score, generate; zero-shot runs offline" in result.output
    assert "labels" not in result.output  # not first a request for what the task would need


def test_a_job_file_written_for_openai_batch_files_serves_embeddings(tiny_embed):
    openai = {"format": "openai", "text": None, "id": None, "keep": None}
    job = make_job("-", tiny_embed, "-", input=openai, output__format="openai")

    async def go():
        async with _client(job) as client:
            return await client.post("/v1/embeddings", json={"input": ["one", "two words"]})

    answer = asyncio.run(go())  # was an AttributeError (a 500) on every request
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"]) == 2 and answer.json()["usage"]["prompt_tokens"] > 0


def test_encoder_answers_are_written_as_json_without_fastapis_walk_over_each_value(
    tiny_embed, tiny_classify, monkeypatch
):
    """An embedding's floats went through FastAPI's jsonable_encoder one by one before json.dumps wrote them, on
    the event loop: 39 ms for 64 MiniLM embeddings (2-core AVX2 EPYC). The answers are the same JSON without it."""
    import fastapi.routing

    walked = []
    walk = fastapi.routing.jsonable_encoder
    monkeypatch.setattr(
        fastapi.routing, "jsonable_encoder", lambda value, **kw: walked.append(value) or walk(value, **kw)
    )

    async def go(job, path, body):
        async with _client(job) as client:
            return await client.post(path, json=body)

    embedded = asyncio.run(go(_serving(tiny_embed, "embed"), "/v1/embeddings", {"input": ["one", "two words"]}))
    classified = asyncio.run(go(_serving(tiny_classify, "classify"), "/classify", {"input": ["one", "two words"]}))
    assert embedded.status_code == classified.status_code == 200, (embedded.text, classified.text)
    assert not walked
    vectors = [item["embedding"] for item in embedded.json()["data"]]
    assert len(vectors) == 2 and all(isinstance(x, float) for v in vectors for x in v)
    assert [row["index"] for row in classified.json()["data"]] == [0, 1]


def test_every_refusal_is_the_servers_error_body_naming_the_limit(tiny_embed):
    async def go():
        job = _serving(tiny_embed, "embed", max_queue_tokens=60, read_timeout_s=0.5)
        async with _client(job) as client:
            json_headers = {"content-type": "application/json"}

            async def never_ends():
                yield b'{"input": ["a'
                await asyncio.sleep(30)

            return [
                await client.post("/v1/embeddings", content=b'{"input": "caf\xe9"}', headers=json_headers),
                await client.post("/v1/embeddings", content=b"[" * 5000 + b"]" * 5000, headers=json_headers),
                await client.post("/v1/nothing", json={"input": "x"}),
                await client.get("/v1/embeddings"),
                await client.post("/v1/embeddings", json={"input": ["two words"] * 30}),  # 120 tokens
                await client.post("/v1/embeddings", content=never_ends(), headers=json_headers),
            ]

    answers = asyncio.run(go())
    statuses = [a.status_code for a in answers]
    assert statuses == [400, 400, 404, 405, 413, 408], [a.text for a in answers]
    assert all(set(a.json()) == {"error"} for a in answers)  # never FastAPI's {"detail": ...}
    messages = [a.json()["error"]["message"] for a in answers]
    assert messages[0].startswith("the body is not valid UTF-8 (invalid continuation byte at byte 14)")
    assert messages[1].startswith("the body nests too deep to read")
    assert messages[2].startswith("no endpoint /v1/nothing") and "GET" in messages[3]
    assert messages[4] == (
        "the request is 120 tokens, more than the queue holds (serve.max_queue_tokens, 60); "
        "split it into requests of at most 60 tokens"
    )
    assert messages[5].startswith("the body stopped coming: nothing more for serve.read_timeout_s (0.5 s)")


def test_requests_are_counted_by_their_route_not_by_each_path_a_client_sends(tiny_embed):
    """batchinfer_requests_total's endpoint is the route's template, and one label for every path no route takes:
    a client trying paths cannot add a series per path (each kept until the server stops)."""

    async def go():
        async with _client(_serving(tiny_embed, "embed", max_body_bytes=1000)) as client:
            for path in ("/rand7", "/rand8", "/v1/models/m123", "/v1/models/org/m456"):
                await client.get(path)
            await client.post("/v1/embeddings", json={"input": "counted"})
            await client.get("/v1/embeddings")
            for path in ("/v1/embeddings", "/rand9"):  # refused before routing, by the body's size
                await client.post(path, json={"input": "x" * 2000})
            return (await client.get("/metrics")).text

    counted = {
        line.split(" ")[0].removeprefix("batchinfer_requests_total"): float(line.split(" ")[1])
        for line in asyncio.run(go()).splitlines()
        if line.startswith("batchinfer_requests_total{")
    }
    assert counted == {
        '{endpoint="unmatched",status="404"}': 2.0,
        '{endpoint="/v1/models/{model:path}",status="404"}': 2.0,
        '{endpoint="/v1/embeddings",status="200"}': 1.0,
        '{endpoint="/v1/embeddings",status="405"}': 1.0,
        '{endpoint="/v1/embeddings",status="413"}': 1.0,
        '{endpoint="unmatched",status="413"}': 1.0,
    }


def test_a_client_that_goes_away_has_its_queued_rows_dropped_and_one_line_logged(tiny_embed, caplog):
    job = _serving(tiny_embed, "embed", max_wait_ms=1500)
    app = create_app(job, resolve_model_path(job.model.path))
    batches = []
    app.state.service.batcher.on_batch = batches.append

    async def call(texts, leaves_after=None):
        """The app called as a server would; the client disconnects `leaves_after` seconds in."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST"}
        scope |= {"path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"", "scheme": "http"}
        scope |= {"headers": [(b"content-type", b"application/json")], "server": ("b", 80), "client": ("c", 1)}
        messages = [{"type": "http.request", "body": json.dumps({"input": texts}).encode(), "more_body": False}]
        sent, leaves = [], time.monotonic() + (leaves_after or 60)

        async def receive():  # as uvicorn's: a disconnect, once it happened, is told without waiting
            if messages:
                return messages.pop()
            if time.monotonic() < leaves:
                await asyncio.sleep(leaves - time.monotonic())
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"]

    async def go():
        async with app.router.lifespan_context(app):
            gone = await call(["a text nobody waits for"] * 200, leaves_after=0.3)
            queued = app.state.service.batcher.queued_tokens  # at once, not when the window closes
            return gone, queued, await call(["next"])

    with caplog.at_level("INFO"):
        gone, queued, after = asyncio.run(go())
    assert gone == 499 and queued == 0 and after == 200
    assert [b.rows for b in batches] == [1]  # the 200 rows never ran
    said = [r for r in caplog.records if r.name.startswith(("batchinfer", "uvicorn"))]
    assert [r.getMessage() for r in said] == [
        "/v1/embeddings: the client went away before its answer; its queued work was dropped"
    ]
    assert not any(r.exc_info for r in caplog.records)


@contextlib.contextmanager
def _listening(app):
    """`app` served by uvicorn on a free port, in a thread: its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(60)


def test_a_client_that_leaves_a_whole_completion_frees_what_it_held_at_once(tiny_llama, sms_table):
    """A completion answered whole is looked at while its tokens come, not only when they stop: once its client
    has gone it is dropped from the engine, its tokens go back to serve.max_queue_tokens within a look or two,
    and it is counted as a 499, not run on to its end."""
    prompt = sms_table.column("text")[17].as_py()  # the tiny model goes on for 702 tokens: seconds on this engine
    job = _serving(tiny_llama, "generate", engine="transformers")
    app = create_app(job, resolve_model_path(job.model.path))
    with _listening(app) as base:
        # the engine set up by a first request: the next one is generating when its client leaves
        assert httpx.post(f"{base}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 1000}, timeout=1)
        left = time.monotonic()
        while _metric(httpx.get(f"{base}/metrics").text, "batchinfer_queued_tokens") and time.monotonic() < left + 10:
            time.sleep(0.05)
        freed = time.monotonic() - left
        metrics = httpx.get(f"{base}/metrics").text
    assert freed < 2, f"held {freed:.1f} s after its client left"
    assert 'batchinfer_requests_total{endpoint="/v1/completions",status="499"} 1.0' in metrics


def test_a_client_that_closes_a_stream_part_way_is_counted_499(tiny_llama, sms_table):
    """A stream whose client closes it is cancelled by the server, not told so: it was counted nowhere."""
    prompt = sms_table.column("text")[17].as_py()  # a long completion on the tiny model
    job = _serving(tiny_llama, "generate", engine="transformers")
    app = create_app(job, resolve_model_path(job.model.path))
    body = {"prompt": prompt, "max_tokens": 1000, "stream": True}
    with _listening(app) as base:
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as answer:
            assert answer.status_code == 200
            next(answer.iter_lines())  # a first event, then the client goes
        left, counted = time.monotonic(), ""
        while '"/v1/completions",status="499"} 1.0' not in counted and time.monotonic() < left + 10:
            time.sleep(0.05)
            counted = httpx.get(f"{base}/metrics").text
    assert 'batchinfer_requests_total{endpoint="/v1/completions",status="499"} 1.0' in counted
    assert 'status="200"' not in counted.split("batchinfer_requests_total", 1)[1].split("# HELP", 1)[0]


JSON = {"content-type": "application/json"}


def test_settings_out_of_range_and_chat_without_a_template_are_400s_in_the_batch_files_words(tiny_llama_plain):
    from batchinfer.openai_compat.batch_files import parse_request

    bad = ({"temperature": -1}, {"temperature": float("nan")}, {"top_p": 5}, {"max_tokens": 0}, {"seed": "7"})

    async def go():
        async with _client(_serving(tiny_llama_plain, "generate")) as client:
            refused = [  # NaN as Python's json writes it (httpx's json= refuses to)
                await client.post("/v1/completions", content=json.dumps({"prompt": "x", **extra}), headers=JSON)
                for extra in bad
            ]
            chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
            text = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3})
            return refused, chat, text

    refused, chat, text = asyncio.run(go())
    for answer, extra in zip(refused, bad):
        line = {"custom_id": "r", "url": "/v1/completions", "body": {"prompt": "x", **extra}}
        said = parse_request(line)[1][1].removeprefix("body.")
        assert answer.status_code == 400 and answer.json()["error"] == {
            "message": said,
            "type": "invalid_request_error",
            "param": next(iter(extra)),
            "code": None,
        }
    assert "--set generation.temperature" not in refused[0].json()["error"]["message"]
    assert chat.status_code == 400 and "model.chat_template" in chat.json()["error"]["message"]
    assert chat.json()["error"]["message"].startswith("messages: chat messages need a chat template")
    assert text.status_code == 200


@pytest.mark.parametrize("engine", ["transformers", "openvino"])
def test_a_seed_no_engine_takes_is_a_400_naming_it_and_the_requests_beside_it_are_answered(tiny_llama, engine):
    """Any int64 passed as a seed; OpenVINO GenAI's rng_seed is unsigned, and a negative one was its TypeError
    inside the running batch: a 500 in plain text. Every engine takes 0 to 2**63-1 (a seed's int64 column)."""
    if engine == "openvino":
        pytest.importorskip("openvino_genai")
    sampled = {"prompt": "Free entry in 2 a wkly comp", "max_tokens": 4, "temperature": 1.0}

    async def go():
        async with _client(_serving(tiny_llama, "generate", engine)) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=sampled | {"seed": seed}) for seed in (-1, 7, 2**64 - 1)),
                client.post("/v1/completions", json={"prompt": "Ok lar joking wif u oni", "max_tokens": 4}),
            )

    negative, seeded, past, greedy = asyncio.run(go())
    assert (negative.status_code, seeded.status_code, past.status_code, greedy.status_code) == (400, 200, 400, 200)
    assert negative.json()["error"] == {
        "message": f"seed: must be a whole number from 0 to {2**63 - 1} (got -1)",
        "type": "invalid_request_error",
        "param": "seed",
        "code": None,
    }
    assert past.json()["error"]["param"] == "seed"
    assert seeded.json()["choices"][0]["text"] and greedy.json()["choices"][0]["text"]


def test_a_request_naming_another_model_is_openais_404_model_not_found(
    tiny_embed, tiny_classify, tiny_cross_encoder, tiny_llama
):
    """Every endpoint that takes `model` answered any name with the served model ("gpt-4o" got a tiny Llama's
    text) while GET /v1/models/gpt-4o was a 404. The served name, model.path and serve.model_aliases are
    taken; a request naming no model is answered by the served one."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    servers = [
        (tiny_embed, "embed", {"/v1/embeddings": {"input": "hi"}}),
        (tiny_classify, "classify", {"/classify": {"input": "hi"}}),
        (tiny_cross_encoder, "score", {"/score": {"pairs": [["hi", "there"]]}}),
        (tiny_llama, "generate", {"/v1/completions": {"prompt": "hi", "max_tokens": 2}, "/v1/chat/completions": chat}),
    ]

    async def go(model, task, bodies):
        async with _client(_serving(model, task, model_aliases=["gpt-4o-mini"])) as client:
            answers = {}
            for path, body in bodies.items():
                for name in ("nope", "gpt-4o", model.name, str(model), "gpt-4o-mini", None):
                    sent = body if name is None else body | {"model": name}
                    answers[path, name] = await client.post(path, json=sent)
            for name in ("gpt-4o-mini", "nope"):
                answers["GET", name] = await client.get(f"/v1/models/{name}")
            return answers

    for model, task, bodies in servers:
        answers = asyncio.run(go(model, task, bodies))
        for path in bodies:
            statuses = [answers[path, name].status_code for name in ("nope", "gpt-4o", model.name, str(model))]
            statuses += [answers[path, "gpt-4o-mini"].status_code, answers[path, None].status_code]
            assert statuses == [404, 404, 200, 200, 200, 200], (path, answers[path, "nope"].text)
            assert answers[path, "gpt-4o"].json() == {
                "error": {
                    "message": f"the model 'gpt-4o' does not exist here; this server serves '{model.name}' "
                    "(GET /v1/models)",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
        assert answers["GET", "gpt-4o-mini"].json()["id"] == model.name
        assert answers["GET", "nope"].status_code == 404
        assert answers["GET", "nope"].json()["error"]["code"] == "model_not_found"
    assert served_name(_serving("hf:org/name", "embed")) == "org/name"  # a hub model by its id, as vLLM names it


def _openai_client(client: httpx.AsyncClient):
    """The official openai client over the app that `client` reaches, so every answer is parsed into its types."""
    openai = pytest.importorskip("openai")
    return openai, openai.AsyncOpenAI(base_url="http://batchinfer/v1", api_key="x", http_client=client, max_retries=0)


def test_the_openai_client_lists_models_and_embeds_lists_and_reads_errors_with_their_param(tiny_embed):
    job = _serving(tiny_embed, "embed")

    async def go():
        async with _client(job) as client:
            openai, api = _openai_client(client)
            listed = await api.models.list()
            one = await api.models.retrieve(tiny_embed.name)  # a folder is named by its name
            by_path = await api.models.retrieve(job.model.path)  # or by its path: the slashes are quoted
            with pytest.raises(openai.NotFoundError) as missing:
                await api.models.retrieve("gpt-4o")
            vectors = await api.embeddings.create(
                input=["one", "two words"], model=tiny_embed.name
            )  # base64 by default
            floats = await api.embeddings.create(input="one", model=tiny_embed.name, encoding_format="float")
            with pytest.raises(openai.BadRequestError) as bad:
                await api.embeddings.create(input=["one", " "], model=tiny_embed.name)
            with pytest.raises(openai.BadRequestError) as refused:
                await api.embeddings.create(input="one", model=tiny_embed.name, extra_body={"logprobs": True})
            curl = await client.post("/v1/embeddings", content=b'{"input": "one"}')  # as curl -d sends it
            form = await client.post("/v1/embeddings", data={"input": "one"})
            nowhere = await client.post("/v1/nothing", json={"input": "x"})
        async with _client(_serving(tiny_embed, "embed", model_name="minilm")) as named:  # serve.model_name
            renamed = (await named.get("/v1/models")).json()["data"][0]["id"]
        return (
            listed,
            one,
            by_path,
            missing.value,
            vectors,
            floats,
            bad.value,
            refused.value,
            curl,
            form,
            nowhere,
            renamed,
        )

    listed, one, by_path, missing, vectors, floats, bad, refused, curl, form, nowhere, renamed = asyncio.run(go())
    assert renamed == "minilm"
    assert [m.id for m in listed.data] == [tiny_embed.name] and listed.data[0].object == "model"
    assert one.id == by_path.id == tiny_embed.name and one.owned_by == "batchinfer" and one.created > 0
    assert missing.status_code == 404 and "gpt-4o" in missing.message
    assert [d.index for d in vectors.data] == [0, 1] and len(vectors.data[0].embedding) == len(floats.data[0].embedding)
    assert np.allclose(vectors.data[0].embedding, floats.data[0].embedding, atol=1e-6)
    assert bad.param == "input[1]" and bad.type == "invalid_request_error"
    assert refused.param == "logprobs" and refused.code is None
    assert curl.status_code == 200, curl.text  # was: the body must be a JSON object (got b'{"input":"one"}')
    assert curl.json()["data"][0]["embedding"] == floats.data[0].embedding
    assert form.status_code == 400 and "Content-Type: application/json" in form.json()["error"]["message"]
    assert nowhere.status_code == 404 and nowhere.json()["error"]["param"] is None


def test_the_openai_client_completes_a_list_of_prompts_and_streams_chat_with_its_role(tiny_llama):
    async def go():
        async with _client(_serving(tiny_llama, "generate")) as client:
            openai, api = _openai_client(client)
            both = await api.completions.create(
                model=tiny_llama.name, prompt=["Hello there", "Are you coming"], max_tokens=6
            )
            alone = [
                await api.completions.create(model=tiny_llama.name, prompt=p, max_tokens=6)
                for p in ("Hello there", "Are you coming")
            ]
            messages = [{"role": "user", "content": "Hi"}]
            chunks = [
                c
                async for c in await api.chat.completions.create(
                    model=tiny_llama.name, messages=messages, max_tokens=4, stream=True
                )
            ]
            whole = await api.chat.completions.create(model=tiny_llama.name, messages=messages, max_tokens=4)
            streamed = [  # a list streamed: each chunk a piece of one prompt's choice, as OpenAI streams it
                c
                async for c in await api.completions.create(
                    model=tiny_llama.name,
                    prompt=["Hello there", "Are you coming"],
                    max_tokens=6,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            return both, alone, chunks, whole, streamed

    both, alone, chunks, whole, streamed = asyncio.run(go())
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a.choices[0].text for a in alone]  # each as if asked alone
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    pieces = [c for c in streamed if c.choices]
    assert {type(c).__name__ for c in streamed} == {"Completion"} and all(len(c.choices) == 1 for c in pieces)
    assert sorted({c.choices[0].index for c in pieces}) == [0, 1] and len({c.id for c in streamed}) == 1
    for i, answer in enumerate(both.choices):  # each prompt's pieces in order make its whole answer
        mine = [c.choices[0] for c in pieces if c.choices[0].index == i]
        assert "".join(p.text for p in mine) == answer.text and mine[-1].finish_reason == answer.finish_reason
        assert all(p.finish_reason is None for p in mine[:-1])
    assert streamed[-1].usage.total_tokens == both.usage.total_tokens and not streamed[-1].choices


def test_one_client_cannot_hold_generation_past_max_queue_tokens(tiny_llama):
    """serve.max_queue_tokens bounds generation as it bounds encoders: a request that could never fit is 413,
    one that does not fit beside what runs now is 429 at once, and a small request from another client is
    answered within its own time, not after another client's thousands of prompts."""

    async def go():
        job = _serving(tiny_llama, "generate", max_queue_tokens=600)
        async with _client(job) as client:
            texts = [f"message number {i}" for i in range(1500)]
            giant = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": texts, "max_tokens": 8}))
            started = time.perf_counter()
            small = await client.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 4})
            small_seconds = time.perf_counter() - started
            giant = await giant
            # one request holding most of the bound: a second one beside it waits for nothing, it is told to retry
            held, beside = await asyncio.gather(
                client.post("/v1/completions", json={"prompt": texts[:30], "max_tokens": 8}),
                client.post("/v1/completions", json={"prompt": texts[:10], "max_tokens": 8}),
            )
            after = await client.post("/v1/completions", json={"prompt": texts[:10], "max_tokens": 8})
            listed = await client.post("/v1/completions", json={"prompt": ["x"] * 2049, "max_tokens": 1})
            return giant, small, small_seconds, held, beside, after, listed

    giant, small, small_seconds, held, beside, after, listed = asyncio.run(go())
    assert giant.status_code == 413, giant.text[:300]
    assert giant.json()["error"]["message"].startswith("the request is at least 13,500 tokens, more than the queue ")
    assert "(serve.max_queue_tokens, 600); split it" in giant.json()["error"]["message"]
    assert small.status_code == 200 and small_seconds < 20, small_seconds  # measured: about 1 s
    assert held.status_code == 200 and beside.status_code == 429, beside.text
    said = beside.json()["error"]["message"]
    assert "the limit is serve.max_queue_tokens (600); retry shortly" in said and beside.headers["retry-after"] == "1"
    assert after.status_code == 200  # what the first held is free again once it is answered
    assert listed.status_code == 400
    assert (
        listed.json()["error"]["message"] == "prompt: 2,049 texts, more than the 2,048 one request may hold; split it"
    )


@pytest.mark.parametrize(
    "body, refused, said",
    [
        (
            "ScoreBody",
            {"pairs": [["a", "b"]], "query": "q", "documents": ["d"]},
            "give pairs, or query and documents, not both",
        ),
        ("ScoreBody", {"query": "q"}, "give pairs: [[text, text_pair], ...], or query and documents"),
        ("ScoreBody", {"pairs": []}, "pairs: empty; give one at least (got [])"),
        (
            "ScoreBody",
            {"pairs": [["a", "b"], ["c", " "]]},
            "pairs[1]: both texts must hold something to read (got ['c', ' '])",
        ),
        (
            "ScoreBody",
            {"query": " ", "documents": ["d"]},
            "query: empty, or only whitespace, invisible or control characters (got ' ')",
        ),
        (
            "ScoreBody",
            {"query": "q", "documents": ["d", ""]},
            "documents[1]: empty, or only whitespace, invisible or control characters (got '')",
        ),
        (
            "ChatBody",
            {"messages": [], "stream_options": {"include_usage": True}},
            "stream_options: only with stream: true (got {'include_usage': True})",
        ),
        (
            "CompletionBody",
            {"prompt": "p", "stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage: must be true or false (got 'yes')",
        ),
        (
            "CompletionBody",
            {"prompt": "p", "stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options: continuous_usage_stats is not one of its fields (include_usage, include_obfuscation); "
            "leave it out (got {'continuous_usage_stats': True})",
        ),
        (
            "CompletionBody",
            {"prompt": "p", "stream": True, "stream_options": "usage"},
            "stream_options: must be an object, such as {\"include_usage\": true} (got 'usage')",
        ),
    ],
)
def test_a_score_or_stream_options_body_is_refused_by_its_model_naming_the_field_and_the_fix(body, refused, said):
    """The checks are the body models' own (FastAPI answers them as a 400 in describe's words, before a route
    runs); a body they take reads as the route needs it."""
    from pydantic import ValidationError

    from batchinfer.openai_compat.requests import describe
    from batchinfer.serve import bodies

    with pytest.raises(ValidationError) as caught:
        getattr(bodies, body).model_validate(refused)
    assert describe(caught.value.errors()) == said
    streamed = {"prompt": "p", "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}
    assert bodies.CompletionBody.model_validate(streamed).include_usage
    assert not bodies.CompletionBody.model_validate({"prompt": "p", "stream": True}).include_usage
    assert bodies.ScoreBody.model_validate({"query": "q", "documents": ["a", "b"]}).texts() == [("q", "a"), ("q", "b")]


@pytest.mark.parametrize(
    "messages, param, said",
    [
        ([{"role": "user"}], "messages[0].content", "messages[0].content: is missing"),
        ([{"content": "hi"}], "messages[0].role", "messages[0].role: is missing"),
        ([{"role": "user", "content": "hi"}, {"role": "user", "content": 5}], "messages[1].content", "not a number"),
        (["hi"], "messages[0]", "messages[0]: input should be a valid dictionary"),
        ([{"role": "wizard", "content": "hi"}], "messages[0].role", "'wizard' is no role of an OpenAI chat message"),
    ],
)
def test_a_chat_message_that_is_not_one_is_a_400_naming_the_message_and_the_key(tiny_llama, messages, param, said):
    """It was one message for every case, 'messages must be a list of {role, content} messages', param null."""

    async def go():
        async with _client(_serving(tiny_llama, "generate")) as client:
            return await client.post("/v1/chat/completions", json={"messages": messages})

    answer = asyncio.run(go())
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == param and said in error["message"], error
