"""serve's guard around the app (ASGI middleware): bodies past serve.max_body_bytes answered 413 before
they are read whole, bodies that stop arriving for serve.read_timeout_s answered 408, every body read as
JSON whatever its Content-Type, and the memory requests freed handed back to the system (heap.HeapGuard);
each request's latency counted from when the app got it to when its answer was sent (arrived, once_sent)."""

from __future__ import annotations

import asyncio
import time

from ..heap import HeapGuard

HEAP_MARGIN, IDLE_MARGIN = 64 << 20, 16 << 20  # freed bytes that may pile up before they go back to the system
DRAIN_BYTES, DRAIN_SECONDS = 1 << 30, 30  # what is read, unkept, of a body refused as too large


class BodyGuard:
    """ASGI middleware around the app: a request body of at most `limit` bytes, answered 413 past it before
    it is read whole or parsed (by its Content-Length, else by counting the bytes of a chunked body as they
    come), each part of it within `seconds` of the last, answered 408 past them (a body that stops coming
    holds nothing, and a stopping server waits for it no longer); after each answer, memory the request
    freed is handed back to the system once it piles up:
    while requests run, past HEAP_MARGIN; when none runs, past IDLE_MARGIN over the last quiet moment, so
    that memory comes back to its baseline after a burst."""

    def __init__(self, app, limit: int, seconds: float, refused):
        self.app, self.limit, self.seconds, self.refused = app, limit, seconds, refused
        self.busy, self.idle = HeapGuard(HEAP_MARGIN), HeapGuard(IDLE_MARGIN)
        self.running = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        state["arrived"], state["sent"] = time.perf_counter(), []
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            # a client that waits for "100 Continue" sends nothing more; any other is read to the end, unkept
            drain = headers.get(b"expect", b"").lower() != b"100-continue"
            return await self._refuse(scope, receive, send, drain)
        parts, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except asyncio.TimeoutError:
                late = f"the body stopped coming: nothing more for serve.read_timeout_s ({self.seconds:g} s)"
                return await self.refused(scope, 408, late + "; send it without pauses")(scope, receive, send)
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
            await self.app(as_json(scope), replay, send)
            for callback in state["sent"]:
                callback(time.perf_counter() - state["arrived"])
        finally:
            self.running -= 1
            await asyncio.to_thread((self.busy if self.running else self.idle).check)

    async def _refuse(self, scope, receive, send, drain: bool):
        """413, after reading what the client still sends without keeping it (up to DRAIN_BYTES or
        DRAIN_SECONDS), so that it reads the answer instead of a connection reset mid-upload."""
        deadline, drained = time.monotonic() + DRAIN_SECONDS, 0
        while drain and drained < DRAIN_BYTES:
            try:
                message = await asyncio.wait_for(receive(), min(self.seconds, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            drain = message.get("more_body", False)
        message = f"the body is larger than serve.max_body_bytes ({self.limit:,} bytes); send less per request"
        await self.refused(scope, 413, message)(scope, receive, send)


def arrived(request) -> float:
    """When `request` came to the app (time.perf_counter), before its body was read: a latency counted from
    here holds the body's reading and the wait for a busy event loop, as its client sees them."""
    return request.scope["state"]["arrived"]


def once_sent(request, callback) -> None:
    """Call callback(seconds since the request arrived) once its answer is sent whole (a 200 with its body)."""
    request.scope["state"]["sent"].append(callback)


def as_json(scope: dict) -> dict:
    """The request with its body declared JSON: every route takes JSON alone, and a client that sends it
    under another Content-Type (curl -d sends application/x-www-form-urlencoded) means JSON; a body that is
    not JSON is then answered as such."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    return scope | {"headers": [*headers, (b"content-type", b"application/json")]}
