"""The batching a run settles on: its token budget and strategy, and the backend and precision that run
the batches. A value handed from the driver to its chunk tasks and back; and the probe's choice it is settled
from, as a chunk task hands it to the driver and the output folder records it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class ProbeChoice(BaseModel):
    """What a batching probe chose on a job's first chunk (runners/base.py; engine auto on a GPU: its engine,
    runners/generate.py), and what it measured. One value from the runner to the driver (through Ray too), into
    the job record (_batchinfer.json `tuning`) and the report (`batching.probe`), and read back by a resumed run
    (`batching`). Keys it does not know are kept (a later batchinfer may add some)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    max_tokens: Annotated[int, Field(ge=1)]
    strategy: Literal["padded", "packed"]
    backend: str | None = None  # torch | openvino; generate: the engine (continuous | static); None: before backends
    precision: str | None = None  # the backend's (OpenVINO's f32 | bf16 | f16); None: its only one
    # the batching probe's figures (batching/probe.py); None where engine auto's probe chose (engine_probe)
    tokens_per_s: dict[str, float] | None = None  # Candidate.key -> tokens/s
    seconds: float | None = None  # the probe's wall time
    rows: int | None = None  # the chunk's items it ran
    notes: list[str] | None = None  # None: none
    precision_check: dict[str, Any] | None = None  # the chosen precision against f32 (runners/base.py)
    conversion_check: dict[str, Any] | None = None  # OpenVINO's f32 conversion against torch
    engine_probe: dict[str, Any] | None = None  # generate on a GPU: each engine's tokens/s and the rows timed

    @property
    def batching(self) -> Batching:
        return Batching(self.max_tokens, self.strategy, self.backend, self.precision)

    def record(self) -> dict:
        """As _batchinfer.json and the report hold it: the fields it has, as JSON (a None left out: read back
        as None)."""
        return self.model_dump(mode="json", exclude_none=True)
