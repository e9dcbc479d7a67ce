"""`batchinfer serve`: the job's runners behind HTTP, with online batching (pip install -e ".[serve]").

    POST /v1/embeddings        task embed     OpenAI's shape: {input: str | [str], encoding_format}
    POST /classify             task classify  {input: str | [str]} -> {data: [{label, label_id, score}]}
    POST /score                task score     {pairs: [[text, text_pair], ...]} or {query, documents}
    POST /v1/completions       task generate  OpenAI's shape, stream: true for server-sent events
    POST /v1/chat/completions  task generate  OpenAI's shape, stream: true for server-sent events
    GET  /health, /metrics     status, and Prometheus text (requests, rows, tokens, batches, waits, latency)

Encoder rows go through the Batcher (batcher.py); generation requests join the continuous-batching
engine's running batch at its next step. Results are the same as `batchinfer run` gives for the same
rows: the same runner, tokenizer and model.

Memory is spent only on what may run: a body past serve.max_body_bytes is answered 413 unread, a
request is held against the queue's bound before it is tokenized, texts are cut at a character bound
before tokenizing (runners.base.encode_capped), and memory freed after an answer goes back to the
system once it has piled up (heap.HeapGuard).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import queue
import time
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, StrictBool

from .batcher import Batcher, BatchStats, Overloaded
from .config import JobConfig
from .constrain import Constraint, response_format
from .errors import shorten
from .heap import HeapGuard
from .messages import is_blank, message_problem
from .openai_api import chat_messages, unsupported
from .packing import supports_packing
from .runners import make_runner
from .tune import BACKEND_BUDGETS, DEFAULT_BUDGET

SERVED = ("embed", "classify", "score", "generate")
HEAP_MARGIN, IDLE_MARGIN = 64 << 20, 16 << 20  # freed bytes that may pile up before they go back to the system
DRAIN_BYTES, DRAIN_SECONDS = 1 << 30, 30  # what is read, unkept, of a body refused as too large
LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class BadInput(Exception):
    """A request body that is valid JSON but not a valid request; the message names what is wrong."""


class Unanswered(Exception):
    """A constrained completion that is not complete and valid: no answer (reason length or invalid_output)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "code": self.reason}}


