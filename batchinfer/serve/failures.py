"""What a request can fail with, and how each failure is answered: a status and OpenAI's error body
{error: {message, type, param, code}}, counted by endpoint and status."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..openai_compat.requests import describe
from .batcher import Overloaded, Shed, TooLarge
from .bodies import BadInput
from .metrics import Metrics

KINDS = {s: "invalid_request_error" for s in (400, 404, 405, 408, 413)} | {429: "rate_limit_error"}  # else server_error
GONE = 499  # the client closed the connection before its answer (nginx's code); counted, never sent
log = logging.getLogger("batchinfer.serve")
# A message names the bad value's field first, `temperature: must be ...` or `unsupported: logprobs (...)`.
FIELD_FIRST = re.compile(r"(?:unsupported: )?(?P<param>[a-z_]+(?:\[\d+\]|\.[a-z_]+)*)(?::| \()")


class Unanswered(Exception):
    """A constrained completion that is not complete and valid: no answer (reason length or invalid_output)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "param": None, "code": self.reason}}


class NoModel(Exception):
    """A model id this server does not serve (GET /v1/models/{id}, or a request's model)."""

    def __init__(self, model: str, served: str):
        super().__init__(f"the model {model!r} does not exist here; this server serves {served!r} (GET /v1/models)")

    def body(self) -> dict:
        """OpenAI's answer to a model it does not have."""
        return {
            "error": {
                "message": str(self),
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        }


class EngineDown(Exception):
    """The model's thread has stopped: nothing more can run until the server restarts."""


class Disconnected(Exception):
    """The client went away before its answer; what it had queued was dropped."""


def error_body(status: int, message: str) -> dict:
    """OpenAI's error object; param: the field of the bad value, as the message names it first, else null."""
    named = FIELD_FIRST.match(message) if status == 400 else None
    param = named["param"] if named else None
    return {"error": {"message": message, "type": KINDS.get(status, "server_error"), "param": param, "code": None}}


def gone(path: str) -> str:
    """One line in the log for a client that went away (no traceback: nothing failed)."""
    message = "the client went away before its answer; its queued work was dropped"
    log.warning("%s: %s", path, message)
    return message


class Failures:
    """The app's exception handlers, each failure answered with its status and counted."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def answer(self, scope: dict, status: int, message: str, headers: dict | None = None) -> JSONResponse:
        """An error body with `status`, counted for the request of `scope` (its ASGI scope)."""
        self.metrics.refused(scope, status)
        return JSONResponse(error_body(status, message), status_code=status, headers=headers)

    def install(self, app: FastAPI) -> None:
        handlers = {
            RequestValidationError: lambda exc: (400, describe(exc.errors()), None),
            BadInput: lambda exc: (400, str(exc), None),
            Overloaded: lambda exc: (429, f"the server is busy: {exc}; retry shortly", {"Retry-After": "1"}),
            TooLarge: lambda exc: (413, str(exc), None),
            EngineDown: lambda exc: (503, f"{exc}; restart the server (batchinfer serve --debug shows why)", None),
            RuntimeError: lambda exc: (500, str(exc), None),
            # a bug: still OpenAI's error body (a client reads JSON), and the log keeps its traceback
            Exception: lambda exc: (500, f"internal error: {type(exc).__name__}: {exc}", None),
        }
        for kind, read in handlers.items():
            app.add_exception_handler(kind, self._handler(read))
        for kind, status in ((Unanswered, 422), (NoModel, 404)):
            app.add_exception_handler(kind, self._coded(status))
        app.add_exception_handler(Shed, self._shed)
        app.add_exception_handler(HTTPException, self._http)
        app.add_exception_handler(Disconnected, self._gone)

    def _handler(self, read):
        async def handle(request: Request, exc: Exception) -> JSONResponse:
            return self.answer(request.scope, *read(exc))

        return handle

    async def _http(self, request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's and FastAPI's own refusals (no such route, a body that is not UTF-8 JSON or nests too
        deep to read), in this server's error body."""
        cause, path = exc.__cause__, request.url.path
        if isinstance(cause, UnicodeDecodeError):
            message = f"the body is not valid UTF-8 ({cause.reason} at byte {cause.start})"
        elif isinstance(cause, RecursionError):
            message = "the body nests too deep to read; send JSON nested less deep"
        elif exc.status_code == 404:
            message = f"no endpoint {path}; GET /health says which task this server runs"
        elif exc.status_code == 405:
            message = f"{path} does not take {request.method}"
        else:
            message = str(exc.detail)
        return self.answer(request.scope, exc.status_code, message, exc.headers)

    async def _shed(self, request: Request, exc: Shed) -> JSONResponse:
        """A request refused to hold serve.p99_ms: counted apart from a full queue, told when it would fit."""
        self.metrics.shed.inc()
        message = f"the server is busy: {exc}; retry in {exc.retry_after} s"
        return self.answer(request.scope, 429, message, {"Retry-After": str(exc.retry_after)})

    async def _gone(self, request: Request, exc: Disconnected) -> JSONResponse:
        return self.answer(request.scope, GONE, gone(request.url.path))

    def _coded(self, status: int):
        """A failure whose error body carries its own code (exc.body()), answered with `status`."""

        async def handle(request: Request, exc: Unanswered | NoModel) -> JSONResponse:
            self.metrics.refused(request.scope, status)
            return JSONResponse(exc.body(), status_code=status)

        return handle
