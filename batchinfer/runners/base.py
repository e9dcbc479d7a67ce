"""What classify and embed share: fast batch tokenization and padded forward passes of an encoder."""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from ..batching import padding_stats
from ..packing import first_position, pack, packed_forward, supports_packing
from ..recovery import run_resilient
from ..tune import plan, probe


@dataclass
class Tokens:
    ids: list[list[int]]
    lengths: np.ndarray  # [n] int64, special tokens included
    truncated: np.ndarray  # [n] bool


class EncoderRunner:
    """Subclasses define `head(inputs, mask) -> [b, width]` and `columns(results)`.

    `packed` (set by the engine) runs batches as one unpadded sequence; see packing.py."""

    packed = False

    def __init__(self, tokenizer, model, device: torch.device, max_length: int):
        self.model = model
        self.device = device
        self.max_length = min(max_length, _position_limit(model.config))
        # The Rust tokenizer, truncating but never padding: padding happens per batch, after sorting.
        self.tokenizer = copy.deepcopy(tokenizer.backend_tokenizer)
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.no_padding()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def tokenize(self, texts: list[str]) -> Tokens:
        encodings = encode_capped(self.tokenizer, texts, self.max_length)
        ids = [e.ids for e in encodings]
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(ids))
        return Tokens(ids, lengths, truncated)

    @torch.inference_mode()
    def run(self, ids: list[list[int]]) -> np.ndarray:
        """One batch → [b, width] float32 results in the same row order."""
        if self.packed:
            inputs, packing = pack(ids, self.device, first_position(self.model.config))
            with packed_forward(self.model, packing):
                return self.head({**inputs, "packing": packing}, packing.mask).float().cpu().numpy()
        input_ids, mask = self.collate(ids)
        return self.head({"input_ids": input_ids, "attention_mask": mask}, mask).float().cpu().numpy()

    def run_chunk(self, loaded, ctx) -> tuple[dict[str, pa.Array], np.ndarray, dict]:
        """A loaded chunk's planned batches, each split and retried on failure → (result columns of the
        rows that ran, which of loaded.index ran [n] bool, figures for the record). With ctx.probe, a
        probe first settles `batching: auto` on slices of this chunk; the record carries its choice."""
        prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
        job, budget, rows = ctx.job, ctx.budget, ctx.job.batching.max_rows
        lengths = tokens.lengths[index]
        results = np.empty((len(index), self.width), dtype=np.float32)
        ok = np.ones(len(index), dtype=bool)
        totals = Counter()

        def run(batches: list[np.ndarray], strategy: str) -> float:
            """Run batches of positions in `index`; keep results and errors; return the seconds taken."""
            self.packed = strategy == "packed"
            batches = [b for b in batches if len(b)]
            t0 = time.perf_counter()
            for batch in batches:
                ctx.stop.check()
                outcome = run_resilient(self.run, [tokens.ids[index[i]] for i in batch.tolist()], self.width)
                results[batch] = outcome.results
                for position, problem in outcome.failed.items():
                    ok[batch[position]] = False
                    prepared.errors[int(prepared.rows[index[batch[position]]])] = problem
                if outcome.oom_tokens and outcome.oom_tokens // 2 < budget.max_tokens:
                    lowered = max(1, outcome.oom_tokens // 2)
                    note = f"out of memory at {outcome.oom_tokens} padded tokens: max_tokens {budget.max_tokens} -> {lowered}"
                    budget.max_tokens = lowered
                    budget.lowered.append(note)
                    ctx.log(note + " for the rest of the run")
                ctx.heap.check()
            seconds = time.perf_counter() - t0
            # Packed batches compute no padding in linear layers (attention re-pads, see packing.py).
            if batches:
                totals["padded"] += (int(lengths[np.concatenate(batches)].sum()) if strategy == "packed"
                                     else padding_stats(lengths, batches)[1])
            totals["seconds"] += seconds
            return seconds

        extra = {}
        if ctx.probe and len(index):
            tuning, rest = probe(lengths, run, job.batching.max_tokens, job.batching.strategy, rows, self.device,
                                 supports_packing(self.model) is None)
            budget.max_tokens, budget.strategy = tuning.max_tokens, tuning.strategy
            extra["tuning"] = {"max_tokens": tuning.max_tokens, "strategy": tuning.strategy,
                               "tokens_per_s": {k: round(v) for k, v in tuning.tokens_per_s.items()}}
            ctx.log(tuning.describe())
            run([rest[b] for b in plan(lengths[rest], *budget.key, rows, self.device)], budget.strategy)
        else:  # replanned when a probe or an out-of-memory changed the budget after this chunk was read ahead
            run(loaded.batches if loaded.planned == budget.key else plan(lengths, *budget.key, rows, self.device),
                budget.strategy)
        ctx.stop.check()
        return self.columns(results[ok]), ok, {"model_seconds": round(totals["seconds"], 4),
                                               "padded_tokens": totals["padded"], **extra}

    def collate(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(row) for row in ids)
        input_ids = np.full((len(ids), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)

    def head(self, inputs: dict, mask: torch.Tensor) -> torch.Tensor:
        """inputs: keyword arguments for the model; mask: [b, L], 1 for real tokens. The model's
        hidden states come back as [b, L, hidden] whether the batch ran padded or packed."""
        raise NotImplementedError

    def columns(self, results: np.ndarray) -> dict[str, pa.Array]:
        raise NotImplementedError


CHARS_PER_TOKEN = 64  # more than any vocabulary's longest token


def encode_capped(tokenizer, texts: list[str], max_length: int, from_end: bool = False, **options) -> list:
    """The tokenizer's truncated encodings of `texts`, without tokenizing what truncation drops anyway.

    A text longer than max_length x CHARS_PER_TOKEN characters is cut to that length first (its end
    kept when `from_end`). When the cut text still overflows max_length tokens, its kept tokens are
    those of the whole text: the cut changes at most the last word, far past them. Otherwise (a text of
    invisible characters, one enormous word) the whole text is tokenized after all. An 8 MB line costs
    milliseconds this way instead of 14 s and 1.8 GB of overflow encodings."""
    limit = max_length * CHARS_PER_TOKEN
    long = [i for i, text in enumerate(texts) if len(text) > limit]
    if not long:
        return tokenizer.encode_batch(texts, **options)
    cut = list(texts)
    for i in long:
        cut[i] = texts[i][-limit:] if from_end else texts[i][:limit]
    encodings = tokenizer.encode_batch(cut, **options)
    whole = [i for i in long if not encodings[i].overflowing]
    for i, encoding in zip(whole, tokenizer.encode_batch([texts[i] for i in whole], **options) if whole else []):
        encodings[i] = encoding
    return encodings


def _position_limit(config) -> int:
    """Longest input the model's position embeddings allow."""
    limit = getattr(config, "max_position_embeddings", None) or 1 << 30
    # RoBERTa-family models offset positions by padding_idx + 1.
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        limit -= 2
    return limit


def fixed_size_list(values: np.ndarray) -> pa.FixedSizeListArray:
    """[n, d] float32 → fixed_size_list<float32>[d] without a per-row loop."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
