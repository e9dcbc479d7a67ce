"""Batching: a chunk's token counts cut into batches under a budget (cut, pure), and the probe that
picks the budget, the strategy and the backend on the job's own rows (probe)."""
