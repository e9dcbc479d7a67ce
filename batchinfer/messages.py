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
    if messages is None:
        return (Reason.NULL_TEXT, f"{where} is null")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        return (Reason.NOT_TEXT, f"{where} must be a list of {{role, content}} messages with text content")
    if not messages:
        return (Reason.EMPTY_TEXT, f"{where} holds no message")
    return None


def user_turn(text: str, system: str | None = None) -> list[dict]:
    """A row's text as the user's message of a chat (model.chat), after the job's system message where it has one."""
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]
