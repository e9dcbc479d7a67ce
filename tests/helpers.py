"""Helpers the tests share (the fixtures are in conftest.py)."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import multiprocessing
import os
import pkgutil
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

from batchinfer.backends.openvino import STAND_IN
from batchinfer.backends.precision import COSINE_FLOOR
from batchinfer.control import Quiet
from batchinfer.job.config import validate_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The output layer's settle waits, a second each in a real run: between taking over a dead run's lock, or
# creating an object on a store, and reading it back, so that of two runs racing there one alone goes on.
# No test races two runs, so none waits: conftest sets them to 0 in this process, _cli_main in the runs
# the tests start. {module: attribute}
SETTLE_WAITS = {"batchinfer.output.lock": "TAKEOVER_SETTLE", "batchinfer.storage": "ObjectFolder.SETTLE"}
# The runs the tests start as processes of their own (to kill, to signal, to see exit codes and output) are
# forked from a server that imported the command line, torch, transformers and the runners once: a new
# interpreter spends about 6 CPU-s on those imports, which was a sixth of the suite. Each run is still a process
# of its own, with its own signals, exit code, file descriptors and pid, running `batchinfer` as users call it
# (cli.app). What a fresh interpreter alone shows (which modules a command imports) is tested with one.
PRELOAD = ["batchinfer.cli", "batchinfer.execution.driver", "batchinfer.runners.embed", "batchinfer.runners.generate"]
# the forkserver skips a module it cannot import without a word: a moved one is named here instead
assert all(importlib.util.find_spec(name) for name in PRELOAD), PRELOAD
PRELOAD.append("helpers")
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(PRELOAD)


def _cli_main(args: list[str], env: dict[str, str], stdout: str, stderr: str, prelude: str) -> None:
    """In the forked process: the test's environment, output to its files unbuffered (as PYTHONUNBUFFERED),
    the settle waits at 0, `prelude` run (a test's patch), then the command line; exit handlers run as at
    the end of an interpreter (multiprocessing's children skip them)."""
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or torch.get_num_threads()))
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(target, fd)
        os.close(target)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True, write_through=True)
    for module, name in SETTLE_WAITS.items():
        owner, _, attribute = name.rpartition(".")
        setattr(pkgutil.resolve_name(f"{module}:{owner}" if owner else module), attribute, 0.0)
    exec(prelude, {})
    from batchinfer.cli import app

    try:
        app(args, prog_name="batchinfer")
    finally:
        atexit._run_exitfuncs()


