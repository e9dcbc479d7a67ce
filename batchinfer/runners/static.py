"""The static engine: padded `model.generate` batches in input order; the baseline benchmarks compare
continuous batching against."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from ..job.config import GenerationConfig
from .engine import PassOutput, PassRows, Registered, by_seed, cannot_serve, generation_config, passes_by, with_note
from .model_generation import batch_bound


class StaticEngine(Registered):
    name = "static"
    described = {"name": "static"}
    shared_page = None  # static batches share no cache
    pads = True

    @classmethod
    def over(cls, gen, model, device, pad_id: int, eos: set[int], grammars: Callable) -> StaticEngine:
        """generation.engine's engine over a loaded model (engine.ENGINES)."""
        return cls(model, device, pad_id, grammars)

    def __init__(self, model, device: torch.device, pad_id: int, grammars: Callable):
        self.model, self.device, self.pad_id = model, device, pad_id
        self.grammars = grammars  # () -> grammar.Grammars, built on first use
        # rows one at a time where padding or the batch's budget would change what generate makes of the model's
        # own settings (model_generation.BATCH_BOUND)
        self.alone = batch_bound(model.generation_config)
        if self.alone:
            said = ", ".join(self.alone)
            self.note(f"rows run one at a time: in a padded batch generate would apply {said} otherwise")

    def passes(self, settings: list[GenerationConfig], skip=()) -> list[list[int]]:
        return passes_by(settings, by_seed, skip)

    def note(self, note: str) -> None:
        self.described = with_note(self.described, note)

    @torch.inference_mode()
    def run(self, rows: PassRows, max_rows: int, check: Callable[[], None]) -> PassOutput:
        """Batches of max_rows in input order, left-padded; the pass's rows share its settings and seed."""
        gen, prompts, max_new, constraints = rows.settings[0], rows.prompts, rows.max_new, rows.constraints
        raw: list = [None] * len(prompts)
        first = []
        started = time.perf_counter()
        if gen.temperature > 0:
            torch.manual_seed(gen.seed)
        for batch in in_order(len(prompts), 1 if self.alone else max_rows):
            check()
            batch_rows = [prompts[i] for i in batch.tolist()]
            longest = max(len(r) for r in batch_rows)
            input_ids = torch.full((len(batch_rows), longest), self.pad_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for k, row in enumerate(batch_rows):  # left padding: every row's next token lands in the last column
                input_ids[k, longest - len(row) :] = torch.tensor(row)
                mask[k, longest - len(row) :] = 1
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=generation_config(
                    self.model, gen, max(max_new[i] for i in batch.tolist()), self.pad_id
                ),
                logits_processor=self.processors([constraints[i] for i in batch.tolist()]),
            )
            first.extend([time.perf_counter() - started] * len(batch_rows))  # a static batch returns all at once
            for k, i in enumerate(batch.tolist()):
                raw[i] = (out[k, longest:].tolist(), None)
        return PassOutput(raw, first)

    def serve(self, gen, max_rows: int, max_length: int):
        raise cannot_serve(self.name)

    def processors(self, constraints: list):
        """Grammar masks for a batch's rows, or None when none of them is constrained."""
        if all(c is None for c in constraints):
            return None
        from transformers import LogitsProcessorList

        from ..constrained.grammar import StaticMasks

        return LogitsProcessorList([StaticMasks(self.grammars(), constraints)])


def in_order(count: int, rows: int) -> list[np.ndarray]:
    """Positions 0..count-1 in batches of `rows`, in order."""
    return [np.arange(i, min(i + rows, count)) for i in range(0, count, rows)]
