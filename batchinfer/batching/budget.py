"""The batching a run settles on: its token budget and strategy, and the backend and precision that run
the batches. A value handed from the driver to its chunk tasks and back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batching:
    """The batching settled for a run (batching.auto resolved; the report's `batching` section): the token
    budget and strategy batches are cut with, and the backend and precision that run them. Settled by the
    job, a recorded probe or a new one, and its budget lowered for the rest of the run when a batch runs out
    of memory. A value: a runner hands back the batching it ended a chunk with (ChunkOutput.budget), its chunk
    task cuts the next chunk with that, and the driver reports the last one a worker returned; nothing is
    changed in place across those hands."""

    max_tokens: int
    strategy: str
    backend: str | None = None  # torch | openvino; None: not settled yet (the probe or the default decides)
    precision: str | None = None  # OpenVINO's f32 | bf16 | f16; None: not settled yet

    @property
    def key(self) -> tuple[int, str]:
        return self.max_tokens, self.strategy
