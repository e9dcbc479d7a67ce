"""The runner contract: what a chunk's run (execution/chunk_task.py) hands a runner and what it gets back.

Every task's runner implements `Runner` (encoder tasks through runners/base.py's EncoderRunner,
generation in runners/generate.py); the chunk's run calls nothing else and knows no task by name.
What differs between tasks (per-row settings read from the input, how items are cut into batches,
whether packing applies, the figures a record carries) is the runner's to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Collection, Protocol

import numpy as np
import pyarrow as pa

from ..batching.budget import Batching, ProbeChoice
from ..control import StopFlag
from ..heap import HeapGuard
from ..job.config import JobConfig
from ..sources.prepare import Prepared

if TYPE_CHECKING:  # a warm OpenVINO run never imports torch (backends/__init__.py)
    import torch

    from ..batching.probe import Candidate
    from ..constrained.grammar import Grammars
    from ..constrained.spec import Constraint
    from ..job.config import GenerationConfig
    from .engine import Engine


@dataclass
class Prefix:
    """A token prefix that items run after, computed once for all of them: not in their ids nor lengths."""

    tokens: int  # its length
    used: np.ndarray  # [items] bool: the items that run after it (the rest run whole)


@dataclass
class Tokens:
    ids: list[list[int]]  # per item; a Pair for (text, text_pair) items
    lengths: np.ndarray  # [items] int64, special tokens included
    truncated: np.ndarray  # [items] bool
    owner: np.ndarray | None = None  # [items] the text each item belongs to; None: item i is text i
    encodings: list | None = None  # the tokenizer's encodings, for runners that read offsets
    prefix: Prefix | None = None  # the prefix the items share, when one runs once for them

    def owners(self) -> np.ndarray:
        return self.owner if self.owner is not None else np.arange(len(self.ids))

    def prefix_reused(self, items: np.ndarray, rows: np.ndarray | None = None) -> dict | None:
        """What the prefix saved the items at `items` (of rows `rows`, positions in the texts; default all): its
        length, the rows that ran after it, the tokens not computed again for them and the prompt tokens those
        items had in full (what they computed and what they saved), as a ChunkRecord's `prefix` holds them;
        None without one."""
        if self.prefix is None:
            return None
        if rows is not None:
            items = items[np.isin(self.owners()[items], rows)]
        used = items[self.prefix.used[items]]
        tokens = self.prefix.tokens
        saved = len(used) * tokens
        return {
            "tokens": tokens,
            "rows": len(np.unique(self.owners()[used])),
            "saved_tokens": saved,
            "prompt_tokens": int(self.lengths[items].sum()) + saved,
        }


@dataclass(kw_only=True)
class ChunkInput:
    """A chunk as a runner receives it: read, prepared, tokenized, and cut into batches."""

    table: pa.Table  # the chunk's input rows as read (a runner may read per-row settings from their columns)
    prepared: Prepared
    tokens: Tokens
    index: np.ndarray  # positions in `tokens` that go to the model (the rest became errors)
    batches: list[np.ndarray]  # positions in `index`, as the model will see them
    cut_with: tuple[int, str]  # the Batching.key the batches were cut with
    row_settings: list | None = None  # per table row, what Runner.row_settings read (generate: max_new_tokens)


@dataclass
class ChunkContext:
    """What a runner's chunk step uses besides the chunk: the job's settings, the batching budget it starts
    from (a lowered or probed one comes back in ChunkOutput.budget), the stop flag, the heap guard, where
    notes go, and whether to settle batching: auto."""

    job: JobConfig
    budget: Batching
    stop: StopFlag
    heap: HeapGuard
    log: Callable[[str], None]
    probe: bool = False
    on_batch: Callable[[int, int], None] = lambda items, tokens: None  # after each batch: its items and tokens


@dataclass
class ChunkOutput:
    """What a runner returns for a chunk: the result columns of the rows that ran, and its figures."""

    columns: dict[str, pa.Array]  # the task's result columns, one entry per kept row
    kept: np.ndarray  # the rows that ran, as positions in the chunk's texts (prepared.texts)
    model_seconds: float
    padded_tokens: int  # the tokens the model computed, padding included
    figures: dict = field(default_factory=dict)  # the task's own figures for the record (generated_tokens, ...)
    tuning: ProbeChoice | None = None  # the probe's choice (batching: auto), when this chunk settled it
    budget: Batching | None = None  # the budget the chunk ended with (a probe's choice, lowered on OOM); None: as given
    lowered: list[str] = field(default_factory=list)  # each out-of-memory that lowered max_tokens in this chunk


class Runner(Protocol):
    """A task's model behind one interface: texts → tokens, a chunk of tokens → result columns."""

    device: torch.device
    max_length: int  # tokens per item, at most
    score_labels: list[str] | None  # what each entry of a `scores` column stands for; None: no such column
    load_seconds: dict  # the model's load in steps (converting, compiling), for the report's startup figures

    @property
    def backends(self) -> Collection[str]:
        """The backends (generate: engines) still loaded that a probe may choose between (ChunkTask.take)."""

    def keep(self, backend: str, precision: str | None = None) -> None:
        """Settle on `backend` in `precision` (default: its first), as another worker's probe chose; free the rest."""

    def tokenize(self, texts: list) -> Tokens:
        """Prepared texts (strings, (text, text_pair) tuples or chat messages) → items."""

    def row_settings(self, job: JobConfig, table: pa.Table, prepared: Prepared) -> list | None:
        """Per row of `table`, what the task reads from the row's own columns (None: nothing); a row whose
        setting is unusable is put in prepared.errors."""

    def cut(self, lengths: np.ndarray, budget: tuple[int, str], max_rows: int) -> list[np.ndarray]:
        """Items of `lengths` tokens → batches (positions), as the runner runs them under a Batching.key."""

    def packing_problem(self) -> str | None:
        """Why batching.strategy: packed cannot run this runner's model, or None."""

    def run_chunk(self, loaded: ChunkInput, ctx: ChunkContext) -> ChunkOutput:
        """Run a loaded chunk's items through the model; rows that fail go to loaded.prepared.errors."""


