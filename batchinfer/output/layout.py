"""The names of an output folder's files, the error table's schema and the job id a Parquet footer carries."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq

from ..storage import JOB_RECORD

JOB = JOB_RECORD
DONE = "_done"
ERRORS = "_errors"
REPORT = "_report.json"
SUCCESS = "_SUCCESS"
LOCK = "_lock"
SKIPPED = f"{ERRORS}/skipped-shards.parquet"
BAD_RECORDS = f"{ERRORS}/bad-records.parquet"  # batchinfer 0.2's bad CSV records: still ours, removed on sight
LEGACY = "_manifest.jsonl"  # batchinfer 0.1's appended manifest
FORMAT = 2
ID_KEY = b"batchinfer.job_id"
CHUNK_KEY = b"batchinfer.chunk"  # a part's footer: the pass that wrote it (SSSSS-CCCCC, or SSSSS-CCCCC-rN)
ERROR_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("row", pa.int64()),
        ("reason", pa.string()),
        ("message", pa.string()),
    ]
)
# a chunk's name: SSSSS-CCCCC, _PPPPPPP for a piece of it after an earlier --limit's cut, -rN for a retry pass
PART = re.compile(rf"(?:{ERRORS}/)?part-(\d{{5}}-\d{{5}}(?:_\d{{7}})?(?:-r\d+)?)\.parquet")
MARKER = re.compile(rf"{DONE}/(\d{{5}}-\d{{5}}(?:_\d{{7}})?(?:-r\d+)?)\.json")
CREATING = re.compile(r"\.tmp-(?:[0-9a-f]{12}-[0-9a-f]{8}-_batchinfer\.json|lock-[0-9a-f]{32}-[0-9a-f]{8}-_lock)")


def part_name(chunk: str) -> str:
    return f"part-{chunk}.parquet"


def error_part_name(chunk: str) -> str:
    return f"{ERRORS}/part-{chunk}.parquet"


def marker_name(chunk: str) -> str:
    return f"{DONE}/{chunk}.json"


def marker_order(name: str) -> tuple[str, int]:
    """Markers sort by chunk, then pass: a retry after what it retries."""
    chunk = MARKER.fullmatch(name).group(1)
    base, _, generation = chunk.partition("-r")
    return base, int(generation or 0)


def tmp_prefix(job_id: str) -> str:
    """The prefix of this job's temporary files: it names the job, so a leftover is provably ours."""
    return f".tmp-{job_id[:12]}-"


def has_id(metadata: pq.FileMetaData | None, job_id: str) -> bool:
    """Whether a Parquet footer carries this job's id: the only proof that batchinfer wrote the file."""
    return metadata is not None and (metadata.metadata or {}).get(ID_KEY) == job_id.encode()


def footer_chunk(metadata: pq.FileMetaData) -> str | None:
    """The pass a part's footer names (None: written before parts named theirs)."""
    chunk = (metadata.metadata or {}).get(CHUNK_KEY)
    return chunk.decode(errors="replace") if chunk is not None else None


def dumps(value: dict, indent: int | None = None) -> bytes:
    return (json.dumps(value, indent=indent) + "\n").encode()
