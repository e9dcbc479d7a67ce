"""The `batchinfer` command. A Ctrl-C while the CLI is still importing (its libraries take a second or more)
ends the command as a Ctrl-C anywhere else does: exit code 130, no traceback."""

import sys


def main() -> None:
    try:
        from .cli import app
    except KeyboardInterrupt:
        sys.exit(130)
    app(prog_name="batchinfer")
