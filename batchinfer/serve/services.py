"""The runner-backed services behind serve's routes: encoder rows through the Batcher (embed, classify,
score), prompts into the generation engine's running batch (generate, through Engine.serve)."""

from __future__ import annotations

import asyncio
import queue
import secrets
import time
import uuid

import numpy as np
import pyarrow as pa
from fastapi import Request

from ..constrained.spec import Constraint, response_format
from ..execution.run_rows import load_rows
from ..job.config import GREEDY_BELOW, GenerationConfig, InputConfig, JobConfig
from ..openai_compat.requests import GenerationSettings
from ..runners import make_runner
from ..runners.engine import Serving
from ..runners.protocol import BatchRunner, Generating
from .batcher import Batcher, Overloaded, Ticket, TokenQueue, shed
from .bodies import Asked, BadInput, ChatBody, CompletionBody
from .failures import Disconnected, EngineDown
from .guard import arrived, once_sent
from .latency import FirstToken
from .metrics import Metrics

WARM_UP_ROWS = 4  # the rows of the second batch serve runs before it listens
LOOK_S = 0.25  # how often a waiting request looks whether its client or the engine has gone


class EncoderService:
    """embed, classify and score: rows through the Batcher, results through the runner's own columns."""

    def __init__(self, job: JobConfig, model_path, metrics: Metrics):
        self.job, self.metrics = job, metrics
        self.runner: BatchRunner = make_runner(job, model_path)
        self.runner.settle_default()  # no chunk to probe: the default backend, its precision checked
        batching = job.batching
        strategy = batching.strategy
        if strategy == "auto":  # packed where the model allows it: no padding computed, the same results
            strategy = "packed" if self.runner.packing_problem() is None else "padded"
        max_tokens = batching.max_tokens if batching.max_tokens != "auto" else self.runner.default_budget
        self.rows_job = request_rows_job(job)
        measured = self.warm_up(strategy)
        self.batcher = Batcher(
            self.runner,
            max_tokens,
            strategy,
            batching.max_rows,
            job.serve.max_wait_ms / 1000,
            job.serve.max_queue_tokens,
            metrics.batch,
            target=job.serve.p99_ms and job.serve.p99_ms / 1000,
        )
        self.described = {"task": job.model.task, "backend": self.runner.backend, "precision": self.runner.precision}
        metrics.serving(self.described)
        metrics.budgeted(self.batcher.window.tokens, self.batcher.window.rows)  # scraped before the first batch
        metrics.queued(lambda: self.batcher.queued_tokens)
        if job.serve.p99_ms:
            self.batcher.window.cost.add(*measured)  # the first requests' prediction (batches not sized by it)
            metrics.held_to(lambda: self.batcher.window.admission.allowed)

    def warm_up(self, strategy: str) -> tuple[int, float]:
        """Run the model on a row, then on a few, before the server listens: its first pass sets up kernels and
        memory (MiniLM on a CPU: 385 ms, against 10 ms after), which no request should wait for, and from
        which serve.p99_ms would learn that the server is slower than it is. Returns the second batch's tokens
        and seconds: without a batch measured, serve.p99_ms predicted every request at no cost and admitted
        a whole burst at start (40 requests of 30 texts: 8 s for a 2 s target, MiniLM)."""
        text = "A first request should not pay for what the model sets up on its first passes."
        rows = [(text, text) if self.rows_job.input.text_pair else text] * WARM_UP_ROWS
        ids = load_rows(self.rows_job, self.runner, request_rows(rows)).tokens.ids
        self.runner.lay_out(strategy)
        for size in (1, WARM_UP_ROWS):
            started = time.monotonic()
            self.runner.run(ids[:size])
        return sum(map(len, ids)), time.monotonic() - started

    async def run(self, texts: list, request: Request, whole: bool = False) -> tuple[dict, int]:
        """Each text's result columns (as Python lists) and the request's token count. `whole`: a text longer
        than model.max_length is a 400, for an answer that cannot say it was cut (OpenAI's shapes)."""
        most = most_tokens(texts, self.runner.max_length)
        # a full queue refuses before the tokenizer runs, and so does a request of more texts than the queue's
        # tokens (each text is a token at least)
        with self.batcher.reserved(most, least=len(texts), since=time.perf_counter() - arrived(request)):
            loaded = await asyncio.to_thread(load_rows, self.rows_job, self.runner, request_rows(texts))
            if loaded.prepared.errors:  # model.truncation: error
                position, (_, message) = min(loaded.prepared.errors.items())
                raise BadInput(f"input[{position}]: {message}")
            tokens = loaded.tokens
            if whole and tokens.truncated.any():
                raise BadInput(f"input[{int(np.argmax(tokens.truncated))}]: {uncut(self.runner.max_length)}")
            since = time.perf_counter() - arrived(request)
            pending = self.batcher.submit(tokens.ids, asyncio.get_running_loop(), reserved=most, since=since)
        results, failed = await until_done(pending, request, self.batcher.cancel)
        if failed:
            position, (reason, message) = next(iter(sorted(failed.items())))
            raise RuntimeError(f"input[{position}]: {reason}: {message}")
        columns = self.runner.columns([[r] for r in results], np.arange(len(texts)), loaded)
        if pa.types.is_list(columns.get("embedding", pa.array([])).type):  # a job for OpenAI Batch files: a
            columns["embedding"] = columns["embedding"].flatten()  # list of vectors per request; here one each
        self.metrics.rows.inc(len(texts))
        # the latency serve.p99_ms holds is what the client sees: from the request's arrival to its answer sent
        once_sent(request, lambda seconds: self.batcher.answered(pending, seconds))
        cut = tokens.truncated.tolist()
        return {name: array.to_pylist() for name, array in columns.items()} | {"truncated": cut}, int(
            tokens.lengths.sum()
        )

    def problem(self) -> str | None:
        return None if self.batcher.alive else "the batching thread has stopped"

    def stop(self) -> None:
        self.batcher.stop()


