"""What counts as something to read: blank texts and well-formed chat messages. No package imports: the
readers, prepare and the OpenAI request mapping all check rows with these."""

from __future__ import annotations

import unicodedata

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


def read_messages(messages, where: str) -> tuple[object, tuple[str, str] | None]:
    """A job's chat row (at `where`) as the template reads it, each content given as OpenAI's text parts joined as
    an OpenAI request's are (openai_compat.fields.chat_messages), and why it is no chat (message_problem), or None.
    Parts were not_text here, and taken in a batch file's request."""
    from .openai_compat.fields import chat_messages

    read, problem = chat_messages(messages, where, request=False)
    return read, problem or message_problem(read, where)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def user_turn(text: str, system: str | None = None) -> list[dict]:
    """A row's text as the user's message of a chat (model.chat), after the job's system message where it has one."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]
