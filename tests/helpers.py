"""Helpers the tests share (the fixtures are in conftest.py)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import torch

from batchinfer.control import Quiet
from batchinfer.job.config import validate_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The output layer's settle waits, a second each in a real run: between taking over a dead run's lock, or
# creating an object on a store, and reading it back, so that of two runs racing there one alone goes on.
# No test races two runs, so none waits: conftest sets them to 0 in this process, BATCHINFER in the runs
# the tests start. {module: attribute}
SETTLE_WAITS = {"batchinfer.output.lock": "TAKEOVER_SETTLE", "batchinfer.storage": "ObjectFolder.SETTLE"}
# The command line as users call it (python -m batchinfer runs the same app), its settle waits at 0
BATCHINFER = [
    sys.executable,
    "-c",
    "".join(f"import {module}; {module}.{name} = 0.0; " for module, name in SETTLE_WAITS.items())
    + "from batchinfer.cli import app; app(prog_name='batchinfer')",
]


class Crash(BaseException):  # not an Exception: nothing may catch it, as nothing catches a kill
    pass


class CrashAfterChunks(Quiet):
    """A progress display that dies once `chunks` chunks are committed, as a killed process would."""

    def __init__(self, chunks: int):
        self.left = chunks

    def start(self, total_rows, done_rows):
        pass

    def advance(self, rows, tokens):  # called once a chunk is committed
        self.left -= 1
        if self.left == 0:
            raise Crash()

    def log(self, message):
        pass


@dataclass
class Stopped:
    """How a process that run_until signalled ended."""

    returncode: int
    output: str  # its stdout and stderr, interleaved
    alive: list[bool]  # for each signal: whether the process still ran when it was sent
    seconds: float  # from the last signal to the exit


def run_until(
    command: list[str],
    when: Callable[[subprocess.Popen], bool],
    signals: int | tuple[int, ...] = signal.SIGKILL,
    *,
    delay: float = 0.0,
    apart: float = 0.5,
    timeout: float = 120,
) -> Stopped:
    """Start `command`, poll `when(process)` until it holds (or the process ends, or `timeout` passes), wait
    `delay` seconds, send `signals` (one, or several `apart` seconds apart), and wait for the exit."""
    signals = (signals,) if isinstance(signals, int) else signals
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty process never blocks on it
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None and not when(proc):
                time.sleep(0.01)
            time.sleep(delay)
            alive = []
            for k, signum in enumerate(signals):
                if k:
                    time.sleep(apart)
                alive.append(proc.poll() is None)
                proc.send_signal(signum)
                sent = time.perf_counter()
            proc.wait(timeout)
            seconds = time.perf_counter() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        return Stopped(proc.returncode, log.read(), alive, seconds)


def done_chunks(out: Path) -> int:
    """Chunks (and retry passes) an output folder has committed: its completion markers."""
    return len(list((out / "_done").glob("*.json"))) if (out / "_done").exists() else 0


def job_record(out: Path) -> dict:
    """The output folder's job record: id, fingerprint, batching chosen by a probe."""
    return json.loads((out / "_batchinfer.json").read_text())


def leftover_tmp(out: Path, name: str) -> Path:
    """Where a kill in the middle of writing `name` leaves its temporary file."""
    return out / f".tmp-{job_record(out)['job_id'][:12]}-{name}"


def write_job(tmp_path: Path, job: dict | None = None, **sections) -> Path:
    """A job file from a job's sections (make_job(..., raw=True), or nested dicts); returns its path."""
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**(job or {}), **sections}))
    return path


def make_job(data, model_path, out, task="embed", *, raw=False, **overrides):
    """The job every test starts from: `data` with the sms fixtures' columns, run by `model_path` into `out`, on
    the torch kernels with batching pinned. A test states only where its job differs:

        make_job(data, model, out, "classify", model__max_length=64, batching={"max_rows": 4}, input__keep=None)

    `section__key=value` sets one key, `section={...}` merges keys into a section, and None removes a key
    (or, for `section=None`, the whole section), in the order given. Returns the validated JobConfig, or
    with raw=True the sections as dicts (to edit, or to write as a file with write_job). A test file whose
    jobs share differences fixes them with functools.partial, in section__key form only: a key given again
    in the call wins, as a partial's keyword does, and merges into the section."""
    sections = {
        "input": {"path": str(data), "text": "text", "id": "sms_id", "keep": {"label": "gold"}},
        # The torch kernels, pinned like batching: these tests compare against torch peers (pipelines,
        # sentence-transformers) to 1e-5; test_backends.py holds OpenVINO to torch.
        "model": {"path": str(model_path), "task": task, "max_length": 128, "backend": "torch"},
        # Pinned, not auto: tests that compare two output folders bit for bit need both cut the same way.
        "batching": {"chunk_rows": 100, "max_tokens": 16384, "strategy": "padded"},
        "output": {"path": str(out)},
    }
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        if name:
            value = {name: value}
        if value is None:
            sections.pop(section, None)
            continue
        merged = {k: v for k, v in {**sections.get(section, {}), **value}.items() if v is not None}
        if merged or section in sections:
            sections[section] = merged
    return sections if raw else validate_job(sections)


# A job as a user writes it (backend and batching auto) with max_length 64 and chunks of 100, as sections
# for write_job: what the command-line tests run.
user_job = functools.partial(
    make_job,
    raw=True,
    input__keep=None,
    model__max_length=64,
    model__backend=None,
    batching__max_tokens=None,
    batching__strategy=None,
)


def read_output(out):
    return ds.dataset(str(out), format="parquet").to_table()


def vectors(table, column):
    return np.array(table.column(column).to_pylist(), dtype=np.float32)


def prompt_table(sms_table, n=24):
    texts = sms_table.column("text").to_pylist()[:n]
    return pa.table(
        {
            "id": [f"p{i}" for i in range(n)],
            "text": texts,
            "budget": [4 + (i * 7) % 20 if i % 3 else None for i in range(n)],
        }
    )


@functools.cache
def _causal_model(model_path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path).eval()


@functools.cache
def _generate_alone(model_path: str, prompt_ids: tuple[int, ...], max_new: int) -> tuple[int, ...]:
    model = _causal_model(model_path)
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
    )
    tokens = out[0, len(prompt_ids) :].tolist()
    eos = model.generation_config.eos_token_id
    return tuple(tokens[: tokens.index(eos)] if eos in tokens else tokens)


def generate_alone(model_path, prompt_ids: list[int], max_new: int) -> list[int]:
    """What transformers' own generate gives for one prompt, greedily, cut at its end of sequence. The model
    is loaded once per session and each answer computed once (greedy decoding of a model nobody trains is
    a pure function of the prompt and the limit)."""
    return list(_generate_alone(str(model_path), tuple(prompt_ids), max_new))


def check_readme_section(name: str, generated: str) -> None:
    """The README between <!-- NAME:start --> and <!-- NAME:end --> is `generated`; with
    BATCHINFER_UPDATE_README=1 it is rewritten to it first."""
    path = Path(__file__).resolve().parent.parent / "README.md"
    readme = path.read_text()
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    current = readme[readme.index(start) + len(start) : readme.index(end)]
    if os.environ.get("BATCHINFER_UPDATE_README"):
        path.write_text(readme.replace(current, generated + "\n"))
        current = generated + "\n"
    assert current == generated + "\n", f"README {name} section is stale: rerun with BATCHINFER_UPDATE_README=1"
