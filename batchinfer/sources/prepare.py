"""Arrow rows → the texts to run, with every row that has no usable text named and explained.

Vectorised with pyarrow.compute: no Python loop over rows on the hot path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..job.templates import template_parts
from ..messages import BLANK, is_blank, message_problem
from ..openai_compat.batch_files import TASK_OF_URL
from ..openai_compat.fields import read_messages
from ..reasons import Reason


@dataclass
class Prepared:
    texts: list  # usable rows only, in input order: strings, (text, text_pair) tuples, or chat messages
    rows: np.ndarray  # [len(texts)] offsets of those rows in the block
    errors: dict[int, tuple[str, str]]  # offset -> (reason, message) for every other row


def prepare_rows(job, table: pa.Table, bad_rows: dict[int, tuple[str, str]]) -> Prepared:
    """A block of rows as the job reads them: requests of an OpenAI batch file, chat messages, or texts."""
    if job.input.format == "openai":
        return prepare_openai(table, job.model.task, bad_rows)
    if job.input.messages:
        return prepare_messages(table, job.input.messages, bad_rows)
    return prepare_texts(table, job.input.text, bad_rows, job.input.text_pair)


def prepare_texts(
    table: pa.Table, text_spec: str, bad_rows: dict[int, tuple[str, str]], pair_spec: str | None = None
) -> Prepared:
    """Each row's text (a column or a template over columns); with `pair_spec`, (text, text_pair)
    tuples, a row missing either side being an error row."""
    errors = dict(bad_rows)
    sides = [
        _render(table, spec, errors, name)
        for spec, name in ((text_spec, "text"), (pair_spec, "text_pair"))
        if spec is not None
    ]
    usable = np.ones(table.num_rows, dtype=bool)
    usable[list(errors)] = False
    rows = np.flatnonzero(usable)
    take = pa.array(rows)
    values = [side.take(take).to_pylist() if len(rows) else [] for side in sides]
    return Prepared(values[0] if len(values) == 1 else list(zip(*values)), rows, errors)


def _render(table: pa.Table, spec: str, errors: dict[int, tuple[str, str]], name: str) -> pa.Array:
    """One text per row from a column or template; rows without a usable one are marked in `errors`."""
    parts = template_parts(spec)
    pieces, fields_blank = [], None
    for literal, field in parts:
        if literal:
            pieces.append(literal)
        if field is None:
            continue
        raw = table.column(field).combine_chunks()
        column = _as_text(raw, templated=spec != field)
        if column is None:
            scalar = spec == field and _as_text(raw, templated=True) is not None
            hint = " (a template such as '{" + field + "}' writes it as text)" if scalar else ""
            _mark(errors, np.arange(table.num_rows), Reason.NOT_TEXT, f"column '{field}' is {raw.type}, not text{hint}")
            column = pa.nulls(table.num_rows, pa.string())
        null = column.is_null().to_numpy(zero_copy_only=False)
        _mark(errors, np.flatnonzero(null), Reason.NULL_TEXT, f"column '{field}' is null")
        pieces.append(column)
        blank = pc.match_substring_regex(column, BLANK).fill_null(False)
        fields_blank = blank if fields_blank is None else pc.and_(fields_blank, blank)
    text = pieces[0] if len(parts) == 1 and not parts[0][0] else pc.binary_join_element_wise(*pieces, "")
    blank = pc.match_substring_regex(text, BLANK).fill_null(False)
    what = "text" if name == "text" else f"input.{name}"
    _mark(
        errors,
        np.flatnonzero(blank.to_numpy(zero_copy_only=False)),
        Reason.EMPTY_TEXT,
        f"{what} is empty, or only whitespace, invisible or control characters",
    )
    if fields_blank is not None and len(pieces) > 1:  # a template's words around fields that hold nothing
        fields = ", ".join(f"'{field}'" for _, field in parts if field is not None)
        _mark(
            errors,
            np.flatnonzero(fields_blank.to_numpy(zero_copy_only=False)),
            Reason.EMPTY_TEXT,
            f"{what}: the template's columns ({fields}) are empty, or only whitespace, invisible or control "
            "characters: the model would read the template's own words alone",
        )
    return text


def row_limits(values: list, name: str) -> tuple[list[int | None], dict[int, tuple[str, str]]]:
    """Per-row max_new_tokens values → (each a whole number, or None for the job's default; the rows whose
    value is not a whole number of at least 1, as error rows). "12", "12.0" and 12.0 are 12, and an empty or blank
    text is the default, as a null (a CSV's empty field): a column that mixes
    kinds is text for the whole job, and must not lose every row's value for it."""
    limits: list[int | None] = []
    problems = {}
    for offset, value in enumerate(values):
        number = value
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,18}(\.0*)?\s*", value):  # not "²", not 10**4300
            number = int(value.strip().split(".")[0])
        elif isinstance(value, str) and is_blank(value):  # an empty CSV field: the job's default, as a null
            number = value = None
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        if value is None or (isinstance(number, int) and not isinstance(number, bool) and number >= 1):
            limits.append(number)
            continue
        limits.append(None)
        problems[offset] = (
            Reason.BAD_MAX_NEW_TOKENS,
            f"{name} is {value!r}: give a whole number of at least 1, or leave it empty for the job's default",
        )
    return limits, problems


