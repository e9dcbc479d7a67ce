"""A job opened: its input discovered into shards, its model found and checked, its chunks planned and the
fingerprint they make. `run`, `validate` and `plan` all start here. Reads the inputs, the model's config and
(to hash them) its weights; writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends.models import checked_model_path, model_identity
from ..control import StopFlag
from ..job.config import JobConfig
from ..job.plan import Chunk, fingerprint, plan_chunks
from ..runners.model_generation import SAMPLING, samples, taken_from_model
from ..sources import Inputs, discover_shards, shard_contents


@dataclass(frozen=True)
class JobPlan:
    job: JobConfig
    inputs: Inputs  # the shards, those left out (input.on_bad_shard: skip) and the columns' types
    model_path: Path
    model_id: str  # every byte of the model's weights (backends.models.model_identity)
    rows: int  # in every shard

    @classmethod
    def open(cls, job: JobConfig, stop: StopFlag | None = None) -> JobPlan:
        """Discover the shards, resolve the model and check it can do the task (a model without the task's
        head, or a chat job without a template, fails here, before any output folder is touched), then
        hash its weights. With `stop`, a signal stops the reading where it is."""
        stop = stop or StopFlag()
        with stop.at_once():  # discovery hashes every byte of the input
            inputs = discover_shards(job.input, job.columns, output=job.output.path)
            model_path = checked_model_path(job.model, job.input.messages)
        with stop.at_once():  # the model's identity reads every byte of its weights the first time
            model_id = model_identity(model_path)
        return cls(job, inputs, model_path, model_id, sum(s.num_rows for s in inputs.shards))

    def chunks(self, limit: int | None = None, cuts: dict[str, set[int]] | None = None) -> list[Chunk]:
        """The job's chunks, in pieces at `cuts`; with `limit`, those holding its first `limit` rows
        (job.plan.plan_chunks)."""
        return plan_chunks([s.num_rows for s in self.inputs.shards], self.job.chunk_rows, limit, cuts)

    def fingerprint(self, limit: int | None = None) -> dict:
        """What decides whether an output folder's chunks can be reused (job.plan.fingerprint)."""
        return fingerprint(self.job, self.model_id, shard_contents(self.inputs.shards), limit, self.from_model())

    def from_model(self) -> list[str]:
        """The sampling settings a generate job that sets some of them takes from its model, which samples
        (model_generation.taken_from_model); none for a job that sets none of them, or another task."""
        gen = self.job.generation
        if self.job.model.task != "generate" or not gen.model_fields_set & set(SAMPLING):
            return []
        return taken_from_model(gen, samples(self.model_path))