class GenerateService:
    """generate: each request joins the engine's running batch at its next step (Engine.serve: any engine that
    takes requests as they come)."""

    def __init__(self, job: JobConfig, model_path, metrics: Metrics):
        self.job, self.metrics = job, metrics
        self.runner: Generating = make_runner(job, model_path)
        gen = job.generation
        self.engine: Serving = self.runner.engine.serve(
            gen, job.batching.max_rows, job.model.max_length + gen.max_new_tokens
        )
        engine = self.runner.engine.described
        self.described = {"task": job.model.task, "engine": engine["name"], "precision": engine.get("precision")}
        metrics.serving(self.described)
        self.queue = TokenQueue(job.serve.max_queue_tokens)
        metrics.queued(lambda: self.queue.held)
        self.running = 0  # requests listened for in the engine (changed on the event loop only)
        metrics.running(lambda: self.running)
        self.target = FirstToken(job.serve.p99_ms / 1000) if job.serve.p99_ms else None
        if self.target:
            metrics.held_to(lambda: self.target.admission.allowed)

    def admit(self, texts: list, max_tokens: int | None) -> Ticket:
        """A request's hold on serve.max_queue_tokens, taken before its prompts (`texts`, or a chat's messages
        as JSON) are tokenized: for each, its characters (at most model.max_length) and the most it may
        generate; at least one prompt token and one new one each. Settled to the real count once tokenized.
        With serve.p99_ms, refused (Shed) when its first token is predicted past the target."""
        max_new = max_tokens or self.job.generation.max_new_tokens
        least = len(texts) * min(1 + max_new, self.runner.context or 1 + max_new)
        most = most_tokens(texts, self.runner.max_length) + len(texts) * max_new
        if self.target and not (decision := self.target.admit(self.queue.held, min(most, self.queue.limit))).admit:
            raise shed(decision, "get its first token")
        return self.queue.take(most, least)

    async def ask(
        self, body: CompletionBody | ChatBody, prompt, chat: bool, max_tokens: int | None, started: float
    ) -> Asked:
        """A completion request (its prompt: text, or chat messages; its settings range-checked already)
        checked against what this server runs, and tokenized; never past the positions the model knows,
        as offline. `started`: when the request arrived (guard.arrived)."""
        settings = self.settings(body)
        if self.problem():  # before a stream's status line goes out
            raise EngineDown(self.problem())
        if chat and (problem := self.runner.chat_problem("messages") or self.runner.chat_refused(prompt)):
            raise BadInput(problem)
        max_new = max_tokens or self.job.generation.max_new_tokens
        constraint = await self.constraint(body)
        stops = list(body.stop or self.job.generation.stop)
        tokens = await asyncio.to_thread(self.runner.tokenize, [prompt])
        if tokens.truncated.any():  # the engine would answer the prompt's last max_length tokens alone
            raise BadInput(f"{'messages' if chat else 'prompt'}: {uncut(self.runner.max_length)}")
        ids = tokens.ids[0]
        if self.runner.context:
            max_new = max(1, min(max_new, self.runner.context - len(ids)))
        return Asked(chat, ids, max_new, settings, stops, constraint, body.stream, body.include_usage, started)

    async def constraint(self, body) -> Constraint | None:
        """The request's response_format, else the server's job's; compiled (off the event loop, which goes on
        answering meanwhile), or a 400 saying why not."""
        constraint, problem = response_format(body.response_format, "response_format")
        if problem:
            raise BadInput(problem)
        constraint = constraint or self.runner.constraint
        if constraint is None:
            return None
        if not self.engine.constrained:
            raise BadInput("response_format: constrained output needs xgrammar; pip install 'batchinfer[llm]'")
        if body.stop:
            raise BadInput("stop: a stop string could cut the response_format output; remove stop")
        from ..constrained.grammar import Uncompilable

        try:
            await asyncio.to_thread(self.runner.grammars.compile, constraint)
        except Uncompilable as exc:
            raise BadInput(str(exc)) from None
        return constraint

    def settings(self, body: GenerationSettings) -> GenerationConfig:
        """The request's decoding: its temperature, top_p and seed over the job's generation section, checked as
        a batch file's row is. A request that samples without a seed draws from a fresh one, as OpenAI's do (the
        job's seed would give every such request the same text)."""
        asked = {"temperature": body.temperature, "top_p": body.top_p, "seed": body.seed}
        if self.engine.fixed:
            self.check(asked, self.engine.fixed)
            return self.job.generation
        if body.seed is None:
            asked["seed"] = secrets.randbits(63)
        settings, problem = self.runner.request_config({k: v for k, v in asked.items() if v is not None})
        if problem:
            raise BadInput(problem[1])
        return settings

    def check(self, asked: dict, why: str) -> None:
        """Where the engine decodes every request alike (`why`), a request may repeat the server's settings, and
        may send what changes nothing under them: on a greedy server, a greedy temperature (below GREEDY_BELOW,
        as the job file reads it) with any top_p and seed, as an OpenAI Batch file's greedy rows run together."""
        gen = self.job.generation
        if gen.temperature == 0 and (asked["temperature"] or 0.0) < GREEDY_BELOW:
            return
        for name, value in asked.items():
            served = getattr(gen, name)
            if value is not None and abs(value - served) > 1e-9:
                how = "greedily (temperature 0)" if name == "temperature" and served == 0 else f"with {name} {served}"
                raise BadInput(
                    f"{name}: this server decodes {how} for every request ({why}); start it with "
                    f"--set generation.{name}={value}, or leave {name} out"
                )

    async def stream(self, asked: Asked, request: Request):
        """Generation outputs for one request as the engine produces them; cancelled if the client leaves.
        Its constraint, if any, has its own state in the engine's masks."""
        outputs: asyncio.Queue = asyncio.Queue()
        request_id = f"req-{uuid.uuid4().hex}"
        self.engine.listen(request_id, asked.constraint, outputs.put_nowait)
        held, first = self.queue.held, True  # what the first token waits behind (FirstToken's measure)
        self.running += 1
        try:
            # add blocks (up to 10 s) while the engine's input queue is full: off the event loop
            if not await asyncio.to_thread(self.engine.add, request_id, asked.ids, asked.max_new, asked.settings):
                raise EngineDown(self.problem() or "the engine takes no new requests")
            async for output in self._outputs(outputs, request):
                if first:
                    self.first_token(held, time.perf_counter() - asked.started)
                    first = False
                yield output
        except queue.Full:
            raise Overloaded("the generation engine's request queue is full") from None
        except BaseException:
            self.engine.cancel(request_id)
            raise
        finally:
            self.running -= 1
            self.engine.forget(request_id)

    async def _outputs(self, outputs: asyncio.Queue, request: Request):
        """A request's outputs from the engine, to its last; raises when the client or the engine goes away,
        looked at every LOOK_S whether outputs come or not (a client waiting for a whole answer is seen
        leaving only here)."""
        looked = time.monotonic()
        while True:
            try:
                output = await asyncio.wait_for(outputs.get(), timeout=LOOK_S)
            except asyncio.TimeoutError:
                output = None
            if output is None or time.monotonic() - looked >= LOOK_S:
                looked = time.monotonic()
                if await request.is_disconnected():
                    raise Disconnected()
                if self.problem():
                    raise EngineDown(self.problem())
            if output is not None:
                yield output
                if output.is_finished():
                    return

    def first_token(self, held: int, seconds: float) -> None:
        """A request's first output came `seconds` after the request, added when `held` tokens were held."""
        self.metrics.first_token.observe(seconds)
        if self.target:
            self.target.answered(held, seconds)

    def finished(self, asked: Asked, output) -> tuple[list[int], str, str]:
        """An engine output → (the completion's tokens, its text, finish_reason), cut at eos and stop strings."""
        return self.runner.finish(output.generated_tokens, asked.max_new, asked.stops)

    def incomplete(self, asked: Asked, generated: list[int], text: str, reason: str) -> tuple[str, str] | None:
        """Why a constrained request's finished completion is no answer ((reason, message)), or None (xgrammar's
        check: call it off the event loop)."""
        return self.runner.incomplete(asked.constraint, generated, text, reason, asked.max_new)

    def problem(self) -> str | None:
        return self.engine.problem()

    def stop(self) -> None:
        self.engine.stop()


