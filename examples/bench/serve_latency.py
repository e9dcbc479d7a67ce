"""Open-loop load on `batchinfer serve` (embed, MiniLM) on 127.0.0.1: a latency target (serve.p99_ms) against
the fixed window, at rising request rates.

    python examples/bench/serve_latency.py --shared ../shared/data
    python examples/bench/serve_latency.py --rates 20,40,80 --seconds 10 --target-ms 60
    python examples/bench/serve_latency.py --rates 75,90 --target-ms 45 --servers target   # one server only

Requests arrive as a Poisson process (exponential gaps, a fixed seed) at each rate, each one text, sent whether or
not the earlier ones were answered (open loop: a slow server is not given a slower client). First the latency of
a lone request is measured (one at a time, on the fixed window's server); the target is --target-ms, else 3x that.
Then, for the fixed window and for the target, one server each: per rate, the offered and served requests per
second, p50 and p99 latency of the answered requests (200), the share shed (429), the mean rows a batch ran
and the batch budget's rows at the end (/metrics). Bounded: each rate sends for
--seconds and at most --requests requests, and waits at most --timeout seconds for the last answers (a request not
answered by then counts as unanswered, its latency as the timeout).

    python examples/bench/serve_latency.py --record tests/data/minilm_batch_latency.json

records the trace tests/test_latency.py replays: MiniLM batches of 1 to 64 texts (in-process, the runner serve
uses), each one's tokens, rows and seconds, in the order run.

    python examples/bench/serve_latency.py --cost

prints what a request costs the server, in its CPU milliseconds (its process's, around 1,500 requests, 8 in
flight, after 200 not counted): a /health, a served embedding (no target) and one refused by a target too small
to meet (serve.p99_ms=0.01: nearly all shed; the few served are counted as served ones cost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serve import MODEL, server_process, serving, texts  # noqa: E402


async def lone(base: str, rows: list[str]) -> float:
    """The median latency of requests sent one at a time (seconds)."""
    latencies = []
    async with httpx.AsyncClient(timeout=30) as http:
        for row in rows:
            started = time.perf_counter()
            (await http.post(f"{base}/v1/embeddings", json={"input": row})).raise_for_status()
            latencies.append(time.perf_counter() - started)
    return float(np.median(latencies))


class Loopback:
    """HTTP/1.1 keep-alive connections to the server, as many as the load needs: a request takes an idle one
    or opens one. Leaner than a general client, so that on a small machine the load takes little of the CPU
    the server is measured on."""

    def __init__(self, base: str):
        self.host, port = base.removeprefix("http://").split(":")
        self.port, self.idle = int(port), []

    async def post(self, path: str, body: dict) -> int:
        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
        return await self._exchange(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)

    async def get(self, path: str) -> int:
        return await self._exchange(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())

    async def _exchange(self, request: bytes) -> int:
        """`request` sent, its answer read whole: its status."""
        reader, writer, line = await self._send(request)
        status = int(line.split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        await reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection") == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return status

    async def _send(self, request: bytes):
        """`request` on an idle connection, else a new one: (reader, writer, the status line). An idle one the
        server has closed meanwhile (its keep-alive ran out) answers nothing: the request goes on the next."""
        while True:
            fresh = not self.idle
            reader, writer = await asyncio.open_connection(self.host, self.port) if fresh else self.idle.pop()
            try:
                writer.write(request)
                line = await reader.readline()
            except ConnectionError:
                if fresh:
                    raise
                line = b""
            if line or fresh:
                return reader, writer, line
            writer.close()

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def poisson(
    base: str, rows: list[str], rate: float, seconds: float, timeout: float, seed: int, target: float
) -> dict:
    """Requests at `rate` a second, Poisson arrivals, for `seconds` or len(rows) requests, whichever ends first;
    `target` (seconds): what an answer counts toward goodput within."""
    gaps, http = random.Random(seed), Loopback(base)
    answers: list[tuple[int, float]] = []  # (status, seconds)

    async def one(row: str) -> None:
        started = time.perf_counter()
        try:
            status = await http.post("/v1/embeddings", {"input": row})
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):  # a connection that broke
            status = 0
        answers.append((status, time.perf_counter() - started))

    began, due, sent = time.perf_counter(), 0.0, []
    for row in rows:
        due += gaps.expovariate(rate)
        if due > seconds:
            break
        await asyncio.sleep(max(0.0, began + due - time.perf_counter()))
        sent.append(asyncio.ensure_future(one(row)))
    offered = len(sent) / (time.perf_counter() - began)
    _, late = await asyncio.wait(sent, timeout=timeout)
    for task in late:  # not answered within the timeout: counted so, their latency the timeout
        task.cancel()
    answers += [(0, timeout)] * len(late)
    ended = time.perf_counter()
    http.close()
    ok = [s for status, s in answers if status == 200]
    return {
        "offered": offered,
        "served": len(ok) / (ended - began),
        "good": sum(s <= target for s in ok) / (ended - began),
        "p50": np.percentile(ok, 50) * 1000 if ok else float("nan"),
        "p99": np.percentile(ok, 99) * 1000 if ok else float("nan"),
        "shed": sum(status == 429 for status, _ in answers) / max(len(answers), 1),
        "unanswered": sum(status not in (200, 429) for status, _ in answers),
    }


def batches(base: str) -> tuple[float, float, float]:
    """From /metrics: batches run so far, rows run in them, and the batch budget's rows now."""
    text = httpx.get(f"{base}/metrics").text
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    return (
        value.get("batchinfer_batch_rows_count", 0.0),
        value.get("batchinfer_batch_rows_sum", 0.0),
        value.get('batchinfer_batch_budget{unit="rows"}', float("nan")),
    )


