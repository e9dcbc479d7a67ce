"""What counts as something to read: blank texts and well-formed chat messages. No package imports: the
readers, prepare and the OpenAI request mapping all check rows with these."""

from __future__ import annotations

import unicodedata

from .errors import ConfigError
from .reasons import Reason

# Nothing a model could read: whitespace, separators, control and format characters (zero-width
# spaces and joiners, byte-order marks) only.
BLANK = r"^[\s\p{Z}\p{Cc}\p{Cf}]*$"


def is_blank(text: str) -> bool:
    """BLANK for one Python string."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Zs", "Zl", "Zp", "Cc", "Cf") for ch in text)


def message_problem(messages, where: str) -> tuple[str, str] | None:
    """Why `messages` (at `where`) is no chat a template can read, naming the message and the key; None if it is."""
    if messages is None:
        return (Reason.NULL_TEXT, f"{where} is null")
    if not isinstance(messages, list):
        return (Reason.NOT_TEXT, f"{where} must be a list of {{role, content}} messages, not {_kind(messages)}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return (Reason.NOT_TEXT, f"{where}[{i}]: must be a {{role, content}} message, not {_kind(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                what = "is missing" if message.get(key) is None else f"must be text, not {_kind(message[key])}"
                return (Reason.NOT_TEXT, f"{where}[{i}].{key}: {what}")
    if not messages:
        return (Reason.EMPTY_TEXT, f"{where} holds no message")
    if all(is_blank(message["content"]) for message in messages):  # as a blank text is: the template's words alone
        return (Reason.EMPTY_TEXT, f"{where}: every message's content is empty, or only whitespace, invisible or "
                "control characters")  # fmt: skip
    return None


def _kind(value) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def user_turn(text: str, system: str | None = None) -> list[dict]:
    """A row's text as the user's message of a chat (model.chat), after the job's system message where it has one."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]


def check_user_turn(tokenizer, system: str | None) -> None:
    """A job whose texts become the user's turn of a chat (model.chat on input.text, label scoring too) stops at
    once where the chat template refuses that chat, as it would for every row: Gemma's raises on a system
    message, a broken model.chat_template on anything. `tokenizer`: transformers' own, which holds the
    template."""
    _, refused = render_chat(tokenizer, user_turn("x", system))
    if refused:
        said = f"the model's chat template refuses {'a system message then ' if system is not None else ''}a user's"
        raise ConfigError(
            f"{said} message, as every row would be: {refused}",
            "remove model.system_prompt (write the instruction into input.text), or give model.chat_template a "
            "template that takes it"
            if system is not None
            else "fix model.chat_template, or set model.chat: false to send each text as written",
        ) from None


def render_chat(tokenizer, messages: list) -> tuple[str, str | None]:
    """`messages` through the chat template `tokenizer` (transformers') holds, and None; or "" and what the
    template raised: a template may raise on a row (Mistral's and Llama 2's on roles out of turn, Gemma's on a
    system message)."""
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), None
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateError from raise_exception, or the template's bug
        return "", f"{type(exc).__name__}: {exc}"
