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
    try:  # in the schema's own order: properties are generated in it (a reasoning before its answer)
        spec = json.dumps(schema, ensure_ascii=False)
    except RecursionError:
        return None, f"{where}.json_schema.schema nests too deep to read; flatten it"
    return Constraint("json_schema", spec, f"{where}"), None


@dataclass(frozen=True)
class GrammarLimits:
    """How large a constraint may be (generation.grammar_*): xgrammar's compile time and memory grow fast
    with a schema's depth and with the strings it chooses between, and a compile cannot be stopped."""

    seconds: float  # the longest one compile may take
    bytes: int  # the constraint's text: the schema or choices as JSON, the regex
    depth: int  # a schema's nesting, as JSON objects and lists
    choices: int  # values to choose between: choices, or a schema's enum values together

    def problem(self, constraint: Constraint) -> str | None:
        """Why `constraint` is past these limits (naming the setting to raise), or None."""
        size = len(constraint.spec.encode())
        if size > self.bytes:
            return f"{size:,} bytes, past generation.grammar_max_bytes ({self.bytes:,})"
        if constraint.kind == "choices":
            depth, count = 1, len(json.loads(constraint.spec))
        elif constraint.kind == "json_schema":
            depth, count = _depth_and_enums(json.loads(constraint.spec))
        else:
            return None
        if depth > self.depth:
            return f"it nests {depth} deep, past generation.grammar_max_depth ({self.depth})"
        if count > self.choices:
            return f"{count:,} values to choose between, past generation.grammar_max_choices ({self.choices:,})"
        return None


def _depth_and_enums(value) -> tuple[int, int]:
    """A JSON value's nesting (objects and lists) and how many enum values it holds, without recursion."""
    deepest, enums, stack = 0, 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            enum = item.get("enum")
            enums += len(enum) if isinstance(enum, list) else 0
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest, enums


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
