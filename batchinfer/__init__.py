"""batchinfer: offline batch inference over Parquet/JSONL shards."""

__version__ = "0.1.0"
