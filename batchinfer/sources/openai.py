"""OpenAI Batch API request files: JSON Lines whose every line is {custom_id, method, url, body}.

Each line becomes one row of REQUEST_COLUMNS; a line that is not a valid request becomes an error
row and never aborts the file. A custom_id seen before (in this file or an earlier one) is an error
row too (reason duplicate_id): only its first request runs, so each custom_id has one response.
"""

from __future__ import annotations

import pyarrow as pa

from ..openai_compat.batch_files import parse_request
from ..reasons import Problem, Reason
from ..storage.lines import Oversized, parse_object, sniff_field
from .jsonl import JsonlFormat
from .shards import ReadSpec

REQUEST_COLUMNS = [  # what this source reads of a request line, in this order
    "custom_id",
    "url",
    "messages",
    "prompt",
    "prompts",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "response_format",
]
REQUEST_TYPES = {
    "custom_id": pa.string(),
    "url": pa.string(),
    "prompt": pa.string(),
    "prompts": pa.list_(pa.string()),
    "max_tokens": pa.int64(),
    "temperature": pa.float64(),
    "top_p": pa.float64(),
    "seed": pa.int64(),
    "stop": pa.list_(pa.string()),
    "response_format": pa.string(),
}  # messages: inferred per block, checked per line


class OpenAIFormat(JsonlFormat):
    suffixes = ()  # only by input.format: openai
    unique_key = "custom_id"

    def typed_columns(self, spec: ReadSpec) -> list[str]:
        return []  # every request column has its type already

    def shown_columns(self, columns: list[str] | None) -> None:
        return None  # lines are checked one by one; a bad one becomes an error line

    def record(
        self, line: bytes | Oversized, spec: ReadSpec, row: int, repeats: dict[int, str], where: str
    ) -> tuple[dict, Problem | None]:
        record, problem = parse_object(line, spec.max_line_bytes)
        if problem:
            custom_id = sniff_field(line, "custom_id")
            custom_id = custom_id if isinstance(custom_id, str) else None
            return {"custom_id": custom_id}, _placed(problem, custom_id, where)
        values, problem = parse_request(record)
        if problem is None and row in repeats:
            problem = (Reason.DUPLICATE_ID, repeats[row])
        custom_id = values.get("custom_id")
        return ({"custom_id": custom_id} if problem else values), _placed(problem, custom_id, where)


def _placed(problem: Problem | None, custom_id: str | None, where: str) -> Problem | None:
    """A failed request without a custom_id is named by its line (blank lines counted, as an editor shows them),
    as find_repeats names the line a custom_id was first used on."""
    return (problem[0], f"{problem[1]} ({where})") if problem and not custom_id else problem


def find_repeats(
    keys_by_shard: list[tuple[str, list[tuple[int, int, str]]]],
) -> dict[str, tuple[tuple[int, str], ...]]:
    """shard name -> (row, message) for every custom_id already used by an earlier line; keys: (row, line
    number, custom_id), the message naming the line (blank lines are no rows, so a row is not its line)."""
    first: dict[str, tuple[str, int]] = {}
    repeats: dict[str, list[tuple[int, str]]] = {}
    for name, keys in keys_by_shard:
        for row, line, key in keys:
            if key in first:
                where, at = first[key]
                repeats.setdefault(name, []).append(
                    (row, f"custom_id {key[:100]!r} repeats line {at} of {where}; only the first request runs")
                )
            else:
                first[key] = (name, line)
    return {name: tuple(found) for name, found in repeats.items()}
