"""/v1/completions and /v1/chat/completions answers from the generate service: whole, or as server-sent
events (stream: true), in OpenAI's shapes (openai_shapes.py)."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..openai_shapes import choice, completion, usage
from .bodies import Asked
from .failures import GONE, Disconnected, EngineDown, Unanswered, gone
from .metrics import Metrics


class Completions:
    """Answers from `service`, the server's GenerateService, in the name of `model`."""

    def __init__(self, service, metrics: Metrics, model: str):
        self.service, self.metrics, self.model = service, metrics, model

    async def answer(self, asked: Asked, request: Request):
        if asked.stream:
            return StreamingResponse(self.events(asked, request), media_type="text/event-stream")
        return await self.whole(asked, request)

    async def whole(self, asked: Asked, request: Request) -> dict:
        last = None
        async for output in self.service.stream(asked, request):
            last = output
        if last.error:
            raise RuntimeError(f"generation failed: {last.error}")
        generated, text, reason = self.service.finished(asked, last)
        await self._check(asked, generated, text, reason)
        self.metrics.answered(request.url.path, asked.started)
        self.metrics.rows.inc()
        body = completion(asked.chat, asked.key, asked.created, self.model, [choice(asked.chat, text, reason)])
        return body | {"usage": usage(len(asked.ids), len(generated))}

    async def events(self, asked: Asked, request: Request):
        """The completion's text as it grows, one event per new piece; an error ends the stream as its last
        event (the status line has gone out)."""
        sent, generated_tokens = "", 0
        try:
            async for output in self.service.stream(asked, request):
                if output.error:
                    raise EngineDown(f"generation failed: {output.error}")
                generated, text, reason = self.service.finished(asked, output)
                generated_tokens = len(generated)
                if output.is_finished():
                    await self._check(asked, generated, text, reason)
                # a stop string ends the completion before the engine does (it knows no stop strings)
                finished = output.is_finished() or len(generated) < len(output.generated_tokens)
                delta, sent = text[len(sent) :], text
                if delta or finished:
                    piece = choice(asked.chat, delta, reason if finished else None, delta=True)
                    yield self._event(asked, [piece], {"usage": None} if asked.include_usage else {})
                if finished:
                    break
        except EngineDown as exc:
            self.metrics.refused(request.url.path, 500)
            yield _data({"error": {"message": str(exc), "type": "server_error"}})
            return
        except Unanswered as exc:  # the text sent so far is no answer: say so, as the last event
            self.metrics.refused(request.url.path, 422)
            yield _data(exc.body())
            return
        except Disconnected:
            self.metrics.refused(request.url.path, GONE)
            gone(request.url.path)
            return
        if asked.include_usage:  # a last chunk with no choices and the request's usage
            yield self._event(asked, [], {"usage": usage(len(asked.ids), generated_tokens)})
        yield "data: [DONE]\n\n"
        self.metrics.answered(request.url.path, asked.started)
        self.metrics.rows.inc()

    async def _check(self, asked: Asked, generated: list[int], text: str, reason: str) -> None:
        """A constrained completion is an answer only when it is whole and valid (checked off the event loop:
        an output its grammar refuses is checked again under one that xgrammar may still have to compile)."""
        if asked.constraint is not None:
            incomplete = self.service.runner.incomplete
            if problem := await asyncio.to_thread(incomplete, asked.constraint, generated, text, reason, asked.max_new):
                raise Unanswered(*problem)

    def _event(self, asked: Asked, choices: list, extra: dict) -> str:
        return _data(completion(asked.chat, asked.key, asked.created, self.model, choices, chunk=True) | extra)


def _data(event: dict) -> str:
    return f"data: {json.dumps(event)}\n\n"
