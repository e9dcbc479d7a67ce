"""Helpers the tests share (the fixtures are in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import torch

from batchinfer.config import validate_job
from batchinfer.control import Quiet

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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


def done_chunks(out: Path) -> int:
    """Chunks (and retry passes) an output folder has committed: its completion markers."""
    return len(list((out / "_done").glob("*.json"))) if (out / "_done").exists() else 0


def job_record(out: Path) -> dict:
    """The output folder's job file: id, fingerprint, batching chosen by a probe."""
    return json.loads((out / "_batchinfer.json").read_text())


def leftover_tmp(out: Path, name: str) -> Path:
    """Where a kill in the middle of writing `name` leaves its temporary file."""
    return out / f".tmp-{job_record(out)['job_id'][:12]}-{name}"


def write_job(tmp_path: Path, **sections) -> Path:
    """A job file from nested dicts; returns its path."""
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def sms_job(data, model, out, task="embed", **extra):
    """A job over the sms fixtures' columns; extra keys as section__name=value."""
    job = {
        "input": {"path": str(data), "text": "text", "id": "sms_id", "keep": {"label": "gold"}},
        # The torch kernels, pinned like batching: these tests compare against torch peers (pipelines,
        # sentence-transformers) to 1e-5; test_backends.py holds OpenVINO to torch.
        "model": {"path": str(model), "task": task, "max_length": 128, "backend": "torch"},
        # Pinned, not auto: tests that compare two output folders bit for bit need both cut the same way.
        "batching": {"chunk_rows": 100, "max_tokens": 16384, "strategy": "padded"},
        "output": {"path": str(out)},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        job[section][name] = value
    return validate_job(job)


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


def generate_alone(model_path, prompt_ids: list[int], max_new: int) -> list[int]:
    """What transformers' own generate gives for one prompt, greedily, cut at its end of sequence."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    out = model.generate(
        torch.tensor([prompt_ids]),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        max_new_tokens=max_new,
        do_sample=False,
    )
    tokens = out[0, len(prompt_ids) :].tolist()
    eos = model.generation_config.eos_token_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def check_readme_section(name: str, generated: str) -> None:
    """The README between <!-- NAME:start --> and <!-- NAME:end --> is `generated`; with
    BATCHINFER_UPDATE_README=1 it is rewritten to it first."""
    import os

    path = Path(__file__).resolve().parent.parent / "README.md"
    readme = path.read_text()
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    current = readme[readme.index(start) + len(start) : readme.index(end)]
    if os.environ.get("BATCHINFER_UPDATE_README"):
        path.write_text(readme.replace(current, generated + "\n"))
        current = generated + "\n"
    assert current == generated + "\n", f"README {name} section is stale: rerun with BATCHINFER_UPDATE_README=1"
