"""Shards → chunks, and the job fingerprint that decides whether a folder's chunks can be reused.

Chunk boundaries depend on the shards' row counts and chunk_rows alone, so a resumed run plans
exactly the chunks the interrupted one did; where an earlier --limit run cut a chunk short, the chunk is
planned in pieces at that cut (its markers say where), so the trial's rows are kept, not run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import shorten
from .config import InputConfig, JobConfig
from .templates import chat_template


@dataclass(frozen=True)
class Chunk:
    shard: int
    index: int
    start: int
    stop: int
    piece: int = 0  # rows into the chunk where this piece of it starts (a chunk an earlier --limit cut short)

    @property
    def name(self) -> str:
        # Zero-padded so that lexical order of part files is input order: a piece's "_" sorts after the ".".
        return f"{self.shard:05d}-{self.index:05d}" + (f"_{self.piece:0{PIECE_DIGITS}d}" if self.piece else "")

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class Work:
    """What one pass through the pipeline processes: a whole chunk, or some of its rows again."""

    chunk: Chunk
    name: str  # the part file's name: the chunk's, or "<chunk>-r<generation>" for a retry
    offsets: list[int] | None = None  # rows of the chunk to run, counted from its start; None: all
    retry_of: str | None = None
    carry: object = None  # a retry: the error rows (a pyarrow Table) it does not run again, kept in its error file

    @property
    def rows(self) -> int:
        return self.chunk.rows if self.offsets is None else len(self.offsets)


def rows_of(items: list[Chunk] | list[Work]) -> int:
    """The rows of chunks, or of pieces of work."""
    return sum(item.rows for item in items)


def planned_rows(chunks: list[Chunk]) -> dict[str, int]:
    """Each chunk's rows by name: a chunk an earlier --limit cut short runs again in full."""
    return {c.name: c.rows for c in chunks}


def retry_name(chunk: str, generation: int) -> str:
    return f"{chunk}-r{generation}"


PIECE_DIGITS = 7  # a piece's offset in its chunk, zero-padded alike so that pieces sort in input order


def plan_chunks(
    row_counts: list[int], chunk_rows: int, limit: int | None = None, cuts: dict[str, set[int]] | None = None
) -> list[Chunk]:
    """Chunks of `chunk_rows` rows, shard by shard, each in pieces at its `cuts` (rows into the chunk, by the
    chunk's name: where earlier --limit runs cut it, cuts_of). With `limit`, only those holding the first
    `limit` rows, the last one cut short; a later run keeps that one's rows and runs the rest as a piece."""
    chunks, left, cuts = [], limit if limit is not None else sum(row_counts), cuts or {}
    for shard, count in enumerate(row_counts):
        for index, start in enumerate(range(0, count, chunk_rows)):
            end = min(start + chunk_rows, count)
            inside = sorted(c for c in cuts.get(f"{shard:05d}-{index:05d}", ()) if 0 < c < end - start)
            for first, last in zip([0, *inside], [*inside, end - start]):
                if left <= 0:
                    return chunks
                stop = min(start + last, start + first + left)
                chunks.append(Chunk(shard, index, start + first, stop, first))
                left -= stop - start - first
    return chunks


def cuts_of(done: dict[str, int]) -> dict[str, set[int]]:
    """Where a folder's finished pieces begin and end inside their chunks, by chunk name (done: each finished
    chunk's or piece's name -> its rows; retry passes left out): the cuts that plan them again as they ran."""
    cuts: dict[str, set[int]] = {}
    for name, rows in done.items():
        chunk, _, piece = name.partition("_")
        first = int(piece or 0)
        cuts.setdefault(chunk, set()).update({first, first + rows} - {0})
    return cuts


# Every model identity (backends.models.model_identity) starts so. One that does not was recorded by an earlier
# batchinfer, which hashed only samples of large weight files: it cannot show that the model is unchanged.
IDENTITY = "sha256:"
DEFAULT_LINE_BYTES = InputConfig.model_fields["max_line_bytes"].default
# Keys that fingerprints of earlier versions held but that cannot change a row's result: where an old folder
# has them, they are not compared. (input.path and model.path: the shards' and the model's digests say it all.)
NOT_RESULTS = frozenset({"input.path", "model.path", "generation.max_memory"})


