"""The shipped SMS messages (examples/sms_spam/, 5,574 rows) repeated to a larger input, for the benchmarks that
time a job longer than the shipped one (docs/benchmarks.md): `--rows` rows in `--shards` Parquet shards, each row
a shipped message with an id of its own (`<copy>-<sms_id>`), so that a job's ids stay unique.

    python examples/bench/repeat_sms.py --rows 300000 --shards 6 out/sms-300k
"""

from __future__ import annotations

import argparse
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "sms_spam"


def repeat(rows: int, shards: int, folder: Path) -> list[Path]:
    """`rows` rows of the shipped messages, copy after copy, written as `shards` shards into `folder` (new)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    shipped = ds.dataset([str(p) for p in sorted(SHIPPED.glob("*.parquet"))], format="parquet").to_table()
    copies = []
    for copy in range(-(-rows // shipped.num_rows)):
        ids = pc.binary_join_element_wise(pa.scalar(str(copy)), shipped.column("sms_id"), "-")
        copies.append(shipped.set_column(shipped.schema.get_field_index("sms_id"), "sms_id", ids))
    table = pa.concat_tables(copies).slice(0, rows)
    folder.mkdir(parents=True, exist_ok=False)
    per, paths = -(-rows // shards), []
    for shard in range(shards):
        paths.append(folder / f"sms-{shard:05d}.parquet")
        pq.write_table(table.slice(shard * per, per), paths[-1])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a new folder for the shards")
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--shards", type=int, default=6)
    args = parser.parse_args()
    for path in repeat(args.rows, args.shards, args.folder):
        print(path)


if __name__ == "__main__":
    main()