class BatchRunner(Runner, Protocol):
    """An encoder task's runner (runners/base.py's EncoderRunner), whose batches of items its caller may cut and run
    itself: serve's Batcher and plan's timing, which settle its backend and precision as a run's probe does."""

    probe_share: float | None  # the most of a first chunk's tokens its probe runs (batching/probe.py)

    @property
    def backend(self) -> str:
        """The backend the next batches run on."""

    @property
    def precision(self) -> str | None:
        """The precision the next batches run in; None: the model's own dtype."""

    @property
    def default_budget(self) -> int:
        """The running backend's max_tokens where the probe cannot measure."""

    def candidates(self) -> tuple[Candidate, ...]:
        """The loaded backends as the probe weighs them, the default first."""

    def use(self, backend: str, precision: str | None = None) -> None:
        """Run the next batches on `backend` (one of those loaded), in `precision` (default: its first)."""

    def lay_out(self, strategy: str) -> None:
        """Run the next batches padded or packed (batching.strategy, settled)."""

    def run(self, ids: list[list[int]]) -> list:
        """One batch of items → one result per item, in the same order."""

    def settle_default(self) -> dict:
        """Where no chunk is there to probe (serve): settle on the default backend and its checked precision;
        returns the precision check's figures."""

    def settle_precisions(self, ids: list | None = None) -> dict[str, dict]:
        """Settle each loaded backend's precision where it has a choice, checked on the items `ids`; returns each
        check's figures by backend."""

    def columns(self, results: list[list], texts: np.ndarray, loaded: ChunkInput) -> dict[str, pa.Array]:
        """Each row's item results (`results`, for the rows at `texts` of loaded.prepared.texts) → result columns."""


class Generating(Runner, Protocol):
    """The generate task's runner (runners/generate.py) as serve's generate and plan's generation timing use it:
    its engine, and the prompt and completion handling around it that serve does request by request."""

    engine: Engine  # the generation engine the job runs on (serve: through Engine.serve)
    context: int | None  # positions the model knows, prompt and completion; None: the engine keeps its own
    constraint: Constraint | None  # the job's response_format, every request's unless it brings its own

    @property
    def grammars(self) -> Grammars:
        """xgrammar's compiler for this tokenizer (a request's constraint is compiled before it is admitted)."""

    def shared_page(self) -> int | None:
        """The cache page (tokens) in which the engine shares rows' common prefixes; None when it shares none."""

    def chat_problem(self, where: str) -> str | None:
        """Why chat messages at `where` cannot be formatted for this model (it has no chat template), or None."""

    def chat_refused(self, messages: list) -> str | None:
        """Why the model's chat template refuses `messages` (it raised on them), or None."""

    def request_config(self, asked: dict) -> tuple[GenerationConfig, tuple[str, str] | None]:
        """The generation section with a request's own settings, or the job's and (reason, message) why not."""

    def finish(self, tokens: list[int], limit: int, stop: list[str]) -> tuple[list[int], str, str]:
        """Generated tokens → (the completion's tokens, its text, why it ended: stop | length)."""

    def incomplete(
        self, constraint: Constraint, ids: list[int], text: str, reason: str, limit: int
    ) -> tuple[str, str] | None:
        """Why a constrained completion is no answer ((reason, message)), or None when it is whole and valid."""
