"""Text specs: a column name, or a template over columns such as "{title}. {body}"; and model.chat_template,
the Jinja template that formats chat messages. No package imports but errors' (and jinja2, which
transformers brings, to check a chat template): the job file, prepare and sources all read them."""

from __future__ import annotations

import string
from pathlib import Path

from ..errors import ConfigError, shorten


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


def fields_of(specs: list[str]) -> list[str]:
    """The columns that text specs read, each once, in order."""
    return list(dict.fromkeys(c for spec in specs for c in template_fields(spec)))


def bare_columns(specs: list[str]) -> set[str]:
    """The specs that name a column alone, not a template."""
    return {spec for spec in specs if template_fields(spec) == [spec]}


def template_parts(text: str) -> list[tuple[str, str | None]]:
    """A text spec as (literal, field) pairs; a plain column name is [('', name)]."""
    if "{" not in text and "}" not in text:
        return [("", text)]
    return [(literal, field) for literal, field, _, _ in string.Formatter().parse(text)]


def chat_template(spec: str | None) -> str | None:
    """model.chat_template's text: the template given inline (it holds {{ or {%), or the file it names;
    checked to parse, so that a broken one stops the job before it starts, not at each row."""
    if spec is None:
        return None
    text = spec
    if "{{" not in spec and "{%" not in spec:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"model.chat_template: {shorten(spec)} is neither a Jinja template nor a file",
                "give the template inline ({% for m in messages %}...) or the path of a .jinja file",
            )
        text = path.read_text()
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"model.chat_template: the template does not parse (line {exc.lineno}: {exc.message})",
            "fix the Jinja syntax; transformers' chat templates give messages, add_generation_prompt and the "
            "tokenizer's special tokens (bos_token, eos_token)",
        ) from None
    return text


def no_chat_template(where: str) -> tuple[str, str]:
    """(message, fix) for chat messages at `where` and a model that has no chat template to format them."""
    return (
        f"{where}: chat messages need a chat template, and this model's tokenizer has none "
        "(tokenizer.chat_template is not set: a base model)",
        "send the text as a prompt (/v1/completions, or input.text), or set model.chat_template to a Jinja "
        "template (inline or a .jinja file; serve: --set model.chat_template=FILE)",
    )
