"""Text specs: a column name, or a template over columns such as "{title}. {body}". No package imports
but errors' shorten: the job file, prepare and sources all read them."""

from __future__ import annotations

import string

from .errors import shorten


def template_fields(text: str) -> list[str]:
    """Column names a text spec reads: the column itself, or each {field} of a template."""
    if "{" not in text and "}" not in text:
        return [text]
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(
            f"template {shorten(text)} does not parse ({exc}); write {{{{ and }}}} for literal braces"
        ) from None
    fields = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field or spec or conversion:
            raise ValueError(f"template {shorten(text)}: write each field as {{column}}, without format specs")
        fields.append(field)
    if not fields:
        raise ValueError(f"template {shorten(text)} names no column; write e.g. '{{title}}. {{body}}'")
    return list(dict.fromkeys(fields))


def template_parts(text: str) -> list[tuple[str, str | None]]:
    """A text spec as (literal, field) pairs; a plain column name is [('', name)]."""
    if "{" not in text and "}" not in text:
        return [("", text)]
    return [(literal, field) for literal, field, _, _ in string.Formatter().parse(text)]
