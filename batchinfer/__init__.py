"""batchinfer: offline batch inference over Parquet/JSONL shards."""

from importlib.metadata import PackageNotFoundError, version

from . import machine  # noqa: F401 - first, so that start-up figures count from the package's import

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
