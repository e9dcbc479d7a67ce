"""Constrained output, as asked: OpenAI's response_format, or the shorthands choices and regex, read
into one Constraint. No package imports: the job file and request lines are checked without xgrammar,
which compiles a Constraint per tokenizer (grammar.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KINDS = ("json_schema", "json_object", "choices", "regex")


@dataclass(frozen=True)
class Constraint:
    kind: str  # one of KINDS
    spec: str  # json_schema: the schema as JSON; choices: the JSON list; regex: the pattern; json_object: ""
    where: str = field(default="", compare=False)  # what asked for it, for messages: generation.regex, ...

    def describe(self) -> str:
        return {
            "json_schema": "JSON that follows the schema",
            "json_object": "a JSON object",
            "choices": f"one of {self.spec}",
            "regex": f"text matching {self.spec!r}",
        }[self.kind]


def response_format(value, where: str) -> tuple[Constraint | None, str | None]:
    """OpenAI's response_format object → (its constraint, None), (None, None) for plain text, or (None,
    what is wrong with it). {"type": "text"}; {"type": "json_object"}; {"type": "json_schema",
    "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        return None, f'{where} must be an object such as {{"type": "json_object"}}, not {type(value).__name__}'
    kind = value.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return Constraint("json_object", "", where), None
    if kind != "json_schema":
        return None, f"{where}.type must be text, json_object or json_schema, not {kind!r}"
    body = value.get("json_schema")
    schema = body.get("schema") if isinstance(body, dict) else None
    if not isinstance(schema, dict):
        return None, f'{where}.json_schema.schema must be a JSON schema object, e.g. {{"type": "object", ...}}'
    return Constraint("json_schema", json.dumps(schema, sort_keys=True, ensure_ascii=False), f"{where}"), None


def choices(values: list[str], where: str) -> Constraint:
    return Constraint("choices", json.dumps(list(values), ensure_ascii=False), where)


def regex(pattern: str, where: str) -> Constraint:
    return Constraint("regex", pattern, where)


def job_constraint(gen) -> Constraint | None:
    """The constraint a job's generation section asks for (at most one of the three keys is set)."""
    if gen.response_format is not None:
        return response_format(gen.response_format, "generation.response_format")[0]
    if gen.choices:
        return choices(gen.choices, "generation.choices")
    if gen.regex is not None:
        return regex(gen.regex, "generation.regex")
    return None
