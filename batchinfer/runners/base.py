"""The runner contract, and what every encoder task shares: batch tokenization, padded or packed
forward passes, split-and-retry, the probe.

A runner turns texts into items (token ids: one per row, or several, as zero-shot makes one per
candidate label), runs batches of items, and turns each row's item results into result columns
(Arrow arrays of any type). Batching, out-of-memory splitting, packing, the probe and the error
accounting work on items, so every task gets them without code of its own.
"""

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
    ids: list[list[int]]  # per item; a Pair for (text, text_pair) items
    lengths: np.ndarray  # [items] int64, special tokens included
    truncated: np.ndarray  # [items] bool
    owner: np.ndarray | None = None  # [items] the text each item belongs to; None: item i is text i
    encodings: list | None = None  # the tokenizer's encodings, for runners that read offsets

    def owners(self) -> np.ndarray:
        return self.owner if self.owner is not None else np.arange(len(self.ids))


class Pair(list):
    """The token ids of a (text, text_pair) item, with its token type ids; len() counts its tokens."""

    def __init__(self, ids: list[int], type_ids: list[int]):
        super().__init__(ids)
        self.type_ids = type_ids


class EncoderRunner:
    """Subclasses define `head(inputs, mask)` (the model's output for a batch, one entry per item) and
    `columns(results, texts, loaded)` (result columns from each row's item results, [rows][items]).

    `packed` (set per batch) runs a batch as one unpadded sequence; see packing.py."""

    packed = False

    @classmethod
    def load(cls, job, model_path):
        """The runner for `job`, with its model loaded from `model_path`."""
        from ..models import load_model

        tokenizer, model, device = load_model(job.model, model_path)
        return cls(tokenizer, model, device, job, model_path)

    def __init__(self, tokenizer, model, device: torch.device, job, model_path=None):
        self.model = model
        self.device = device
        self.max_length = min(job.model.max_length, _position_limit(model.config))
        # The Rust tokenizer, truncating but never padding: padding happens per batch, after sorting.
        self.tokenizer = copy.deepcopy(tokenizer.backend_tokenizer)
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.no_padding()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def tokenize(self, texts: list) -> Tokens:
        return tokens_of(encode_capped(self.tokenizer, texts, self.max_length))

    @torch.inference_mode()
    def run(self, ids: list[list[int]]) -> list:
        """One batch of items → one result per item, in the same order."""
        if self.packed:
            inputs, packing = pack(ids, self.device, first_position(self.model.config))
            if isinstance(ids[0], Pair):
                inputs["token_type_ids"] = torch.tensor([t for row in ids for t in row.type_ids], device=self.device)[
                    None
                ]
            with packed_forward(self.model, packing):
                return self.head({**inputs, "packing": packing}, packing.mask)
        inputs, mask = self.collate(ids)
        return self.head(inputs, mask)

    def run_chunk(self, loaded, ctx) -> tuple[dict[str, pa.Array], np.ndarray, dict]:
        """A loaded chunk's planned batches of items, each split and retried on failure → (result columns
        of the rows whose every item ran, those rows as positions in the chunk's texts, figures for the
        record). With ctx.probe, a probe first settles `batching: auto` on slices of this chunk; the
        record carries its choice."""
        prepared, tokens, index = loaded.prepared, loaded.tokens, loaded.index
        job, budget, rows = ctx.job, ctx.budget, ctx.job.batching.max_rows
        lengths = tokens.lengths[index]
        owners = tokens.owners()[index]
        results: list = [None] * len(index)
        ok = np.ones(len(index), dtype=bool)
        totals = Counter()

        def run(batches: list[np.ndarray], strategy: str) -> float:
            """Run batches of positions in `index`; keep results and errors; return the seconds taken."""
            self.packed = strategy == "packed"
            batches = [b for b in batches if len(b)]
            t0 = time.perf_counter()
            for batch in batches:
                ctx.stop.check()
                outcome = run_resilient(self.run, [tokens.ids[index[i]] for i in batch.tolist()])
                for k, position in enumerate(batch.tolist()):
                    results[position] = outcome.results[k]
                for k, problem in outcome.failed.items():
                    ok[batch[k]] = False
                    prepared.errors.setdefault(int(prepared.rows[owners[batch[k]]]), problem)
                if outcome.oom_tokens and outcome.oom_tokens // 2 < budget.max_tokens:
                    lowered = max(1, outcome.oom_tokens // 2)
                    note = (
                        f"out of memory at {outcome.oom_tokens} padded tokens: "
                        f"max_tokens {budget.max_tokens} -> {lowered}"
                    )
                    budget.max_tokens = lowered
                    budget.lowered.append(note)
                    ctx.log(note + " for the rest of the run")
                ctx.heap.check()
                ctx.on_batch(len(batch), int(lengths[batch].sum()))
            seconds = time.perf_counter() - t0
            # Packed batches compute no padding in linear layers (attention re-pads, see packing.py).
            if batches:
                totals["padded"] += (
                    int(lengths[np.concatenate(batches)].sum())
                    if strategy == "packed"
                    else padding_stats(lengths, batches)[1]
                )
            totals["seconds"] += seconds
            return seconds

        extra = {}
        if ctx.probe and len(index):
            tuning, rest = probe(
                lengths,
                run,
                job.batching.max_tokens,
                job.batching.strategy,
                rows,
                self.device,
                supports_packing(self.model) is None,
            )
            budget.max_tokens, budget.strategy = tuning.max_tokens, tuning.strategy
            extra["tuning"] = {
                "max_tokens": tuning.max_tokens,
                "strategy": tuning.strategy,
                "tokens_per_s": {k: round(v) for k, v in tuning.tokens_per_s.items()},
            }
            ctx.log(tuning.describe())
            run([rest[b] for b in plan(lengths[rest], *budget.key, rows, self.device)], budget.strategy)
        else:  # replanned when a probe or an out-of-memory changed the budget after this chunk was read ahead
            run(
                loaded.batches if loaded.planned == budget.key else plan(lengths, *budget.key, rows, self.device),
                budget.strategy,
            )
        ctx.stop.check()
        failed = set(owners[~ok].tolist())
        items: dict[int, list] = {}
        for position, text in enumerate(owners.tolist()):
            if text not in failed:
                items.setdefault(text, []).append(results[position])
        kept = np.fromiter(items, dtype=np.int64, count=len(items))
        return (
            self.columns(list(items.values()), kept, loaded),
            kept,
            {"model_seconds": round(totals["seconds"], 4), "padded_tokens": totals["padded"], **extra},
        )

    def collate(self, ids: list[list[int]]) -> tuple[dict, torch.Tensor]:
        """Items → padded model inputs (with token type ids for pairs) and the [b, L] attention mask."""
        longest = max(len(row) for row in ids)
        input_ids = np.full((len(ids), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), longest), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        inputs = {"input_ids": torch.from_numpy(input_ids).to(self.device)}
        if isinstance(ids[0], Pair):
            types = np.zeros((len(ids), longest), dtype=np.int64)
            for i, row in enumerate(ids):
                types[i, : len(row)] = row.type_ids
            inputs["token_type_ids"] = torch.from_numpy(types).to(self.device)
        mask = torch.from_numpy(mask).to(self.device)
        return {**inputs, "attention_mask": mask}, mask

    def head(self, inputs: dict, mask: torch.Tensor) -> list:
        """inputs: keyword arguments for the model; mask: [b, L], 1 for real tokens. The model's
        hidden states come back as [b, L, hidden] whether the batch ran padded or packed."""
        raise NotImplementedError

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        """results: each row's item results, for the rows at `texts` (positions in loaded.prepared.texts)."""
        raise NotImplementedError


def tokens_of(encodings: list, owner: np.ndarray | None = None, pairs: bool = False) -> Tokens:
    """Tokens from the Rust tokenizer's encodings."""
    ids = [Pair(e.ids, e.type_ids) for e in encodings] if pairs else [e.ids for e in encodings]
    lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
    truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(ids))
    return Tokens(ids, lengths, truncated, owner, encodings)


