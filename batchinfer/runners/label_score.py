"""task: classify with model.labels — a causal LM scores every label after every row's prompt, as
lm-evaluation-harness scores a multiple-choice continuation. Prefill only: nothing is decoded.

A row's prompt is its text, through the chat template when the tokenizer has one and model.chat is on (the text
as the user's message after model.system_prompt, the label as the start of the assistant's reply), else as the
tokenizer encodes it.
Each label is tokenized alone, without special tokens, and appended; its score is the sum of its
tokens' log-probabilities (model.label_norm: divided by its token or character count). `label` is the
best, `scores` the softmax of the scores over the labels.

With label_prompt shared (the default) a row is one item: its prompt, then every label's tokens but
its last (whose output predicts nothing, as lm-evaluation-harness leaves it out too), under an
attention mask in which each label sees the prompt and its own earlier tokens only, at positions that
follow the prompt. The prompt is computed once for all its labels, and each label's first token is
predicted by the prompt's last position, which they share: one-token labels cost nothing beyond the
prompt. label_prompt repeated runs one plain sequence per (row, label), the prompt repeated: the
baseline the shared layout is measured against.

The prompts' longest common token prefix in a chunk (the chat template's preamble and the instruction before
the row's text) runs once (prefix.py): items hold only the tokens after it, which is what their lengths and the
token budget count, and every batch runs against its KV cache at the positions after it. Rows whose prompt does
not go past it (or a prefix under MIN_PREFIX_TOKENS) run whole.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..backends.base import ScoringBackend, Targets
from ..backends.models import position_limit
from ..batching.probe import PROBE_SHARE
from ..errors import ConfigError, ModelError
from ..messages import check_user_turn, user_turn
from .base import EncoderRunner, encode_capped, fixed_size_list
from .prefix import common_prefix, split_prompts
from .protocol import Prefix, Tokens


class LabelScoreRunner(EncoderRunner):
    # A causal LM's forward on a CPU runs a few hundred tokens a second (SmolLM2-135M), and the shipped job's first
    # chunk is often a whole --limit trial: its probe is held to a tenth of the chunk.
    probe_share = PROBE_SHARE
    packs = False  # run() pads every batch under its own attention masks: packed would only cut differently

    def __init__(self, tokenizer, backend: ScoringBackend, device, job, model_path=None):
        super().__init__(tokenizer, backend, device, job)
        self.scorer = backend.scorer()  # run() asks it for the labels' log-probabilities, not forward
        self.chat = tokenizer if job.model.chat and getattr(tokenizer, "chat_template", None) else None
        if self.chat is not None:
            check_user_turn(self.chat, job.model.system_prompt)
        self.system = job.model.system_prompt
        self.labels = list(job.model.labels)
        self.score_labels = self.labels
        self.label_ids = [tokenizer.encode(label, add_special_tokens=False) for label in self.labels]
        refuse_empty_labels(self.labels, self.label_ids)
        self.shared = job.model.label_prompt == "shared"
        self.norm = job.model.label_norm
        self.scores = job.output.scores
        self.fed = [ids[:-1] for ids in self.label_ids]  # the tokens that go in: a label's last only comes out
        appended = sum(map(len, self.fed)) if self.shared else max(map(len, self.fed))
        self.room = self.max_length - appended  # prompt tokens an item has room for
        if self.room < 1:
            raise no_room_error(self.max_length, position_limit(backend.config), appended, self.fed, self.shared)
        # Keep the end of an over-long prompt, as task generate does: that is where the question is.
        self.tokenizer.enable_truncation(self.room, direction="left")

    # --- items ---------------------------------------------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> Tokens:
        """One item per row (shared) or per (row, label) (repeated): the prompt's ids after the texts' common
        prefix, then label ids (each label without its last token)."""
        special = self.chat is None  # the chat template writes its own special tokens
        if self.chat is not None:
            texts = [
                self.chat.apply_chat_template(user_turn(text, self.system), add_generation_prompt=True, tokenize=False)
                for text in texts
            ]
        encodings = encode_capped(self.tokenizer, texts, self.room, from_end=True, add_special_tokens=special)
        prompts = [e.ids for e in encodings]
        cut = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        prefix = common_prefix(prompts, cut) if self.scorer.prefix_problem is None else ()
        prompts, after = split_prompts(prompts, prefix)
        starts = [prefix if a else () for a in after.tolist()]
        if self.shared:
            appended = [t for ids in self.fed for t in ids]
            ids, owner = [Scored(p + appended, None, s) for p, s in zip(prompts, starts)], None
        else:
            ids = [Scored(p + fed, k, s) for p, s in zip(prompts, starts) for k, fed in enumerate(self.fed)]
            owner = np.repeat(np.arange(len(prompts)), len(self.labels))
            cut, after = np.repeat(cut, len(self.labels)), np.repeat(after, len(self.labels))
        lengths = np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))
        return Tokens(ids, lengths, cut, owner, prefix=Prefix(len(prefix), after) if prefix else None)

    # --- a batch -------------------------------------------------------------------------------------------------

    def run(self, ids: list[Scored]) -> list:
        """A batch of items → per item, each of its labels' summed log-probability ([labels] or [1]). Items
        after different prefixes (serve batches several requests) run as one pass per prefix."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, item in enumerate(ids):
            groups.setdefault(item.prefix, []).append(i)
        results: list = [None] * len(ids)
        for prefix, positions in groups.items():
            for i, result in zip(positions, self.run_after(prefix, [ids[i] for i in positions])):
                results[i] = result
        return results

    def run_after(self, prefix: tuple[int, ...], ids: list[Scored]) -> list:
        """Items that all follow `prefix` (() for none) → per item, its labels' summed log-probabilities."""
        batch, slot, per_item = self.layout(ids, prefix)
        logprobs = self.scorer.logprobs(batch)  # [n]
        sums = np.zeros(len(ids) * per_item, dtype=np.float64)
        np.add.at(sums, slot, logprobs)
        return list(sums.reshape(len(ids), per_item))

    def layout(self, ids: list[Scored], prefix: tuple[int, ...] = ()) -> tuple[Targets, np.ndarray, int]:
        """A batch that follows `prefix` as the scorer takes it: padded input ids, position ids and [b, L,
        len(prefix) + L] attention masks, and for every label token: the flat position whose logits predict it
        (`at`) and the token (`target`); with the (item, label) each counts for (slot: item x per_item + label)
        and per_item, the labels an item scores."""
        offset = len(prefix)
        rows, longest = len(ids), max(len(row) for row in ids)
        input_ids = np.full((rows, longest), self.pad_id, dtype=np.int64)
        positions = np.zeros((rows, longest), dtype=np.int64)
        mask = np.zeros((rows, longest, offset + longest), dtype=bool)
        mask[:, :, :offset] = True  # every token sees the whole prefix
        own = mask[:, :, offset:]  # [b, L, L]: what the batch's tokens see of each other (a view)
        causal = np.tril(np.ones((longest, longest), dtype=bool))
        own[:] = np.eye(longest, dtype=bool)  # padding attends to itself: no softmax over nothing
        at, target, slot = [], [], []
        per_item = len(self.labels) if self.shared else 1
        for i, row in enumerate(ids):
            n = len(row)
            input_ids[i, :n] = row
            labels = self.label_ids if self.shared else [self.label_ids[row.label]]
            prompt = n - sum(len(label) - 1 for label in labels)
            own[i, :n, :prompt] = causal[:n, :prompt]  # everyone sees the prompt, causally
            positions[i, :prompt] = np.arange(prompt)
            start = prompt
            for k, label in enumerate(labels):
                fed = len(label) - 1
                stop = start + fed
                own[i, start:stop, start:stop] = causal[:fed, :fed]  # a label sees its own past
                positions[i, start:stop] = np.arange(prompt, prompt + fed)
                # token 0 is predicted by the prompt's last position, token j by the label's token j - 1
                at += [i * longest + prompt - 1] + [i * longest + p for p in range(start, stop)]
                target += label
                slot += [i * per_item + k] * len(label)
                start = stop
        batch = Targets(input_ids, positions + offset, mask, np.array(at, np.int64), np.array(target, np.int64), prefix)
        return batch, np.array(slot, dtype=np.int64), per_item

    # --- result columns ------------------------------------------------------------------------------------------

    def columns(self, results: list[list], texts: np.ndarray, loaded) -> dict[str, pa.Array]:
        width = len(self.labels)
        sums = np.array(results, dtype=np.float64).reshape(len(results), width)  # [rows, labels]
        if self.norm == "tokens":
            sums = sums / np.array([len(ids) for ids in self.label_ids])
        elif self.norm == "chars":
            sums = sums / np.array([len(label) for label in self.labels])
        shifted = np.exp(sums - sums.max(axis=1, keepdims=True)) if len(sums) else sums
        probs = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        best = probs.argmax(axis=1).astype(np.int32) if len(sums) else np.zeros(0, dtype=np.int32)
        columns = {
            "label": pa.array([self.labels[i] for i in best.tolist()], pa.string()),
            "label_id": pa.array(best, pa.int32()),
            "score": pa.array(probs.max(axis=1) if len(sums) else [], pa.float32()),
        }
        if self.scores:
            columns["scores"] = fixed_size_list(probs.reshape(len(sums), width))
        return columns


