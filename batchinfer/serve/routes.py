"""serve's app: its routes, each thin — check the body, call the service once, shape the answer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from ..backends.models import HUB
from ..job.config import JobConfig
from ..messages import message_problem
from ..openai_compat.fields import CHAT, CLASSIFY, COMPLETIONS, EMBEDDINGS, SCORE, chat_messages, unsupported
from ..openai_compat.requests import unicode_problem
from ..openai_compat.shapes import embedding_list, model_object, usage
from .bodies import BadInput, ChatBody, ClassifyBody, CompletionBody, EmbeddingsBody, ScoreBody
from .completions import Completions
from .failures import Failures, NoModel
from .guard import BodyGuard, arrived
from .metrics import Metrics
from .services import EncoderService, GenerateService

SERVED = ("embed", "classify", "score", "generate")


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
    failures = Failures(metrics)
    failures.install(app)

    def refused(scope: dict, status: int, message: str) -> JSONResponse:
        return failures.answer(scope, status, message, {"Connection": "close"})

    serve = job.serve
    app.add_middleware(BodyGuard, limit=serve.max_body_bytes, seconds=serve.read_timeout_s, refused=refused)
    routes = Routes(job, service, metrics)
    app.get("/health")(routes.health)
    app.get("/metrics")(routes.prometheus)
    app.get("/v1/models")(routes.models)
    app.get("/v1/models/{model:path}")(routes.model_of)  # a hub id has a slash
    for path, route in (
        (EMBEDDINGS, routes.embeddings),
        (CLASSIFY, routes.classify),
        (SCORE, routes.score),
        (COMPLETIONS, routes.completions),
        (CHAT, routes.chat),
    ):
        app.post(path)(route)
    return app


def served_name(job: JobConfig) -> str:
    """The model's id to clients: serve.model_name, else a local folder's name (a client names its model in a
    word, not by a path on the server's disk), else a hub model's id (hf:org/name is org/name, as the hub
    and vLLM name it), else model.path as written (pkg:module)."""
    if job.serve.model_name:
        return job.serve.model_name
    path = Path(job.model.path)
    return path.resolve().name if path.is_dir() else job.model.path.removeprefix(HUB)


class Routes:
    def __init__(self, job: JobConfig, service: EncoderService | GenerateService, metrics: Metrics):
        self.job, self.service, self.metrics, self.model = job, service, metrics, served_name(job)
        self.names = {self.model, job.model.path, *job.serve.model_aliases}  # the ids a request may send
        self.created = int(time.time())
        self.completer = Completions(service, metrics, self.model) if job.model.task == "generate" else None

    def accept(self, task: str, body: BaseModel, request: Request) -> float:
        """Refuse a body this server cannot answer as it asks; returns when the request arrived."""
        self.named(body.model)
        if self.job.model.task != task:
            served = self.job.model.task
            raise BadInput(f"this server runs task {served}; {task} needs a server started with --task {task}")
        if problem := unicode_problem(body.model_dump()):
            raise BadInput(problem)
        if problem := unsupported(request.url.path, body.model_dump(exclude_unset=True), "serve"):
            raise BadInput(problem[1])
        return arrived(request)

    async def health(self):
        problem = self.service.problem()
        body = {"status": "failed" if problem else "ok", "task": self.job.model.task, "model": self.model}
        return JSONResponse(body | ({"error": problem} if problem else {}), status_code=503 if problem else 200)

    async def models(self):
        """The one model this server runs, in OpenAI's list (clients such as openai's models.list() ask first)."""
        return {"object": "list", "data": [self.model_object()]}

    def named(self, model: str | None) -> None:
        """Refuse a request naming a model this server does not serve (one naming none is answered by its model):
        a client that means another model must not get this one's answer."""
        if model is not None and model not in self.names:
            raise NoModel(model, self.model)

    async def model_of(self, model: str):
        self.named(model)
        return self.model_object()

    def model_object(self) -> dict:
        """OpenAI's model object, and what answers its requests here: the backend or engine and its precision."""
        return model_object(self.model, self.created) | {"batchinfer": self.service.described}

    async def prometheus(self):
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def embeddings(self, body: EmbeddingsBody, request: Request):
        started = self.accept("embed", body, request)
        columns, tokens = await self.service.run(body.texts(), request, whole=True)
        vectors = [_encode(vector, body.encoding_format) for vector in columns["embedding"]]
        self.metrics.answered(request.scope, started)
        return answer(embedding_list(vectors, body.model or self.model, tokens))

    async def classify(self, body: ClassifyBody, request: Request):
        started = self.accept("classify", body, request)
        columns, tokens = await self.service.run(body.texts(), request)
        data = [{"index": i, **dict(zip(columns, values))} for i, values in enumerate(zip(*columns.values()))]
        self.metrics.answered(request.scope, started)
        return answer({"data": data, "model": self.model, "usage": usage(tokens)})

    async def score(self, body: ScoreBody, request: Request):
        started = self.accept("score", body, request)
        columns, tokens = await self.service.run(body.texts(), request)
        scored = zip(columns["score"], columns["truncated"])
        data = [{"index": i, "score": s, "truncated": t} for i, (s, t) in enumerate(scored)]
        self.metrics.answered(request.scope, started)
        return answer({"data": data, "model": self.model, "usage": usage(tokens)})

    async def completions(self, body: CompletionBody, request: Request):
        self.accept("generate", body, request)
        prompts = body.prompts()
        return await self._generate(body, prompts, prompts, False, body.max_tokens, request)

    async def chat(self, body: ChatBody, request: Request):
        self.accept("generate", body, request)
        messages, problem = chat_messages(body.messages, "messages")
        if problem := problem or message_problem(messages, "messages"):
            raise BadInput(problem[1])
        limit = body.max_completion_tokens or body.max_tokens
        return await self._generate(body, [messages], [json.dumps(body.messages)], True, limit, request)

    async def _generate(self, body, prompts: list, texts: list[str], chat: bool, limit: int | None, request: Request):
        """Prompts into the engine within serve.max_queue_tokens: held from before they are tokenized (413 or 429
        at once when they cannot fit) until the last answer is out."""
        ticket = self.service.admit(texts, limit)
        try:
            asked = [await self.service.ask(body, prompt, chat, limit, arrived(request)) for prompt in prompts]
            ticket.settle(sum(len(one.ids) + one.max_new for one in asked))
        except BaseException:
            ticket.release()
            raise
        return await self.completer.answer(asked, request, ticket)


def answer(body: dict) -> JSONResponse:
    """An encoder's answer, its JSON written as is: a dict of lists, numbers and text (to_pylist's), which FastAPI
    would first walk value by value to make JSON-ready (jsonable_encoder, a dozen calls per float) on the event
    loop, where no other request moves meanwhile: 39 ms for 64 MiniLM embeddings, 0.9 ms for one (json.dumps of
    them: 25 ms and 0.4 ms; 2-core AVX2 EPYC)."""
    return JSONResponse(body)


def _encode(vector: list[float], encoding: str):
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()
    return vector