def _as_text(column: pa.Array, templated: bool) -> pa.Array | None:
    """A column as strings: text in any Arrow encoding (large, view, dictionary as pandas categoricals
    write it); inside a template also numbers, booleans and dates, written as Arrow formats them. None
    when it holds something else (lists, structs, bytes, or a lone non-text column named as the text)."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    view = getattr(pa.types, "is_string_view", lambda _: False)(kind)  # pyarrow 16 and later
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or view
    scalar = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    # dates and times read as text; durations and intervals cast to bare numbers or not at all
    scalar = scalar or pa.types.is_decimal(kind) or pa.types.is_timestamp(kind) or pa.types.is_date(kind)
    scalar = scalar or pa.types.is_time(kind)
    if text or pa.types.is_null(kind) or (templated and scalar):
        return column.cast(pa.string())
    return None


def _mark(errors: dict[int, tuple[str, str]], offsets: np.ndarray, reason: str, message: str) -> None:
    """Record a reason for rows that have none yet: the first problem found is the one reported."""
    for offset in offsets.tolist():
        errors.setdefault(offset, (reason, message))


def prepare_messages(table: pa.Table, column: str, bad_rows: dict[int, tuple[str, str]]) -> Prepared:
    """Chat rows: a list of {role, content} dicts each (read_messages). Anything else is named and set aside."""
    errors = dict(bad_rows)
    values = table.column(column).to_pylist()
    for offset, messages in enumerate(values):
        if offset in errors:
            continue
        values[offset], problem = read_messages(messages, f"column '{column}'")
        if problem:
            errors[offset] = problem
    return _usable(values, errors)


def prepare_openai(table: pa.Table, task: str, bad_rows: dict[int, tuple[str, str]]) -> Prepared:
    """OpenAI request rows: chat messages, a prompt, or a list of texts (embeddings) each, for an endpoint
    that matches the job's task."""
    errors = dict(bad_rows)
    values = []
    for offset, (url, messages, prompt, prompts) in enumerate(
        zip(*(table.column(c).to_pylist() for c in ("url", "messages", "prompt", "prompts")))
    ):
        value = messages if url == "/v1/chat/completions" else prompt if prompts is None else prompts
        values.append(value)
        if offset in errors:
            continue
        if TASK_OF_URL.get(url) != task:
            errors[offset] = (
                Reason.BAD_REQUEST,
                f"url {url} needs model.task: {TASK_OF_URL.get(url)}, and this job is {task}",
            )
        elif url == "/v1/chat/completions":
            if problem := message_problem(messages, "body.messages"):
                errors[offset] = problem
        elif prompts is not None:
            if blank := [i for i, text in enumerate(prompts) if is_blank(text)]:
                field = "body.input" if url == "/v1/embeddings" else "body.prompt"
                message = f"{field}[{blank[0]}] is empty, or only whitespace, invisible or control characters"
                errors[offset] = (Reason.EMPTY_TEXT, message)
        elif prompt is None:
            errors[offset] = (Reason.NULL_TEXT, "body.prompt (body.input for embeddings) is missing")
        elif is_blank(prompt):
            errors[offset] = (
                Reason.EMPTY_TEXT,
                "the prompt is empty, or only whitespace, invisible or control characters",
            )
    return _usable(values, errors)


def _usable(values: list, errors: dict[int, tuple[str, str]]) -> Prepared:
    rows = np.array([o for o in range(len(values)) if o not in errors], dtype=np.int64)
    return Prepared([values[o] for o in rows.tolist()], rows, errors)