class Cli:
    """`batchinfer ARGS` running as a forked process, with the face of a subprocess.Popen that run_until and
    the tests use: pid, poll, send_signal, wait, kill, returncode. Its stdout and stderr go to two files. As a
    context manager, as Popen's, except that leaving it kills a run still going (a test that failed midway)."""

    def __init__(self, args: list[str], stdout: str, stderr: str, prelude: str = ""):
        env = dict(os.environ)
        self.process = _FORKS.Process(target=_cli_main, args=([str(a) for a in args], env, stdout, stderr, prelude))
        self.process.start()
        self.pid = self.process.pid

    def __enter__(self) -> Cli:
        return self

    def __exit__(self, *exc) -> None:
        if self.poll() is None:
            self.kill()
            self.wait()

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.process.exitcode is None:
            os.kill(self.pid, signum)

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(["batchinfer"], timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_cli(args: list[str], prelude: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """`batchinfer ARGS` to its end, as subprocess.run(..., capture_output=True, text=True) would give it."""
    with tempfile.NamedTemporaryFile("w+") as out, tempfile.NamedTemporaryFile("w+") as err:
        with Cli(args, out.name, err.name, prelude) as proc:
            proc.wait(timeout)
        return subprocess.CompletedProcess(["batchinfer", *args], proc.returncode, out.read(), err.read())


class Crash(BaseException):  # not an Exception: nothing may catch it, as nothing catches a kill
    pass


class CrashAfterChunks(Quiet):
    """A progress display that dies once `chunks` chunks are committed, as a killed process would."""

    def __init__(self, chunks: int):
        self.left = chunks

    def start(self, total_rows, done_rows, since):
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
    args: list[str],
    when: Callable[[Cli], bool],
    signals: int | tuple[int, ...] = signal.SIGKILL,
    *,
    prelude: str = "",
    delay: float = 0.0,
    apart: float = 0.5,
    timeout: float = 120,
) -> Stopped:
    """Start `batchinfer ARGS` (after `prelude`), poll `when(process)` until it holds (or the process ends, or
    `timeout` passes), wait `delay` seconds, send `signals` (one, or several `apart` seconds apart), and wait
    for the exit."""
    signals = (signals,) if isinstance(signals, int) else signals
    with tempfile.NamedTemporaryFile("w+") as log:  # a file, not a pipe: a chatty process never blocks on it
        with Cli(args, log.name, log.name, prelude) as proc:
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


# a generate job on the prompt_table rows (id, text, each row's own budget); engine: the default unless given.
# The text goes to the model as written (model.chat off), so that tests compare it with model.generate on the text;
# test_generate.py's chat tests hold the default, the text as the user's message.
generate_job = functools.partial(
    make_job,
    task="generate",
    input__id="id",
    input__keep=None,
    model__chat=False,
    model__backend=None,
    batching=None,
    batching__max_rows=8,
    generation__max_new_tokens=16,
    generation__max_new_tokens_column="budget",
)


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


def check_docs_section(page: str, name: str, generated: str) -> None:
    """docs/PAGE between <!-- NAME:start --> and <!-- NAME:end --> is `generated`; with
    BATCHINFER_UPDATE_DOCS=1 it is rewritten to it first."""
    path = Path(__file__).resolve().parent.parent / "docs" / page
    text = path.read_text()
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    first, last = text.index(start) + len(start), text.index(end)
    current = text[first:last]
    if os.environ.get("BATCHINFER_UPDATE_DOCS"):
        path.write_text(text[:first] + generated + "\n" + text[last:])
        current = generated + "\n"
    assert current == generated + "\n", f"docs/{page} {name} section is stale: rerun with BATCHINFER_UPDATE_DOCS=1"


# Each row's cosine to the same row of another run, where either ran bf16: against f32 the run's own check's
# floor (precision.COSINE_FLOOR, on its sample; 10,000 real rows on an avx512_bf16 EPYC: min 0.99992); between two
# bf16 runs (another batch, a resume, another auto run), what two results each that close to f32 are from each
# other. bf16's error grows with each vector's size, so only a max abs bound in f32 says anything across models.
BF16_COSINE_TO_F32 = COSINE_FLOOR
BF16_COSINE_TO_BF16 = 0.9996


def stand_in_for_cpu_kind(kind: str, monkeypatch) -> None:
    """Make OpenVINO describe this CPU as one of CPU_KINDS (in this process and the workers it starts), so each
    kind's path (the precision dtype auto picks, its check, its bound) runs on any machine. What runs is still
    this CPU's: on a CPU without native bf16, bf16's outputs are rounded to bf16 (openvino.emulates_bf16)."""
    monkeypatch.setenv(STAND_IN, kind)
    monkeypatch.delenv("BATCHINFER_NO_BF16", raising=False)


def ran_in(out: Path) -> str:
    """The precision the last run into output folder `out` reports (`_report.json`'s batching.precision): bf16 or
    f32, whichever backend ran (torch says the dtype it loaded the model in)."""
    return json.loads((out / "_report.json").read_text())["batching"]["precision"]


def assert_rows_agree(ours, theirs, precisions: tuple[str, str], f32_bound: float) -> str:
    """Each row of `ours` [rows, dim] against the same row of `theirs`, from runs in `precisions` (each run's, as
    it reports it, see ran_in): within `f32_bound` max abs where both ran f32, within BF16_COSINE_* where either
    ran bf16. Returns which bound held ("f32" or "bf16"), and every failure names it."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if set(precisions) == {"f32"}:
        worst = float(np.abs(ours - theirs).max())
        assert worst < f32_bound, f"f32 against f32: max abs {worst:.3e}, over f32's bound {f32_bound:g}"
        return "f32"
    floor = BF16_COSINE_TO_F32 if "f32" in precisions else BF16_COSINE_TO_BF16
    cosine = (ours * theirs).sum(1) / np.maximum(np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1), 1e-12)
    against = " against ".join(precisions)
    assert cosine.min() >= floor, f"{against}: min cosine {cosine.min():.6f}, under bf16's bound {floor}"
    return "bf16"