class Scored(list):
    """An item's token ids after its prefix, which label it ends with (label_prompt repeated; None: every
    label, shared), and the prefix it runs after (() for none)."""

    def __init__(self, ids: list[int], label: int | None, prefix: tuple[int, ...] = ()):
        super().__init__(ids)
        self.label, self.prefix = label, prefix


def refuse_empty_labels(labels: list[str], label_ids: list[list[int]]) -> None:
    """A label of no tokens (a soft hyphen, a zero-width space: text that str.strip keeps) has no score."""
    empty = [f"{k} ({label!r})" for k, (label, ids) in enumerate(zip(labels, label_ids)) if not ids]
    if empty:
        raise ConfigError(
            f"model.labels: label {', '.join(empty)} is no token at all to this model's tokenizer (invisible "
            "characters only), so it cannot be scored",
            "remove it from model.labels, or write the label as the text that should follow the prompt",
        )


def no_room_error(max_length: int, limit: int, appended: int, fed: list[list[int]], shared: bool) -> ModelError:
    """The labels' `appended` tokens leave no prompt token within max_length: the fix that can work, never a
    max_length past the model's own `limit`."""
    problem = f"model.max_length {max_length} leaves no room for a prompt beside the labels' {appended} tokens"
    if appended < limit:
        return ModelError(
            problem, f"raise model.max_length above {appended} (this model reads up to {limit}), or use shorter labels"
        )
    longest = max(map(len, fed))
    repeated = (
        f", or model.label_prompt: repeated (one sequence per label: {longest} label tokens beside the prompt)"
        if shared and longest < limit
        else ""
    )
    return ModelError(
        f"{problem}, and the model reads at most {limit} tokens",
        f"use fewer or shorter labels{repeated}",
    )