class EngineDown(Exception):
    """The model's thread has stopped: nothing more can run until the server restarts."""


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "batchinfer_requests", "Requests by endpoint and status", ["endpoint", "status"], registry=self.registry
        )
        self.rows = Counter("batchinfer_rows", "Rows (texts, pairs, prompts) answered", registry=self.registry)
        self.tokens = Counter("batchinfer_tokens", "Input tokens run", registry=self.registry)
        self.batch_rows = Histogram(
            "batchinfer_batch_rows",
            "Rows per batch",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_requests = Histogram(
            "batchinfer_batch_requests",
            "Requests sharing a batch",
            registry=self.registry,
            buckets=(1, 2, 3, 4, 8, 16, 32, 64),
        )
        self.queue_wait = Histogram(
            "batchinfer_queue_wait_seconds", "Time a row waited for its batch", registry=self.registry, buckets=LATENCY
        )
        self.latency = Histogram(
            "batchinfer_request_seconds",
            "Time from request to response",
            ["endpoint"],
            registry=self.registry,
            buckets=LATENCY,
        )

    def batch(self, stats: BatchStats) -> None:
        self.batch_rows.observe(stats.rows)
        self.batch_requests.observe(stats.requests)
        self.tokens.inc(stats.tokens)
        for waited in stats.waited:
            self.queue_wait.observe(waited)


# --- request bodies ----------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # every field is judged by openai_api.FIELDS: done, or refused


class EmbeddingsBody(_Body):
    input: str | list[str]
    model: str | None = None
    encoding_format: str = "float"


class ClassifyBody(_Body):
    input: str | list[str]


class ScoreBody(_Body):
    pairs: list[tuple[str, str]] | None = None
    query: str | None = None
    documents: list[str] | None = None


class _GenerationBody(_Body):
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    model: str | None = None
    response_format: dict[str, Any] | None = None


class CompletionBody(_GenerationBody):
    prompt: str


class ChatBody(_GenerationBody):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None


# --- the services ------------------------------------------------------------------------------------------------


class EncoderService:
    """embed, classify and score: rows through the Batcher, results through the runner's own columns."""

    def __init__(self, job: JobConfig, model_path, metrics: Metrics):
        self.job, self.metrics = job, metrics
        self.runner = make_runner(job, model_path)
        self.runner.settle_default()  # no chunk to probe: the default backend, its precision checked
        batching = job.batching
        strategy = batching.strategy
        if strategy == "auto":  # packed where the model allows it: no padding computed, the same results
            strategy = "packed" if supports_packing(self.runner.model) is None else "padded"
        auto = BACKEND_BUDGETS.get(self.runner.backend, DEFAULT_BUDGET)
        max_tokens = batching.max_tokens if batching.max_tokens != "auto" else auto
        self.batcher = Batcher(
            self.runner,
            max_tokens,
            strategy,
            batching.max_rows,
            job.serve.max_wait_ms / 1000,
            job.serve.max_queue_tokens,
            metrics.batch,
        )

    async def run(self, texts: list, request: Request) -> tuple[dict, int]:
        """Each text's result columns (as Python lists) and the request's token count."""
        most = most_tokens(texts, self.runner.max_length)
        with self.batcher.reserved(most):  # a full queue refuses before the tokenizer runs
            tokens = await asyncio.to_thread(self.runner.tokenize, texts)
            pending = self.batcher.submit(tokens.ids, asyncio.get_running_loop(), reserved=most)
        results, failed = await _until_done(pending, request)
        if failed:
            position, (reason, message) = next(iter(sorted(failed.items())))
            raise RuntimeError(f"input[{position}]: {reason}: {message}")
        columns = self.runner.columns([[r] for r in results], np.arange(len(texts)), None)
        self.metrics.rows.inc(len(texts))
        cut = tokens.truncated.tolist()
        return {name: array.to_pylist() for name, array in columns.items()} | {"truncated": cut}, int(
            tokens.lengths.sum()
        )

    def problem(self) -> str | None:
        return None if self.batcher.alive else "the batching thread has stopped"

    def stop(self) -> None:
        self.batcher.stop()


class GenerateService:
    """generate: each request joins the continuous-batching engine's running batch at its next step."""

    def __init__(self, job: JobConfig, model_path, metrics: Metrics):
        self.job, self.metrics = job, metrics
        self.runner = make_runner(job, model_path)
        gen, runner, rows = job.generation, self.runner, job.batching.max_rows
        if gen.engine != "transformers":
            raise BadInput(f"serve runs generation.engine transformers (continuous batching), not {gen.engine}")
        constrained = importlib.util.find_spec("xgrammar") is not None  # masks take any request's response_format
        lengths = [job.model.max_length + gen.max_new_tokens] * rows
        cb_config = runner.engine_config(gen, lengths, rows, constrained)
        self.manager = runner.model.init_continuous_batching(
            generation_config=runner.generation_config(gen, gen.max_new_tokens), continuous_batching_config=cb_config
        )
        self.masks = runner.masks(self.manager) if constrained else None
        self.manager.start()

    def constraint(self, body) -> Constraint | None:
        """The request's response_format, else the server's job's; compiled, or a 400 saying why not."""
        constraint, problem = response_format(body.response_format, "response_format")
        if problem:
            raise BadInput(problem)
        constraint = constraint or self.runner.constraint
        if constraint is None:
            return None
        if self.masks is None:
            raise BadInput("response_format: constrained output needs xgrammar; pip install 'batchinfer[llm]'")
        if body.stop:
            raise BadInput("stop: a stop string could cut the response_format output; remove stop")
        from .grammar import Uncompilable

        try:
            self.runner.grammars.compile(constraint)
        except Uncompilable as exc:
            raise BadInput(str(exc)) from None
        return constraint

    def check(self, temperature: float | None, top_p: float | None, seed: int | None) -> None:
        """Decoding settings are the server's (one engine runs every request): a request may only repeat them.
        A seed changes nothing when decoding is greedy."""
        gen = self.job.generation
        seed = None if gen.temperature == 0 else seed
        for name, asked, served in (
            ("temperature", temperature, gen.temperature),
            ("top_p", top_p, gen.top_p),
            ("seed", seed, gen.seed),
        ):
            if asked is not None and abs(asked - served) > 1e-9:
                raise BadInput(
                    f"{name}: this server decodes with {name} {served}; start it with "
                    f"--set generation.{name}={asked}, or leave {name} out"
                )

    async def stream(self, ids: list[int], max_new: int, request: Request, constraint: Constraint | None = None):
        """Generation outputs for one prompt as the engine produces them; cancelled if the client leaves.
        `constraint`: the grammar the output follows, with its own state in the engine's masks."""
        outputs: asyncio.Queue = asyncio.Queue()
        request_id = f"req-{uuid.uuid4().hex}"
        self.manager.register_result_handler(request_id, outputs.put_nowait)
        if constraint is not None:
            self.masks.add(request_id, constraint)
        try:
            # add_request blocks (up to 10 s) while the engine's input queue is full: off the event loop
            added = await asyncio.to_thread(
                self.manager.add_request, ids, request_id=request_id, max_new_tokens=max_new, streaming=True
            )
            if added is None:
                raise EngineDown(self.problem() or "the engine takes no new requests")
            while True:
                try:
                    output = await asyncio.wait_for(outputs.get(), timeout=0.25)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        raise asyncio.CancelledError() from None
                    if self.problem():
                        raise EngineDown(self.problem()) from None
                    continue
                yield output
                if output.is_finished():
                    return
        except queue.Full:
            raise Overloaded("the generation engine's request queue is full") from None
        except BaseException:
            self.manager.cancel_request(request_id)
            raise
        finally:
            if self.masks is not None:
                self.masks.drop(request_id)

    def problem(self) -> str | None:
        if self.manager.is_running():
            return None
        fatal = self.manager.background_thread_status.fatal_error
        return f"the generation engine has stopped ({fatal})" if fatal else "the generation engine has stopped"

    def stop(self) -> None:
        self.manager.stop(block=True, timeout=60)  # flush: what is running finishes


def most_tokens(texts: list, max_length: int) -> int:
    """An upper estimate of the tokens `texts` (or pairs of texts) become: a token per character and the
    special tokens, at most max_length each."""
    return sum(
        min(max_length, (sum(map(len, text)) + 3) if isinstance(text, tuple) else len(text) + 2) for text in texts
    )


class BodyGuard:
    """ASGI middleware around the app: a request body of at most `limit` bytes, answered 413 past it before
    it is read whole or parsed (by its Content-Length, else by counting the bytes of a chunked body as they
    come); after each answer, memory the request freed is handed back to the system once it piles up:
    while requests run, past HEAP_MARGIN; when none runs, past IDLE_MARGIN over the last quiet moment, so
    that memory comes back to its baseline after a burst."""

    def __init__(self, app, limit: int, refused):
        self.app, self.limit, self.refused = app, limit, refused
        self.busy, self.idle = HeapGuard(HEAP_MARGIN), HeapGuard(IDLE_MARGIN)
        self.running = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            # a client that waits for "100 Continue" sends nothing more; any other is read to the end, unkept
            drain = headers.get(b"expect", b"").lower() != b"100-continue"
            return await self._refuse(scope, receive, send, drain)
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                return await self._refuse(scope, receive, send, more)
        body = [{"type": "http.request", "body": b"".join(parts), "more_body": False}]
        del parts

        async def replay():  # the body once, then what the client sends next (a disconnect)
            return body.pop() if body else await receive()

        self.running += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.running -= 1
            await asyncio.to_thread((self.busy if self.running else self.idle).check)

    async def _refuse(self, scope, receive, send, drain: bool):
        """413, after reading what the client still sends without keeping it (up to DRAIN_BYTES or
        DRAIN_SECONDS), so that it reads the answer instead of a connection reset mid-upload."""
        deadline, drained = time.monotonic() + DRAIN_SECONDS, 0
        while drain and drained < DRAIN_BYTES and time.monotonic() < deadline:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            drain = message.get("more_body", False)
        message = f"the body is larger than serve.max_body_bytes ({self.limit:,} bytes); send less per request"
        await self.refused(scope["path"], message)(scope, receive, send)


async def _until_done(pending, request: Request):
    """Wait for a queued request; if the client goes away, its rows are dropped before they run."""
    while True:
        done, _ = await asyncio.wait({pending.future}, timeout=0.25)
        if done:
            return pending.future.result()
        if await request.is_disconnected():
            pending.cancelled = True
            raise asyncio.CancelledError()


# --- the app -----------------------------------------------------------------------------------------------------


def create_app(job: JobConfig, model_path) -> FastAPI:
    """The app, with its model loaded: a model that cannot load fails here, before the server listens."""
    if job.model.task not in SERVED:
        raise BadInput(f"serve runs tasks {', '.join(SERVED)}; {job.model.task} runs offline with batchinfer run")
    metrics = Metrics()
    service = (GenerateService if job.model.task == "generate" else EncoderService)(job, model_path, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(service.stop)  # what is queued is answered before the server exits

    app = FastAPI(title="batchinfer", lifespan=lifespan)
    app.state.service = service
    name = job.model.path

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _error(request, 400, describe(exc.errors()))

    @app.exception_handler(BadInput)
    async def _bad(request: Request, exc: BadInput):
        return _error(request, 400, str(exc))

    @app.exception_handler(Overloaded)
    async def _busy(request: Request, exc: Overloaded):
        return _error(request, 429, f"the server is busy: {exc}; retry shortly", {"Retry-After": "1"})

    @app.exception_handler(EngineDown)
    async def _down(request: Request, exc: EngineDown):
        return _error(request, 503, f"{exc}; restart the server (batchinfer serve --debug shows why)")

    @app.exception_handler(Unanswered)
    async def _unanswered(request: Request, exc: Unanswered):
        metrics.requests.labels(request.url.path, "422").inc()
        return JSONResponse(exc.body(), status_code=422)

    @app.exception_handler(RuntimeError)
    async def _failed(request: Request, exc: RuntimeError):
        return _error(request, 500, str(exc))

    def _error(request: Request, status: int, message: str, headers: dict | None = None) -> JSONResponse:
        return _answer(request.url.path, status, message, headers)

    def _answer(path: str, status: int, message: str, headers: dict | None = None) -> JSONResponse:
        metrics.requests.labels(path, str(status)).inc()
        kind = {400: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
        body = {"error": {"message": message, "type": kind.get(status, "server_error")}}
        return JSONResponse(body, status_code=status, headers=headers)

    app.add_middleware(
        BodyGuard,
        limit=job.serve.max_body_bytes,
        refused=lambda path, message: _answer(path, 413, message, {"Connection": "close"}),
    )

    def _served(task: str, body: BaseModel, request: Request) -> None:
        if job.model.task != task:
            raise BadInput(f"this server runs task {job.model.task}; {task} needs a server started with --task {task}")
        _unicode(body.model_dump(), "")
        if problem := unsupported(request.url.path, body.model_dump(exclude_unset=True), "serve"):
            raise BadInput(problem[1])

    def _done(request: Request, started: float) -> None:
        metrics.requests.labels(request.url.path, "200").inc()
        metrics.latency.labels(request.url.path).observe(time.perf_counter() - started)

    @app.get("/health")
    async def health():
        problem = service.problem()
        body = {"status": "failed" if problem else "ok", "task": job.model.task, "model": name}
        return JSONResponse(body | ({"error": problem} if problem else {}), status_code=503 if problem else 200)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingsBody, request: Request):
        started = time.perf_counter()
        _served("embed", body, request)
        if body.encoding_format not in ("float", "base64"):
            raise BadInput(f"encoding_format: {body.encoding_format!r} is not float or base64")
        texts = _texts(body.input, "input")
        columns, tokens = await service.run(texts, request)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(vector, body.encoding_format)}
            for i, vector in enumerate(columns["embedding"])
        ]
        _done(request, started)
        return {
            "object": "list",
            "data": data,
            "model": body.model or name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.post("/classify")
    async def classify(body: ClassifyBody, request: Request):
        started = time.perf_counter()
        _served("classify", body, request)
        texts = _texts(body.input, "input")
        columns, tokens = await service.run(texts, request)
        data = [dict(zip(columns, values)) for values in zip(*columns.values())]
        _done(request, started)
        return {
            "data": [{"index": i, **row} for i, row in enumerate(data)],
            "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.post("/score")
    async def score(body: ScoreBody, request: Request):
        started = time.perf_counter()
        _served("score", body, request)
        if body.pairs is not None and (body.query is not None or body.documents is not None):
            raise BadInput("give pairs, or query and documents, not both")
        if body.pairs is not None:
            pairs = [tuple(p) for p in body.pairs]
            where = "pairs"
        elif body.query is not None and body.documents is not None:
            pairs = [(body.query, doc) for doc in body.documents]
            where = "documents"
        else:
            raise BadInput("give pairs: [[text, text_pair], ...], or query and documents")
        for i, pair in enumerate(pairs):
            if any(is_blank(side) for side in pair):
                raise BadInput(f"{where}[{i}]: both texts must hold something to read")
        if not pairs:
            raise BadInput(f"{where}: empty")
        columns, tokens = await service.run(pairs, request)
        data = [
            {"index": i, "score": s, "truncated": t}
            for i, (s, t) in enumerate(zip(columns["score"], columns["truncated"]))
        ]
        _done(request, started)
        return {"data": data, "model": name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        _served("generate", body, request)
        if is_blank(body.prompt):
            raise BadInput("prompt: empty, or only whitespace")
        return await _generate(request, body, body.prompt, "text_completion", body.max_tokens)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request):
        _served("generate", body, request)
        messages, problem = chat_messages(body.messages, "messages")
        if problem := problem or message_problem(messages, "messages"):
            raise BadInput(problem[1])
        return await _generate(
            request, body, messages, "chat.completion", body.max_completion_tokens or body.max_tokens
        )

    async def _generate(request: Request, body, prompt, kind: str, max_tokens: int | None):
        started = time.perf_counter()
        service.check(body.temperature, body.top_p, body.seed)
        if service.problem():  # before a stream's status line goes out
            raise EngineDown(service.problem())
        if max_tokens is not None and max_tokens < 1:
            raise BadInput("max_tokens: must be at least 1")
        usage = _stream_usage(body)
        max_new = max_tokens or job.generation.max_new_tokens
        constraint = service.constraint(body)
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or job.generation.stop)
        tokens = await asyncio.to_thread(service.runner.tokenize, [prompt])
        ids = tokens.ids[0]
        if service.runner.context:  # as offline: never past the positions the model knows
            max_new = max(1, min(max_new, service.runner.context - len(ids)))
        created, request_id = (
            int(time.time()),
            f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
        )
        if body.stream:
            events = _stream(
                service, request, ids, max_new, stops, kind, request_id, created, started, usage, constraint
            )
            return StreamingResponse(events, media_type="text/event-stream")
        last = None
        async for output in service.stream(ids, max_new, request, constraint):
            last = output
        if last.error:
            raise RuntimeError(f"generation failed: {last.error}")
        generated, text, reason = service.runner.finish(last.generated_tokens, max_new, stops)
        if constraint is not None and (
            problem := service.runner.incomplete(constraint, generated, text, reason, max_new)
        ):
            raise Unanswered(*problem)
        completion = len(generated)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            if kind == "chat.completion"
            else {"index": 0, "text": text, "finish_reason": reason}
        )
        _done(request, started)
        metrics.rows.inc()
        return {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": name,
            "choices": [choice],
            "usage": _usage(len(ids), completion),
        }

    async def _stream(service, request, ids, max_new, stops, kind, request_id, created, started, usage, constraint):
        sent, completion = "", 0
        chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"
        try:
            async for output in service.stream(ids, max_new, request, constraint):
                if output.error:
                    raise EngineDown(f"generation failed: {output.error}")
                generated, text, reason = service.runner.finish(output.generated_tokens, max_new, stops)
                completion = len(generated)
                if output.is_finished() and constraint is not None:
                    if problem := service.runner.incomplete(constraint, generated, text, reason, max_new):
                        raise Unanswered(*problem)
                # a stop string ends the completion before the engine does (it knows no stop strings)
                finished = output.is_finished() or len(generated) < len(output.generated_tokens)
                delta, sent = text[len(sent) :], text
                if delta or finished:
                    piece = {"delta": {"content": delta}} if kind == "chat.completion" else {"text": delta}
                    choice = {"index": 0, **piece, "finish_reason": reason if finished else None}
                    yield _event(request_id, chunk_kind, created, [choice], {"usage": None} if usage else {})
                if finished:
                    break
        except EngineDown as exc:  # the status line has gone out: the error is the last event
            metrics.requests.labels(request.url.path, "500").inc()
            yield f"data: {json.dumps({'error': {'message': str(exc), 'type': 'server_error'}})}\n\n"
            return
        except Unanswered as exc:  # the text sent so far is no answer: say so, as the last event
            metrics.requests.labels(request.url.path, "422").inc()
            yield f"data: {json.dumps(exc.body())}\n\n"
            return
        if usage:  # stream_options.include_usage: a last chunk with no choices and the request's usage
            yield _event(request_id, chunk_kind, created, [], {"usage": _usage(len(ids), completion)})
        yield "data: [DONE]\n\n"
        _done(request, started)
        metrics.rows.inc()

    def _event(request_id: str, kind: str, created: int, choices: list, extra: dict) -> str:
        event = {"id": request_id, "object": kind, "created": created, "model": name, "choices": choices}
        return f"data: {json.dumps(event | extra)}\n\n"

    return app


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stream_usage(body) -> bool:
    """Whether a streamed answer ends with a usage chunk (stream_options.include_usage, as OpenAI's)."""
    options = body.stream_options
    if options is None:
        return False
    if not body.stream:
        raise BadInput("stream_options: only with stream: true")
    for key, value in options.items():
        if key == "include_usage" and not isinstance(value, bool):
            raise BadInput(f"stream_options.include_usage must be true or false, not {shorten(value, 40)}")
        if key not in ("include_usage", "include_obfuscation"):  # obfuscation pads events: nothing to pad here
            raise BadInput(f"unsupported: stream_options.{key} (not a field of stream_options); leave it out")
    return bool(options.get("include_usage"))


