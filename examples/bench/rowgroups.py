"""What one big Parquet row group costs to read chunk by chunk, against the same rows in small groups.

    python examples/bench/rowgroups.py --rows 200000 --text-bytes 2000

pandas and pyarrow write up to a million rows in one row group (`row_group_size` defaults to 1M).
Writes the same rows twice, in one row group and in groups of --group rows, then reads each through
batchinfer's shard reader in chunks of --chunk rows (a run's read side, without the model), each file
in a process of its own: seconds for the whole shard and that process's peak RSS (VmHWM). Run it with
another checkout on PYTHONPATH to compare versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

READ = """
import json, re, sys, time
from pathlib import Path
from batchinfer.job.config import InputConfig
from batchinfer.sources import discover_shards, open_reader, read_spec

cfg = InputConfig(path=sys.argv[1], text="text", id="id")
inputs = discover_shards(cfg)
shard, chunk, seconds, peak = inputs.shards[0], int(sys.argv[2]), [], None
for _ in range(int(sys.argv[3])):
    reader, started = open_reader(shard, read_spec(cfg, types=inputs.types)), time.perf_counter()
    rows = sum(reader.read(s, min(s + chunk, shard.num_rows)).table.num_rows for s in range(0, shard.num_rows, chunk))
    seconds.append(time.perf_counter() - started)
    reader.close()
    # The peak of one read through the shard, as a run makes it (this process's, unlike ru_maxrss).
    peak = peak or int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))
print(json.dumps({"rows": rows, "seconds": min(seconds), "peak_mb": peak / 1024}))
"""


def texts(rows: int, size: int) -> pa.Array:
    """`rows` texts of `size` random letters and spaces (they compress as little as real text does)."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    data = letters[np.random.default_rng(0).integers(0, len(letters), rows * size)]
    offsets = np.arange(0, (rows + 1) * size, size, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(data)).cast(pa.string())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--text-bytes", type=int, default=2_000)
    parser.add_argument("--chunk", type=int, default=4096, help="rows per chunk (batching.chunk_rows: auto)")
    parser.add_argument("--group", type=int, default=4096, help="rows per row group of the small-groups file")
    parser.add_argument("--passes", type=int, default=1, help="reads of each file: the fastest counts")
    parser.add_argument(
        "--rounds", type=int, default=1, help="processes per file, the files taking turns: the fastest counts"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        table = pa.table({"id": np.arange(args.rows), "text": texts(args.rows, args.text_bytes)})
        files = {1: Path(work) / "one.parquet", -(-args.rows // args.group): Path(work) / "small.parquet"}
        for groups, path in files.items():
            pq.write_table(table, path, row_group_size=-(-args.rows // groups))
        del table
        found = {}
        for _ in range(args.rounds):  # turns, so that a load that comes and goes weighs on both files alike
            for groups, path in files.items():
                command = [sys.executable, "-c", READ, str(path), str(args.chunk), str(args.passes)]
                figures = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
                best = found.setdefault(groups, {**figures, "file_mb": path.stat().st_size / 1e6})
                best.update({key: min(best[key], figures[key]) for key in ("seconds", "peak_mb")})
    if args.json:
        print(json.dumps({"one": found[1], "small": found[max(found)]}))
        return
    print(f"{args.rows:,} rows of {args.text_bytes:,}-byte texts, read in chunks of {args.chunk:,} rows")
    print("| row groups | file MB | read seconds | peak RSS MB |\n|---|---|---|---|")
    for groups, figures in found.items():
        print(f"| {groups:,} | {figures['file_mb']:,.0f} | {figures['seconds']:.2f} | {figures['peak_mb']:,.0f} |")


if __name__ == "__main__":
    main()
