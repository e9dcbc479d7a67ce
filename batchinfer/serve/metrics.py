"""serve's Prometheus metrics (GET /metrics): requests by endpoint and status, rows, tokens, batches,
queue waits, the tokens queued now, latency and time to first token, the batch budget now and the requests
shed to hold serve.p99_ms."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from starlette.routing import Match

from .batcher import BatchStats
from .latency import MISSED, TAIL

# fine where serve.p99_ms targets lie (tens to hundreds of ms), so that a p99 read from the buckets is close
LATENCY = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 30)
UNMATCHED = "unmatched"  # the endpoint of a path no route takes


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
        self.first_token = Histogram(
            "batchinfer_time_to_first_token_seconds",
            "Time from a completion request to its first token",
            registry=self.registry,
            buckets=LATENCY,
        )
        self.budget = Gauge(
            "batchinfer_batch_budget",
            "The batch budget now, in tokens and rows (serve.p99_ms sizes it; else batching.max_tokens, max_rows)",
            ["unit"],
            registry=self.registry,
        )
        self.shed = Counter(
            "batchinfer_shed",
            "Requests refused (429) as they would be answered past serve.p99_ms",
            registry=self.registry,
        )

    def serving(self, described: dict) -> None:
        """What answers the requests: the task, its backend or engine, and the precision it runs in."""
        Info("batchinfer_serving", "What answers requests", registry=self.registry).info(
            {k: str(v) for k, v in described.items()}
        )

    def queued(self, tokens: Callable[[], int]) -> None:
        """The tokens waiting now, read from the queue at each scrape: a load balancer's (and a test's) sign that
        requests are in, before any is answered."""
        Gauge(
            "batchinfer_queued_tokens",
            "Tokens of requests in, not yet answered (embed, classify, score: queued for a batch; generate: held "
            "against serve.max_queue_tokens)",
            registry=self.registry,
        ).set_function(tokens)

    def held_to(self, allowed: Callable[[], float]) -> None:
        """With serve.p99_ms: the predicted latency a request is admitted within now, read at each scrape."""
        Gauge(
            "batchinfer_admitted_within_seconds",
            f"serve.p99_ms less what the latency predictions missed by (the {MISSED}th percentile over the last "
            f"{TAIL} answers): a request predicted to be answered later is shed",
            registry=self.registry,
        ).set_function(allowed)

    def running(self, requests: Callable[[], int]) -> None:
        """generate: the requests in the engine now, read at each scrape (its running batch, which the engine
        sizes, at most batching.max_rows, and those waiting for a place in it)."""
        Gauge(
            "batchinfer_running_requests",
            "Completion requests in the generation engine now: running (at most batching.max_rows) or waiting "
            "for a place",
            registry=self.registry,
        ).set_function(requests)

    def budgeted(self, tokens: int, rows: int) -> None:
        self.budget.labels("tokens").set(tokens)
        self.budget.labels("rows").set(rows)

    def batch(self, stats: BatchStats) -> None:
        self.batch_rows.observe(stats.rows)
        self.batch_requests.observe(stats.requests)
        self.tokens.inc(stats.tokens)
        self.budgeted(*stats.budget)
        for waited in stats.waited:
            self.queue_wait.observe(waited)

    def answered(self, scope: dict, started: float) -> None:
        """A request (its ASGI scope) answered 200, `started` (time.perf_counter) ago."""
        label = endpoint(scope)
        self.requests.labels(label, "200").inc()
        self.latency.labels(label).observe(time.perf_counter() - started)

    def refused(self, scope: dict, status: int) -> None:
        self.requests.labels(endpoint(scope), str(status)).inc()

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def endpoint(scope: dict) -> str:
    """A request's endpoint label: the template of the route its path matches (/v1/models/{model:path}), else
    UNMATCHED. Each label value is a series kept until the server stops: one per path a client sends would
    grow without bound."""
    for route in scope["app"].router.routes:
        if route.matches(scope)[0] is not Match.NONE:
            return route.path
    return UNMATCHED