def fingerprint(
    job: JobConfig, model_id: str, contents: dict[str, str], limit: int | None = None, from_model: list[str] = ()
) -> dict:
    """Everything that changes which rows there are or what a row's result is: the job's settings, the
    model's identity (every byte of its weights), and what every shard holds (`contents`: shard name ->
    "rows:digest", as sources.shard_contents gives it), with chunk_rows, on which the chunks' names depend.
    `from_model`: the sampling settings a job that sets some takes from its model (before 2026-12-07: the job's).

    Left out on purpose, since results do not depend on them (a user must be able to resume with a smaller
    max_tokens or max_memory after running out of memory): where the input and the model lie (their digests
    are here), batching limits and strategy, the device and backend (agreement is checked), the KV cache's
    memory and engine options, the grammar compile time limit, the executor and its workers, the output's
    compression, progress, the cache.
    """
    return {
        "input.shards": dict(contents),
        "input.text": job.input.text,
        "input.text_pair": job.input.text_pair,
        "input.messages": job.input.messages,
        "input.id": job.input.id,
        "input.keep": job.input.kept,
        # which lines are too_long errors; only off its default, so that fingerprints from before still match
        **({"input.max_line_bytes": lines} if (lines := job.input.max_line_bytes) != DEFAULT_LINE_BYTES else {}),
        "model.hash": model_id,
        "model.task": job.model.task,
        **(
            {
                "model.labels": job.model.labels,
                "model.hypothesis_template": job.model.hypothesis_template,
                "model.multi_label": job.model.multi_label,
            }
            if job.model.task == "zero-shot"
            else {}
        ),
        **(
            {"model.labels": job.model.labels, "model.label_norm": job.model.label_norm}
            if job.model.task == "classify" and job.model.labels
            else {}
        ),
        # only when set, so that the fingerprints of jobs from before the key existed still match
        **({"model.chat_template": chat_template(job.model.chat_template)} if job.model.chat_template else {}),
        # generation on input.text: always, since such a job's texts went to the model as written before the key
        # existed (a folder of then is refused, not resumed through the chat template); label scoring: when off
        **(
            {"model.chat": job.model.chat}
            if (job.model.task == "generate" and job.input.text) or not job.model.chat
            else {}
        ),
        **({"model.system_prompt": job.model.system_prompt} if job.model.system_prompt is not None else {}),
        "model.max_length": job.model.max_length,
        "model.truncation": job.model.truncation,
        "model.dtype": job.model.dtype,
        "model.quantize": job.model.quantize,
        "batching.chunk_rows": job.chunk_rows,
        "output.scores": job.output.scores,
        **({"output.aggregation": job.output.aggregation} if job.model.task == "token-classify" else {}),
        **(_generation(job.generation) if job.model.task == "generate" else {}),
        **({SAMPLING_FROM_MODEL: list(from_model)} if from_model else {}),  # only then: fingerprints as before
        "limit": limit,
    }


def _generation(gen) -> dict:
    """A generate job's fingerprint entries of its generation section: constraint keys only when set, so the
    fingerprints of jobs from before they existed still match; not grammar_seconds (how long a compile may take
    on this machine, which no completion depends on)."""
    generation = gen.model_dump(exclude={"engine_options", "max_memory", "grammar_seconds"} | _unset_constraints(gen))
    return {f"generation.{key}": value for key, value in generation.items()} | _schema_order(gen.response_format)


SCHEMA_ORDER = "generation.response_format (its order)"
SAMPLING_FROM_MODEL = "generation (sampling settings the model's generation_config gives)"


def _schema_order(response_format) -> dict:
    """The order of a json_schema's properties (each `properties` mapping's names, in the schema's order), where
    one is not sorted: the grammar generates them in it, which a fingerprint's dicts (compared as dicts) do not
    hold. Before, every schema compiled with sorted keys: a folder of a schema whose properties are given sorted
    (whatever the order of its other keys, "type" before "properties" as usual) resumes."""
    body = response_format.get("json_schema") if isinstance(response_format, dict) else None
    orders, stack = [], [body.get("schema") if isinstance(body, dict) else None]
    while stack:  # without recursion: a schema may nest deep
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                orders.append(list(node["properties"]))
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return {SCHEMA_ORDER: json.dumps(orders)} if any(order != sorted(order) for order in orders) else {}


def _unset_constraints(gen) -> set[str]:
    return {key for key in ("response_format", "choices", "regex") if not getattr(gen, key)}


def describe_changes(old: dict, new: dict) -> dict[str, str]:
    """Each fingerprint key that differs, with what changed, in words a user can act on. `old` may be a
    fingerprint of an earlier version: its `generation` dict is read key by key, and NOT_RESULTS not compared."""
    old, new = _comparable(old), _comparable(new)
    changes = {}
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if key == "input.shards" and isinstance(before, dict) and isinstance(after, dict):
            changes[key] = _shard_changes(before, after)
        elif key == "model.hash" and not str(before).startswith(IDENTITY) and str(after).startswith(IDENTITY):
            changes[key] = (
                "model.hash: recorded by an earlier batchinfer, which hashed only samples of large weight files "
                "and so cannot show that the model is the same"
            )
        elif key == SCHEMA_ORDER:
            changes[key] = "generation.response_format: " + (
                "the schema's keys are in another order, which the output's keys follow"
                if before
                else "this folder's rows have their keys in sorted order, and the schema's are not (batchinfer "
                "before 2026-12-07 sorted them): the output's keys follow the schema's order"
            )
        elif key == SAMPLING_FROM_MODEL and before is None:
            changes[key] = (
                f"generation: this folder's rows were sampled with the job's defaults for {', '.join(after)}, which "
                "the job does not set (batchinfer before 2026-12-07); now they are the model's generation_config's, "
                "as transformers' generate takes them"
            )
        else:
            changes[key] = f"{key}: {shorten(before)} -> {shorten(after)}"
    return changes


def _comparable(found: dict) -> dict:
    flat = {key: value for key, value in found.items() if key != "generation" and key not in NOT_RESULTS}
    if isinstance(found.get("generation"), dict):
        flat.update(
            {f"generation.{k}": v for k, v in found["generation"].items() if f"generation.{k}" not in NOT_RESULTS}
        )
    return flat


def _shard_changes(before: dict[str, str], after: dict[str, str]) -> str:
    def names(found: list[str]) -> str:
        return ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")

    changed = [n for n in after if n in before and before[n] != after[n]]
    added = [n for n in after if n not in before]
    gone = [n for n in before if n not in after]
    parts = [
        f"{names(changed)} changed since this folder's first run" if changed else "",
        f"{names(added)} added" if added else "",
        f"{names(gone)} gone" if gone else "",
    ]
    return "input: " + "; ".join(p for p in parts if p)
