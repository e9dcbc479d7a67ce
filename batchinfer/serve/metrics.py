"""serve's Prometheus metrics (GET /metrics): requests by endpoint and status, rows, tokens, batches,
queue waits and latency."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, Info, generate_latest

from .batcher import BatchStats

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


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

    def serving(self, described: dict) -> None:
        """What answers the requests: the task, its backend or engine, and the precision it runs in."""
        Info("batchinfer_serving", "What answers requests", registry=self.registry).info(
            {k: str(v) for k, v in described.items()}
        )

    def batch(self, stats: BatchStats) -> None:
        self.batch_rows.observe(stats.rows)
        self.batch_requests.observe(stats.requests)
        self.tokens.inc(stats.tokens)
        for waited in stats.waited:
            self.queue_wait.observe(waited)

    def answered(self, path: str, started: float) -> None:
        """A request to `path` answered 200, `started` (time.perf_counter) ago."""
        self.requests.labels(path, "200").inc()
        self.latency.labels(path).observe(time.perf_counter() - started)

    def refused(self, path: str, status: int) -> None:
        self.requests.labels(path, str(status)).inc()

    def text(self) -> str:
        return generate_latest(self.registry).decode()
