"""What every runner shares: tokenizing without paying for what truncation drops."""

import copy

import pytest
from transformers import AutoTokenizer

from batchinfer.runners.base import CHARS_PER_TOKEN, encode_capped


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