def rows_of(results: list[list]) -> np.ndarray:
    """Single-item rows' results stacked: [rows, ...]."""
    return np.stack([items[0] for items in results]) if results else np.zeros((0, 0), dtype=np.float32)


CHARS_PER_TOKEN = 64  # more than any vocabulary's longest token


def encode_capped(tokenizer, texts: list[str], max_length: int, from_end: bool = False, **options) -> list:
    """The tokenizer's truncated encodings of `texts`, without tokenizing what truncation drops anyway.

    A text longer than max_length x CHARS_PER_TOKEN characters is cut to that length first (its end
    kept when `from_end`). When the cut text still overflows max_length tokens, its kept tokens are
    those of the whole text: the cut changes at most the last word, far past them. Otherwise (a text of
    invisible characters, one enormous word) the whole text is tokenized after all. An 8 MB line costs
    milliseconds this way instead of 14 s and 1.8 GB of overflow encodings."""
    limit = max_length * CHARS_PER_TOKEN

    def shorten(text: str) -> str:
        return text[-limit:] if from_end else text[:limit]

    long = [
        i for i, text in enumerate(texts) if max(map(len, text) if isinstance(text, tuple) else [len(text)]) > limit
    ]
    if not long:
        return tokenizer.encode_batch(texts, **options)
    cut = list(texts)
    for i in long:  # a pair: each side
        cut[i] = tuple(map(shorten, texts[i])) if isinstance(texts[i], tuple) else shorten(texts[i])
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
