"""What a request can fail with, and how each failure is answered: a status and OpenAI's error body
{error: {message, type}}, counted by endpoint and status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..openai_requests import describe
from .batcher import Overloaded
from .bodies import BadInput
from .metrics import Metrics

KINDS = {400: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}  # else server_error


class Unanswered(Exception):
    """A constrained completion that is not complete and valid: no answer (reason length or invalid_output)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error", "code": self.reason}}


class EngineDown(Exception):
    """The model's thread has stopped: nothing more can run until the server restarts."""


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": KINDS.get(status, "server_error")}}


class Failures:
    """The app's exception handlers, each failure answered with its status and counted."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def answer(self, path: str, status: int, message: str, headers: dict | None = None) -> JSONResponse:
        self.metrics.refused(path, status)
        return JSONResponse(error_body(status, message), status_code=status, headers=headers)

    def install(self, app: FastAPI) -> None:
        handlers = {
            RequestValidationError: lambda exc: (400, describe(exc.errors()), None),
            BadInput: lambda exc: (400, str(exc), None),
            Overloaded: lambda exc: (429, f"the server is busy: {exc}; retry shortly", {"Retry-After": "1"}),
            EngineDown: lambda exc: (503, f"{exc}; restart the server (batchinfer serve --debug shows why)", None),
            RuntimeError: lambda exc: (500, str(exc), None),
        }
        for kind, read in handlers.items():
            app.add_exception_handler(kind, self._handler(read))
        app.add_exception_handler(Unanswered, self._unanswered)

    def _handler(self, read):
        async def handle(request: Request, exc: Exception) -> JSONResponse:
            return self.answer(request.url.path, *read(exc))

        return handle

    async def _unanswered(self, request: Request, exc: Unanswered) -> JSONResponse:
        self.metrics.refused(request.url.path, 422)
        return JSONResponse(exc.body(), status_code=422)
