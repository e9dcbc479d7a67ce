"""What a runner hands a backend and what it asks of one: the `Batch` it builds once per batch of items, and the
`Backend` protocol (text-embeddings-inference's `Backend` trait: a name, whether it runs packed batches, its
precisions, and `forward` on a batch). Runners, the probe, plan and serve ask a backend these questions and never
compare its name, so a new backend is one module in backends/ (and its tests).

Label scoring asks a causal LM for the log-probabilities of chosen tokens (`Scorer`, on `Targets`), numpy in and out
as `forward`: it never reaches past the backend into its model.

Nothing here imports torch: a runner whose head reads numpy runs on a numpy backend (OpenVINO) without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Pair(list):
    """The token ids of a (text, text_pair) item, with its token type ids; len() counts its tokens."""

    def __init__(self, ids: list[int], type_ids: list[int]):
        super().__init__(ids)
        self.type_ids = type_ids


@dataclass(frozen=True)
class Batch:
    """One batch of items as every backend takes it (batch_of builds it). Shapes: b items, L the longest, T their
    tokens in all.

    Padded: ids and type_ids are [b, L], right-padded with the tokenizer's pad id (type ids with 0). Packed: the
    items laid end to end, ids and type_ids [T], `cu_lengths` saying where each starts. `mask` is [b, L] either way
    (1: a real token), the layout a task's head reads its output in."""

    ids: np.ndarray  # int64, [b, L] padded or [T] packed
    mask: np.ndarray  # int64 [b, L]
    lengths: np.ndarray  # int64 [b], each item's tokens
    # int32 [b + 1]: where each item starts in the packed ids, then T; None: padded
    cu_lengths: np.ndarray | None = None
    type_ids: np.ndarray | None = None  # int64, laid out as ids; None: items are single texts, not pairs

    @property
    def packed(self) -> bool:
        return self.cu_lengths is not None

    def inputs(self) -> dict[str, np.ndarray]:
        """A padded batch as a transformers encoder's keyword inputs: input_ids, attention_mask, token_type_ids
        for pairs."""
        types = {} if self.type_ids is None else {"token_type_ids": self.type_ids}
        return {"input_ids": self.ids, **types, "attention_mask": self.mask}


def batch_of(items: list[list[int]], pad_id: int, packed: bool = False) -> Batch:
    """Items (token ids; Pair items carry token type ids) → one Batch, padded with `pad_id` or packed."""
    lengths = np.fromiter((len(item) for item in items), dtype=np.int64, count=len(items))
    longest = int(lengths.max())
    mask = (np.arange(longest)[None, :] < lengths[:, None]).astype(np.int64)  # [b, L]
    pairs = isinstance(items[0], Pair)
    if packed:
        total = int(lengths.sum())
        ids = np.fromiter((t for item in items for t in item), dtype=np.int64, count=total)
        types = np.fromiter((t for item in items for t in item.type_ids), np.int64, total) if pairs else None
        cu_lengths = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return Batch(ids, mask, lengths, cu_lengths, types)
    ids = np.full((len(items), longest), pad_id, dtype=np.int64)
    types = np.zeros((len(items), longest), dtype=np.int64) if pairs else None
    for i, item in enumerate(items):
        ids[i, : len(item)] = item
        if types is not None:
            types[i, : len(item)] = item.type_ids
    return Batch(ids, mask, lengths, None, types)


class Backend(Protocol):
    """An encoder model on one backend, as a runner drives it: backends.torch.TorchBackend,
    backends.openvino.OpenVINOBackend (a test's fake is a third, tests/test_backend_interface.py).

    forward(batch) returns the task's one output (the model output the runner's `converted_output` names, or what
    its head module makes of the hidden states) for the batch's items in the padded layout ([b, ...]: [b, L, ...]
    per token) as a float32 numpy array whatever the backend (as TEI's embed and predict return one type), so the
    runners' heads read numpy and a run on a backend without torch (OpenVINO) never imports torch for them."""

    name: str  # what the output folder records: model.backend's value for it
    # the model's own library (torch): what a conversion is checked against; its probe keys carry no name
    reference: bool
    default_budget: int  # max_tokens when the job leaves it to the probe and the probe cannot measure
    config: object  # the model's config (transformers' or read from config.json): what a runner's task reads of it
    device: object  # where it computes (a torch.device, or one that looks like it)
    precision: str | None  # what the next forwards run in; None: the model's own dtype

    @property
    def precisions(self) -> list[str | None]: ...  # the ones it may use, the default first

    @property
    def packing_problem(self) -> str | None: ...  # why it cannot run packed batches of this model; None: it can

    @property
    def f32(self) -> bool: ...  # whether it runs f32 under use("f32") (how a conversion is checked)

    def use(self, precision: str | None) -> None: ...  # run the next forwards in `precision` (None: the default)
    def keep(self, precision: str | None) -> None: ...  # settle on `precision` and free the others
    def forward(self, batch: Batch) -> np.ndarray: ...  # the task's output for the batch, float32 (see above)
    # the probe's tokens/s of each backend and the machine's load (machine.Load.as_dict) they were timed under,
    # for later jobs; and the best tokens/s each backend ran this model at on this CPU before (empty: none kept)
    def remember(self, rates: dict[str, float], load: dict | None) -> None: ...
    def best_rates(self) -> dict[str, float]: ...


@dataclass
class Targets:
    """A padded batch of a causal LM's items and the tokens whose log-probabilities are asked (label scoring's: a
    label's tokens after a prompt). Shapes: b items, L the longest, n targets; numpy whatever the backend."""

    input_ids: np.ndarray  # int64 [b, L], after `prefix`
    position_ids: np.ndarray  # int64 [b, L], counted from the start of `prefix`
    mask: np.ndarray  # bool [b, L, len(prefix) + L]: what each token may attend to (the prefix's, then the batch's)
    at: np.ndarray  # int64 [n]: the flat position (item x L + token) whose logits predict each target
    target: np.ndarray  # int64 [n]: the tokens asked for
    prefix: tuple[int, ...] = ()  # the tokens every item follows, run once and kept (Scorer.prefix_problem)


class Scorer(Protocol):
    """A causal LM as label scoring runs it (runners/label_score.py): the log-probability of chosen tokens, numpy out
    as `forward`'s output is, whatever the backend."""

    prefix_problem: str | None  # why Targets.prefix cannot be used with this model (its cache), or None

    def logprobs(self, batch: Targets) -> np.ndarray: ...  # float64 [n]: log p(target) at each `at`


class ScoringBackend(Backend, Protocol):
    """A backend that runs a causal LM for label scoring (torch's: OpenVINO runs encoders, backends.candidates)."""

    def scorer(self) -> Scorer: ...  # the model as label scoring runs it, built once per runner
