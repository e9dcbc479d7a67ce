"""The torch backend: a transformers model (CPU or CUDA) as a Backend (base.py), in the dtype it was loaded in.
Padded batches go in as tensors on the model's device; packed ones through packing.py (varlen attention on a
GPU, re-padded attention elsewhere), their output padded back to [b, L, ...] before the task's output is read."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..batching.probe import DEFAULT_BUDGET
from .base import Batch
from .causal_scores import TorchScorer
from .packing import first_position, pack, packed_forward, supports_packing

DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


class TorchBackend:
    """model: the transformers model; output: the model output the task reads ("logits", "last_hidden_state"), and
    a function building a torch module of (hidden states [b, L, h], mask [b, L]) run on them instead, or None
    (runners/base.py converted_output)."""

    name, reference, default_budget = "torch", True, DEFAULT_BUDGET

    def __init__(self, model, device: torch.device, output: tuple[str, Callable | None]):
        self.model, self.device = model, device
        self.config = model.config
        self.output, head = output
        # the head module (cached per device by its builder), looked up once rather than per batch
        self.head = head(str(device)) if head is not None else None

    @property
    def packing_problem(self) -> str | None:
        return supports_packing(self.model)

    @property
    def precision(self) -> str:
        """The dtype it was loaded in, by name (f32, bf16, f16), as the report and the output folder say it."""
        return DTYPE_NAMES.get(self.model.dtype, str(self.model.dtype).removeprefix("torch."))

    @property
    def precisions(self) -> list[str]:
        return [self.precision]  # one: the loaded dtype

    @property
    def f32(self) -> bool:
        return self.model.dtype == torch.float32

    def use(self, precision: str | None) -> None:
        pass  # one precision: the loaded dtype

    def keep(self, precision: str | None) -> None:
        pass

    def remember(self, rates: dict[str, float], load: dict | None) -> None:
        pass  # nothing of its own to keep them beside; OpenVINO keeps them beside its conversion

    def best_rates(self) -> dict[str, float]:
        return {}  # OpenVINO's conversion keeps them, where it is loaded beside

    def scorer(self) -> TorchScorer:
        """The model as label scoring runs it: a causal LM's log-probabilities of chosen tokens (ScoringBackend)."""
        return TorchScorer(self.model, self.device)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> np.ndarray:
        """The task's output for the batch, [b, ...], float32 on the host."""
        if batch.packed:
            inputs, packing = pack(batch, self.device, first_position(self.config))
            with packed_forward(self.model, packing):
                out = self.read(self.model(**inputs, packing=packing), packing.mask)
        else:
            inputs = {name: torch.from_numpy(v).to(self.device) for name, v in batch.inputs().items()}
            out = self.read(self.model(**inputs), inputs["attention_mask"])
        return out.float().cpu().numpy()

    def read(self, out, mask: torch.Tensor) -> torch.Tensor:
        """The task's output from the model's outputs; mask: [b, L] on the device."""
        if self.head is None:
            return getattr(out, self.output)
        return self.head(out.last_hidden_state, mask)
