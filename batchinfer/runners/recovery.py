"""Running a batch so that one bad batch never fails the job.

On out-of-memory the batch is split in two and each half retried, down to single rows; a row that
still does not fit is reported as `oom`. Any other model failure is isolated the same way and
reported as `model_error`, so one poisonous row costs that row alone; so is a row whose output holds NaN or
infinity, which no file should carry as a result.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..reasons import Reason


@dataclass
class BatchOutcome:
    results: list  # one per row; rows listed in `failed` hold None
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)  # position -> (reason, message)
    oom_tokens: int | None = None  # smallest padded size that ran out of memory


def is_oom(exc: BaseException) -> bool:
    torch = _torch()
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    # CPU allocators raise a plain RuntimeError.
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text
    )


def run_resilient(run: Callable[[list], list], rows: list) -> BatchOutcome:
    """run(rows) → one result per row; on failure halves the batch down to single rows."""
    outcome = BatchOutcome([None] * len(rows))

    def attempt(lo: int, hi: int) -> None:
        try:
            outcome.results[lo:hi] = results = list(run(rows[lo:hi]))
            for k, result in enumerate(results):
                if not finite(result):
                    outcome.results[lo + k] = None
                    outcome.failed[lo + k] = (Reason.MODEL_ERROR, NOT_FINITE)
            return
        except Exception as exc:  # noqa: BLE001 - any failure is narrowed down to the rows that cause it
            oom = is_oom(exc)
            if oom:
                padded = (hi - lo) * max(len(r) for r in rows[lo:hi])
                outcome.oom_tokens = min(outcome.oom_tokens or padded, padded)
                torch = _torch()
                if torch is not None and torch.cuda.is_available():
                    torch.cuda.empty_cache()
            if hi - lo == 1:
                reason = Reason.OOM if oom else Reason.MODEL_ERROR
                outcome.failed[lo] = (reason, f"{type(exc).__name__}: {str(exc)[:300]}")
                return
        mid = (lo + hi) // 2
        attempt(lo, mid)
        attempt(mid, hi)

    attempt(0, len(rows))
    return outcome


NOT_FINITE = (
    "the model's output for this row holds NaN or infinity (an activation overflowed, as float16 and bfloat16 "
    "can): set model.dtype: float32 and run again with --retry-errors"
)


def finite(result) -> bool:
    """A row's result (an array, or a list of numbers) holds no NaN or infinity; one that is no numbers passes.
    Checked in its own dtype: every row of every batch comes here, and a float64 copy of each is waste."""
    try:
        values = np.asarray(result)
    except ValueError:  # ragged: no numbers array
        return True
    return values.dtype.kind not in "fc" or bool(np.isfinite(values).all())


def _torch():
    """torch where the model runs on it, else None: a run on OpenVINO never imports torch (its errors are
    none of torch's), so neither does this."""
    return sys.modules.get("torch")
