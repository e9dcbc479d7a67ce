"""/v1/completions and /v1/chat/completions answers from the generate service: whole, or as server-sent
events (stream: true), in OpenAI's shapes (openai_compat/shapes.py)."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from ..openai_compat.shapes import choice, completion, usage
from .batcher import Ticket
from .bodies import Asked
from .failures import GONE, Disconnected, EngineDown, Unanswered, error_body, gone
from .metrics import Metrics


class Completions:
    """Answers from `service`, the server's GenerateService, in the name of `model`."""

    def __init__(self, service, metrics: Metrics, model: str):
        self.service, self.metrics, self.model = service, metrics, model

    async def answer(self, asked: list[Asked], request: Request, ticket: Ticket):
        """One answer to a request's prompts, a choice for each in order: whole, or streamed. The request's
        `ticket` on the queue is released when the answer is out, or the stream ends however it ends."""
        if asked[0].stream:  # the background task runs even when the client leaves before the first event
            events = self.events(asked, request, ticket)
            return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(ticket.release))
        first = asked[0]
        running = [asyncio.ensure_future(self.whole(one, request)) for one in asked]
        try:
            finished = await asyncio.gather(*running)
        except BaseException:  # one prompt failed: the others' engine requests are cancelled, not left to run
            for task in running:
                task.cancel()
            raise
        finally:
            ticket.release()
        self.metrics.answered(request.scope, first.started)
        choices = [choice(first.chat, text, reason, index=i) for i, (_, text, reason) in enumerate(finished)]
        body = completion(first.chat, first.key, first.created, self.model, choices)
        generated = sum(len(tokens) for tokens, _, _ in finished)
        return body | {"usage": usage(sum(len(one.ids) for one in asked), generated)}

    async def whole(self, asked: Asked, request: Request) -> tuple[list[int], str, str]:
        """One prompt's completion: (its tokens, its text, finish_reason)."""
        last = None
        async for output in self.service.stream(asked, request):
            last = output
        if last.error:
            raise RuntimeError(f"generation failed: {last.error}")
        generated, text, reason = self.service.finished(asked, last)
        await self._check(asked, generated, text, reason)
        self.metrics.rows.inc()
        self.metrics.tokens.inc(len(asked.ids))
        return generated, text, reason

    async def events(self, asked: list[Asked], request: Request, ticket: Ticket):
        """The completions' texts as they grow, one event per new piece of one prompt's (choices[0].index says
        which, as OpenAI streams a list of prompts), the prompts' pieces interleaved as the engine makes them;
        an error ends the stream as its last event (the status line has gone out)."""
        first, pieces = asked[0], asyncio.Queue()
        generated = [0] * len(asked)

        async def follow(index: int, one: Asked) -> None:
            try:
                async for piece, tokens in self._pieces(one, request, index):
                    generated[index] = tokens
                    await pieces.put(piece)
            except Exception as exc:  # the stream ends with it
                await pieces.put(exc)
            else:
                await pieces.put(None)

        running = [asyncio.ensure_future(follow(i, one)) for i, one in enumerate(asked)]
        try:
            for _ in range(len(running)):
                while (piece := await pieces.get()) is not None:
                    if isinstance(piece, Exception):
                        raise piece
                    yield self._event(first, [piece], {"usage": None} if first.include_usage else {})
        except EngineDown as exc:
            self.metrics.refused(request.scope, 500)
            yield _data(error_body(500, str(exc)))
            return
        except Unanswered as exc:  # the text sent so far is no answer: say so, as the last event
            self.metrics.refused(request.scope, 422)
            yield _data(exc.body())
            return
        except Disconnected:
            self.metrics.refused(request.scope, GONE)
            gone(request.url.path)
            return
        except (asyncio.CancelledError, GeneratorExit):  # the server closes the stream of a client that left
            self.metrics.refused(request.scope, GONE)
            gone(request.url.path)
            raise
        finally:  # a prompt still running when the stream ends (an error, the client gone) is cancelled
            for task in running:
                task.cancel()
            ticket.release()
        if first.include_usage:  # a last chunk with no choices and the request's usage
            yield self._event(first, [], {"usage": usage(sum(len(one.ids) for one in asked), sum(generated))})
        yield "data: [DONE]\n\n"
        self.metrics.answered(request.scope, first.started)
        self.metrics.rows.inc(len(asked))
        self.metrics.tokens.inc(sum(len(one.ids) for one in asked))

    async def _pieces(self, asked: Asked, request: Request, index: int):
        """One prompt's streamed choices (choice `index`) as its text grows: (the piece, the tokens generated).
        Only settled text is sent, so that the pieces join to the text the whole answer has."""
        sent, sent_any = "", False
        async for output in self.service.stream(asked, request):
            if output.error:
                raise EngineDown(f"generation failed: {output.error}")
            generated, text, reason = self.service.finished(asked, output)
            if output.is_finished():
                await self._check(asked, generated, text, reason)
            # a stop string ends the completion before the engine does (it knows no stop strings)
            finished = output.is_finished() or reason == "stop"
            if not finished:
                text = settled(text, asked.stops)
            delta, sent = text[len(sent) :], text
            if delta or finished:
                piece = choice(asked.chat, delta, reason if finished else None, True, first=not sent_any, index=index)
                sent_any = True
                yield piece, len(generated)
            if finished:
                break

    async def _check(self, asked: Asked, generated: list[int], text: str, reason: str) -> None:
        """A constrained completion is an answer only when it is whole and valid (checked off the event loop:
        an output its grammar refuses is checked again under one that xgrammar may still have to compile)."""
        if asked.constraint is not None:
            if problem := await asyncio.to_thread(self.service.incomplete, asked, generated, text, reason):
                raise Unanswered(*problem)

    def _event(self, asked: Asked, choices: list, extra: dict) -> str:
        return _data(completion(asked.chat, asked.key, asked.created, self.model, choices, chunk=True) | extra)


def settled(text: str, stops: list[str]) -> str:
    """The part of a completion's text so far that later tokens cannot change: without a last character the
    tokenizer could not make whole yet (U+FFFD: more of its bytes are to come), and without a tail that may
    begin a stop string (runners' finish cuts the text at a stop string once a later token completes it; a
    tail it rules out is sent with the next piece)."""
    text = text.rstrip("\ufffd")
    longest = max(map(len, stops), default=0)
    for start in range(max(0, len(text) - longest + 1), len(text)):
        if any(stop.startswith(text[start:]) for stop in stops):
            return text[:start]
    return text


def _data(event: dict) -> str:
    return f"data: {json.dumps(event)}\n\n"
