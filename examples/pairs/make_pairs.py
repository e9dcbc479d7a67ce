"""Writes sms-pairs.parquet: 300 (query, message) pairs for the rerank example job (jobs/rerank-sms.yaml),
three short queries against the first 100 messages of the shipped SMS Spam Collection (CC BY 4.0, see
../sms_spam/SOURCE.md).

    python examples/pairs/make_pairs.py
"""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

QUERIES = ["free prize, call now to claim", "are we still meeting tonight", "please send me the report"]

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sms = pq.read_table(here.parent / "sms_spam" / "sms-00000.parquet").slice(0, 100)
    pairs = [
        {"pair_id": f"{sms_id}-q{q}", "query": query, "message": text}
        for q, query in enumerate(QUERIES)
        for sms_id, text in zip(sms.column("sms_id").to_pylist(), sms.column("text").to_pylist())
    ]
    pq.write_table(pa.Table.from_pylist(pairs), here / "sms-pairs.parquet")
