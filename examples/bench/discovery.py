"""What discovery costs at the start of every run: row counts, content digests and column types.

    python examples/bench/discovery.py --rows 1000000

Writes one JSONL shard and one Parquet shard of real SMS texts (repeated to --rows) and times
`discover_shards` on each: Parquet reads its footer only; JSONL reads every byte once (counting lines
and hashing them), and parses every line when an id or kept column needs its type fixed.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchinfer.job.config import InputConfig
from batchinfer.sources import discover_shards

EXAMPLES = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    sms = pa.concat_tables(pq.read_table(p) for p in sorted((EXAMPLES / "sms_spam").glob("*.parquet")))
    texts = sms.column("text").to_pylist()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        rows = [{"id": f"sms-{i}", "text": texts[i % len(texts)], "label": i % 2} for i in range(args.rows)]
        with open(work / "rows.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        pq.write_table(pa.Table.from_pylist(rows), work / "rows.parquet")
        print(
            f"{args.rows:,} rows; JSONL {(work / 'rows.jsonl').stat().st_size / 1e6:,.0f} MB, "
            f"Parquet {(work / 'rows.parquet').stat().st_size / 1e6:,.0f} MB"
        )
        print("| shard | columns | seconds | MB/s |\n|---|---|---|---|")
        sizes = {p.name: p.stat().st_size for p in work.iterdir()}
        for name, cfg in [
            ("rows.parquet", InputConfig(path=str(work / "rows.parquet"), text="text", id="id", keep=["label"])),
            ("rows.jsonl", InputConfig(path=str(work / "rows.jsonl"), text="text")),
            ("rows.jsonl", InputConfig(path=str(work / "rows.jsonl"), text="text", id="id", keep=["label"])),
        ]:
            t0 = time.perf_counter()
            discover_shards(cfg)
            seconds = time.perf_counter() - t0
            described = ", ".join(cfg.columns)
            print(f"| {name} | {described} | {seconds:.2f} | {sizes[name] / 1e6 / seconds:,.0f} |")


if __name__ == "__main__":
    main()