def describe(errors: list[dict]) -> str:
    """Validation errors as `field[index]: what is wrong (got ...)`, without pydantic's union branch names."""
    if any(e["type"] == "json_invalid" for e in errors):
        return "the body is not valid JSON"
    lists = {e["loc"][1] for e in errors if len(e["loc"]) > 2 and str(e["loc"][2]).startswith("list[")}
    problems = []
    for e in errors:
        loc = [p for p in e["loc"] if p != "body"]
        if not loc:  # the body itself: null, a list, text
            problems.append(f"the body must be a JSON object (got {shorten(e.get('input'), 60)})")
            continue
        branch = len(loc) > 1 and isinstance(loc[1], str) and (loc[1] in ("str", "int") or "[" in loc[1])
        if branch and loc[1] == "str" and loc[0] in lists:
            continue  # the list branch says more
        parts = [loc[0]] + loc[2 if branch else 1 :]
        where = str(parts[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts[1:])
        got = "" if e["type"] == "missing" else f" (got {shorten(e.get('input'), 60)})"
        problems.append(f"{where}: {e['msg'].lower()}{got}")
    return "; ".join(problems[:5])


def _unicode(value: Any, where: str) -> None:
    """JSON may carry a lone UTF-16 surrogate ("\ud800"), which no tokenizer reads: name where it is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadInput(f"{where}: not valid Unicode ({exc.reason} at character {exc.start})") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _unicode(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _unicode(item, f"{where}[{i}]")


def _texts(value: str | list[str], where: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise BadInput(f"{where}: empty; give a string or a list of strings")
    for i, text in enumerate(texts):
        if is_blank(text):
            raise BadInput(f"{where}[{i}]: empty, or only whitespace, invisible or control characters")
    return texts


def _encode(vector: list[float], encoding: str):
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()
    return vector