def uncut(max_length: int) -> str:
    """Why serve refuses a text it would have to cut: an OpenAI answer has no field to say so."""
    return (
        f"text is longer than max_length={max_length} tokens, and this answer could not say it was cut; "
        "send a shorter text, or start serve with --set model.max_length=N (up to the model's own limit)"
    )


def most_tokens(texts: list, max_length: int) -> int:
    """An upper estimate of the tokens `texts` (or pairs of texts) become: a token per character and the
    special tokens, at most max_length each."""
    return sum(
        min(max_length, (sum(map(len, text)) + 3) if isinstance(text, tuple) else len(text) + 2) for text in texts
    )


def request_rows_job(job: JobConfig) -> JobConfig:
    """The job as it reads a request's rows (request_rows): its input section for them, the rest as served."""
    pair = {"text_pair": "text_pair"} if job.model.task == "score" else {}
    return job.model_copy(update={"input": InputConfig(path="-", text="text", **pair)})


def request_rows(texts: list) -> pa.Table:
    """A request's texts (or (text, text_pair) tuples) as the rows request_rows_job reads."""
    if texts and isinstance(texts[0], tuple):
        first, second = zip(*texts)
        return pa.table({"text": pa.array(first, pa.string()), "text_pair": pa.array(second, pa.string())})
    return pa.table({"text": pa.array(texts, pa.string())})


async def until_done(pending, request: Request, cancel):
    """Wait for a queued request; if the client goes away, cancel(pending) drops its rows before they run."""
    while True:
        done, _ = await asyncio.wait({pending.future}, timeout=LOOK_S)
        if done:
            return pending.future.result()
        if await request.is_disconnected():
            cancel(pending)
            raise Disconnected()
