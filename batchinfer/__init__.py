"""batchinfer: offline batch inference over Parquet/JSONL shards."""

import sys
from importlib.metadata import PackageNotFoundError, version

from . import machine  # noqa: F401 - first, so that start-up figures count from the package's import

# OpenVINO's converter package reports usage to Google Analytics from every process that imports openvino, unless
# the user's home holds its opt-out: it writes a client id and counts under ~/intel and forks the process (model and
# all) for each report. A batch job has no business calling out from a cluster or an offline box, nor writing in a
# home it was not given; openvino runs its own no-op stub when that package cannot be imported. One the process
# imported before batchinfer is left as it is.
sys.modules.setdefault("openvino_telemetry", None)

try:
    __version__ = version("batchinfer")
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0.2.0"

__all__ = ["RunResult", "__version__", "infer", "run"]


def __getattr__(name: str):
    """batchinfer.run, batchinfer.infer and RunResult, imported on first use (they load torch and transformers)."""
    if name in ("run", "infer", "RunResult"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'batchinfer' has no attribute {name!r}")
