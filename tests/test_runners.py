"""What every runner shares: tokenizing without paying for what truncation drops."""

import copy
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import make_job, read_output
from transformers import AutoTokenizer

from batchinfer.runners.base import CHARS_PER_TOKEN, encode_capped
from batchinfer.runners.protocol import ChunkOutput, Runner, Tokens


@pytest.fixture(scope="module")
def backend(minilm_path):
    tokenizer = copy.deepcopy(AutoTokenizer.from_pretrained(minilm_path).backend_tokenizer)
    tokenizer.no_padding()
    return tokenizer


@pytest.mark.parametrize("from_end", [False, True])
def test_long_texts_encode_as_if_whole(backend, sms_table, from_end):
    backend.enable_truncation(64, direction="left" if from_end else "right")
    words = " ".join(sms_table.column("text").to_pylist()[:3000])  # ~200k characters of real text
    texts = [
        words,
        "short one",
        "\u200b" * (64 * CHARS_PER_TOKEN) + " tail words after invisible ones",
        "x" * (64 * CHARS_PER_TOKEN * 2),
    ]
    capped = encode_capped(backend, texts, 64, from_end=from_end)
    whole = backend.encode_batch(texts)
    assert [e.ids for e in capped] == [e.ids for e in whole]
    assert [bool(e.overflowing) for e in capped] == [bool(e.overflowing) for e in whole] == [True, False, False, False]


def test_a_megabyte_text_is_cut_before_the_tokenizer_sees_it(backend):
    backend.enable_truncation(64)
    seen = []

    class Spy:
        def encode_batch(self, texts, **options):
            seen.extend(len(t) for t in texts)
            return backend.encode_batch(texts, **options)

    encode_capped(Spy(), ["word " * 400_000], 64)
    assert seen == [64 * CHARS_PER_TOKEN]


def test_every_runner_implements_the_runner_protocol():
    import inspect

    from batchinfer.runners import LABEL_SCORER, RUNNERS, runner_class
    from batchinfer.runners.protocol import Runner

    methods = {name: fn for name, fn in vars(Runner).items() if inspect.isfunction(fn) and not name.startswith("_")}
    assert set(methods) == {"tokenize", "row_settings", "cut", "packing_problem", "run_chunk", "keep"}
    for cls in map(runner_class, [*RUNNERS.values(), LABEL_SCORER]):
        for name, fn in methods.items():
            assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"
            own = list(inspect.signature(getattr(cls, name)).parameters)
            assert own == list(inspect.signature(fn).parameters), f"{cls.__name__}.{name}{own}"
        assert hasattr(cls, "score_labels"), cls.__name__


def test_the_engine_protocols_declare_everything_their_callers_use():
    """The generate runner and serve reach an engine only through what Engine and Serving declare (so any engine
    that implements them runs and serves; test_house checks each engine implements them)."""
    import re
    from pathlib import Path

    from batchinfer.runners.engine import Engine, Serving

    def declared(protocol) -> set[str]:
        return set(protocol.__annotations__) | {n for n in vars(protocol) if not n.startswith("_")}

    package = Path(__file__).resolve().parent.parent / "batchinfer"
    runner = (package / "runners" / "generate.py").read_text()
    serve = (package / "serve" / "services.py").read_text()
    used = {
        Engine: set(re.findall(r"self\.engine\.(\w+)", runner)) | set(re.findall(r"runner\.engine\.(\w+)", serve)),
        Serving: set(re.findall(r"(?<!runner)\.engine\.(\w+)", serve.replace("self.runner.engine", ""))),
    }
    assert used[Engine] >= {"run", "serve", "shared_page", "described", "pads"}
    assert used[Serving] >= {"listen", "add", "cancel", "forget", "problem", "stop", "constrained"}
    for protocol, names in used.items():
        assert names <= declared(protocol), f"{protocol.__name__} does not declare {names - declared(protocol)}"


class ProtocolOnlyRunner:
    """A task's runner with exactly what runners/protocol.py's Runner declares: an "embedding" of [its token ids
    summed, its tokens] per row, a token per word (its length). A caller that reaches past the protocol meets an
    AttributeError here."""

    device, max_length, score_labels = torch.device("cpu"), 16, None

    def __init__(self):
        self.load_seconds: dict = {}

    @property
    def backends(self) -> tuple[str, ...]:
        return ()

    def keep(self, backend, precision=None):
        raise AssertionError("no backend to keep: backends is empty")

    def tokenize(self, texts):
        ids = [[len(word) for word in text.split()] or [0] for text in texts]
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        cut = [i[: self.max_length] for i in ids]
        return Tokens(cut, np.minimum(lengths, self.max_length), lengths > self.max_length)

    def row_settings(self, job, table, prepared):
        return None

    def cut(self, lengths, budget, max_rows):
        return np.array_split(np.arange(len(lengths)), max(1, -(-len(lengths) // max_rows)))

    def packing_problem(self):
        return None

    def run_chunk(self, loaded, ctx):
        index = loaded.index
        rows = [[sum(loaded.tokens.ids[i]), len(loaded.tokens.ids[i])] for i in index.tolist()]
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(np.ravel(rows), pa.float32()), 2)
        return ChunkOutput({"embedding": embedding}, index, 0.0, int(loaded.tokens.lengths[index].sum()))


def test_a_runner_with_only_what_the_runner_protocol_declares_runs_a_whole_job(
    sms_parquet, sms_table, tiny_embed, tmp_path, monkeypatch
):
    """What a new task's runner must provide is what Runner declares (test_house checks its callers use no more):
    a runner with exactly that runs a job, probe and all, and writes what it computed."""
    import batchinfer.runners
    from batchinfer.execution.driver import run_job

    runner = ProtocolOnlyRunner()
    declared = set(Runner.__annotations__) | {n for n in vars(Runner) if not n.startswith("_")}
    assert {n for n in dir(runner) if not n.startswith("_")} == declared
    monkeypatch.setattr(batchinfer.runners, "runner_class", lambda name: SimpleNamespace(load=lambda *a: runner))
    report = run_job(make_job(sms_parquet, tiny_embed, tmp_path / "out", batching={"max_tokens": "auto"}))

    assert report["complete"] and report["rows_ok"] == 600
    table = read_output(tmp_path / "out").sort_by("sms_id")
    texts = dict(zip(sms_table.column("sms_id").to_pylist(), sms_table.column("text").to_pylist()))
    words = [[len(w) for w in texts[i].split()][:16] or [0] for i in table.column("sms_id").to_pylist()]
    assert table.column("embedding").to_pylist() == [[sum(w), len(w)] for w in words]
