"""`openai-batch -o RESULTS.jsonl`: the finished folder's output.jsonl and errors.jsonl copied to where the
user asked, replacing a file there only if batchinfer wrote it (the folder keeps their digests). `place` is how
every command puts a file the user named: whole, and beside (never over) a file it may not replace."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..errors import OutputError
from ..output.formats import EXPORTED, DeclaredFiles
from ..output.status import FolderStatus
from ..storage import TMP, LocalFolder


def results_path(text: str, suffix: str = ".jsonl", note: str = " (errors go next to it)") -> Path:
    """-o as given: a path that ends in a separator names a folder (Path would drop the separator and write a
    file of that name), refused as check_targets refuses a folder that exists. suffix: the file's; note: what
    the message adds to "-o names the results file"."""
    if text.endswith(("/", os.sep)):
        folder = Path(text)
        raise OutputError(
            f"-o {text} ends in {text[-1]}, so it names a folder; -o names the results file{note}",
            f"give a file path, e.g. -o {folder / ('results' + suffix)} or -o {folder}{suffix}",
        )
    return Path(text)


def check_targets(work, targets: list) -> dict[str, str]:
    """Before any work: refuse to overwrite a file that batchinfer did not write there itself. Returns the
    digests of what it wrote at each target (a --restart clears the folder that keeps them)."""
    known = _exported(work)
    for target in targets:
        if target.is_dir():
            raise OutputError(
                f"-o {target} is a folder; -o names the results file (errors go next to it)",
                f"give a file path, e.g. -o {target / 'results.jsonl'}",
            )
        if target.exists() and known.get(str(target.resolve())) != _digest(target):
            raise OutputError(
                f"{target} exists and was not written by batchinfer (or was changed since)",
                "give another -o path, or move the file away",
            )
    return known


def deliver(work, targets: dict, lines: dict[str, int], known: dict[str, str]) -> None:
    """Move the folder's output.jsonl and errors.jsonl to where the user asked ({name: path}), each whole or
    not at all, so no second copy stays in the work folder; a file of no lines is not written (and one an
    earlier run wrote there is removed). Notes what was written, so a rerun may replace it. A file that is at
    a target now and is not one batchinfer wrote (one that appeared during the run) stays as it is: that
    result stays in the work folder, and the error says where. `known`: what check_targets returned."""
    state = FolderStatus.read(work)
    files = DeclaredFiles(state.folder, state.path, state.job)
    kept = []
    for name, target in targets.items():
        key = str(target.resolve())
        if lines.get(name):
            ours = key in known and target.is_file() and known[key] == _digest(target)
            with open(work / name, "rb") as source:
                if not place(target, lambda f, source=source: shutil.copyfileobj(source, f), tmp=TMP, replace=ours):
                    kept.append(
                        f"{target} appeared during the run and is not batchinfer's: it is left as it is, "
                        f"and these results stay in {work / name}"
                    )
                    continue
            known[key] = _digest(target)
        elif key in known:  # none this time: an earlier run's file would tell of failures there are not
            if target.exists() and known[key] == _digest(target):
                target.unlink()
            known.pop(key)
        files.write(EXPORTED, lambda f: f.write(json.dumps(known, indent=2).encode()))
        state.folder.delete(name)  # delivered: the results live at -o only
    if kept:
        raise OutputError(
            "; ".join(kept),
            "move the results from the work folder yourself, or move the other file away and rerun the same "
            "command (it resumes, runs nothing again, and delivers)",
        )


def place(target: Path, fill, *, tmp: str, replace: bool = False) -> bool:
    """Write `target` whole from fill(binary file). Without `replace`, only where no file is: the finished
    temporary file is linked to its name, which fails if anything is there, so a file that appeared since
    any check is never replaced; False then."""
    folder = LocalFolder(str(target.parent.resolve()))
    if replace:
        folder.write_with(target.name, fill, tmp=tmp)
        return True
    return folder.create_with(target.name, fill, tmp=tmp)


def _exported(work) -> dict:
    try:
        return json.loads((work / EXPORTED).read_text())
    except (OSError, ValueError):
        return {}


def _digest(path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