def record(path: Path, rows: list[str]) -> None:
    """Batches of 1..64 of `rows` run by serve's runner, three rounds of rising sizes: [tokens, rows, seconds]."""
    from batchinfer.backends.models import resolve_model_path
    from batchinfer.job.config import validate_job
    from batchinfer.runners import make_runner

    job = validate_job(
        {"input": {"path": "-", "text": "text"}, "model": {"path": MODEL, "task": "embed"}, "output": {"path": "-"}}
    )
    runner = make_runner(job, resolve_model_path(MODEL))
    runner.settle_default()
    runner.lay_out("packed" if runner.packing_problem() is None else "padded")
    ids, trace, start = runner.tokenize(rows).ids, [], 0
    for size in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64] * 3:
        batch, start = ids[start : start + size], (start + size) % (len(ids) - 64)
        started = time.perf_counter()
        runner.run(batch)
        trace.append([sum(map(len, batch)), size, round(time.perf_counter() - started, 5)])
    path.write_text(json.dumps({"model": MODEL, "batches": trace}) + "\n")


def cpu_seconds(process) -> float:
    """The CPU seconds so far of `process` (a subprocess.Popen), every thread, user and system."""
    times = psutil.Process(process.pid).cpu_times()
    return times.user + times.system


async def closed_loop(base: str, path: str, body: dict | None, count: int, in_flight: int = 8) -> dict[int, int]:
    """`count` requests, `in_flight` at a time: how many got each status."""
    http, statuses, left = Loopback(base), {}, iter(range(count))

    async def worker() -> None:
        for _ in left:
            status = await (http.get(path) if body is None else http.post(path, body))
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    http.close()
    return statuses


def cost(rows: list[str], count: int = 1500) -> None:
    """What a request costs the server, in its CPU milliseconds: a /health, a served embedding, a shed one."""
    body = {"input": rows[0]}
    print("| request | answers | server CPU ms a request |\n|---|---|---|")
    for name, settings, path, sent in [
        ("/health", [], "/health", None),
        ("embedding, served", [], "/v1/embeddings", body),
        ("embedding, serve.p99_ms=0.01", ["serve.p99_ms=0.01"], "/v1/embeddings", body),
    ]:
        with server_process(settings) as (base, server):
            asyncio.run(closed_loop(base, path, sent, 200))  # warm-up, not counted
            before = cpu_seconds(server)
            statuses = asyncio.run(closed_loop(base, path, sent, count))
            spent = cpu_seconds(server) - before
            answers = ", ".join(f"{n} x {status}" for status, n in sorted(statuses.items()))
            print(f"| {name} | {answers} | {spent * 1000 / count:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="10,20,40,60,80,120,160", help="requests a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=15, help="how long each rate sends")
    parser.add_argument("--requests", type=int, default=4000, help="the most requests one rate sends")
    parser.add_argument("--timeout", type=float, default=30, help="the longest wait for an answer, seconds")
    parser.add_argument("--target-ms", type=float, help="serve.p99_ms (default: 3x a lone request's latency)")
    parser.add_argument("--max-wait-ms", type=float, default=5, help="serve.max_wait_ms, for both servers")
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"))
    parser.add_argument("--servers", default="fixed,target", help="which servers to load: fixed, target or both")
    parser.add_argument("--record", type=Path, help="record a batch latency trace to this file, and stop")
    parser.add_argument("--cost", action="store_true", help="print what a request costs the server's CPU, and stop")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    rows = texts(Path(args.shared), args.requests)
    if args.record:
        return record(args.record, rows)
    if args.cost:
        return cost(rows)
    wait = f"serve.max_wait_ms={args.max_wait_ms}"
    with serving([wait]) as base:
        asyncio.run(lone(base, rows[:30]))  # warm-up
        single = asyncio.run(lone(base, rows[30:130]))
    target = args.target_ms or round(3 * single * 1000)
    print(f"MiniLM embed, one text a request, 127.0.0.1; a lone request: {single * 1000:.1f} ms (median of 100)")
    print(f"Poisson arrivals for {args.seconds:g} s a rate; target serve.p99_ms={target:g}\n")
    print(
        "| server | offered req/s | served req/s | within the target req/s | p50 ms | p99 ms | shed | unanswered "
        "| rows a batch | budget rows |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    servers = {"fixed": ("fixed window", [wait]), "target": (f"p99_ms {target:g}", [wait, f"serve.p99_ms={target}"])}
    for name, settings in (servers[s] for s in args.servers.split(",")):
        with serving(settings) as base:
            asyncio.run(poisson(base, rows, 20, 3, args.timeout, 0, target / 1000))  # warm-up, first measurements
            for i, rate in enumerate(rates):
                before = batches(base)
                r = asyncio.run(poisson(base, rows, rate, args.seconds, args.timeout, i + 1, target / 1000))
                after = batches(base)
                per_batch = (after[1] - before[1]) / max(after[0] - before[0], 1)
                print(
                    f"| {name} | {r['offered']:.1f} | {r['served']:.1f} | {r['good']:.1f} | {r['p50']:.0f} | "
                    f"{r['p99']:.0f} | {r['shed']:.0%} | {r['unanswered']} | {per_batch:.1f} | {after[2]:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
