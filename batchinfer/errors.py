"""Typed errors. Each carries a hint that tells the user what to do; only cli.py prints them."""

from __future__ import annotations

import reprlib


class BatchinferError(Exception):
    """A problem the user can fix. `hint` says how."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __reduce__(self):  # keep the hint when a worker process sends the error back
        return self.__class__, (self.message, self.hint)


class ConfigError(BatchinferError):
    """The job file or a --set override is wrong."""

    exit_code = 2


class InputError(BatchinferError):
    """The input path, a shard or a column is missing or unreadable."""


class ModelError(BatchinferError):
    """The model cannot be found, loaded, or does not fit the task."""


class OutputError(BatchinferError):
    """The output folder is unusable: not writable, locked, or holds another job."""


class ResumeError(OutputError):
    """The output folder holds a run of a different job."""


class Elsewhere(OutputError):
    """The output folder cannot take this job as it is, and the fix begins with writing elsewhere, which each
    command says its own way: `where` is run's; openai-batch, whose -o is a file, says it with at()."""

    def __init__(self, message: str, rest: str, where: str = "a new folder with --output NEW_FOLDER"):
        super().__init__(message, f"write to {where}{rest}")
        self.rest, self.where = rest, where

    def __reduce__(self):
        return self.__class__, (self.message, self.rest, self.where)

    def at(self, where: str) -> Elsewhere:
        return type(self)(self.message, self.rest, where)


class OtherJobError(Elsewhere, ResumeError):
    """The output folder holds results of a job with another input, model or settings."""


def shorten(value, limit: int = 200) -> str:
    """A value for a message, at most `limit` characters. reprlib stops early, so a job file whose
    aliases expand to gigabytes costs nothing to quote."""
    short = reprlib.Repr()
    short.maxlevel, short.maxlist, short.maxdict, short.maxtuple, short.maxset = 3, 8, 8, 8, 8
    short.maxstring = short.maxother = limit
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
