"""backends/base.py: the Backend interface. A backend is one module (a class and a loader registered in
backends.LOADERS): a fake one here runs a whole job, and nothing above backends/ asks a backend its name."""

import ast
from pathlib import Path

import numpy as np
import pytest
import transformers
from helpers import generate_job, make_job, prompt_table, read_output

from batchinfer import backends
from batchinfer.backends.base import Batch, Pair, Targets, batch_of
from batchinfer.execution.driver import run_job
from batchinfer.runners.engine import Registered

PACKAGE = Path(__file__).resolve().parent.parent / "batchinfer"
NAMES = {"torch", "openvino"}  # the built-in backends' names


class FakeBackend:
    """A logit per label from an item's real tokens alone (expected_logits): numpy only, padded only, one
    precision. What it received is kept, to show what the runner hands a backend."""

    name, reference, default_budget = "fake", False, 512
    precision, precisions = None, [None]
    packing_problem = "the fake runs padded batches only"
    f32 = False
    device = None

    def __init__(self, config):
        self.config = config
        self.batches: list[Batch] = []
        self.remembered: list[dict] = []

    def use(self, precision):
        pass

    def keep(self, precision):
        pass

    def remember(self, rates, load):
        self.remembered.append(rates)

    def best_rates(self):
        return {}

    def forward(self, batch: Batch) -> np.ndarray:
        self.batches.append(batch)
        total = (batch.ids * batch.mask).sum(axis=1)  # the pad id's tokens count for nothing
        label = np.arange(self.config.num_labels)
        return ((total[:, None] + label[None, :] * batch.lengths[:, None]) % 7).astype(np.float32)  # [b, labels]


def expected_logits(ids: list[int], labels: int) -> list[int]:
    return [(sum(ids) + k * len(ids)) % 7 for k in range(labels)]


@pytest.fixture
def fake(monkeypatch):
    """The fake registered as a new backend's module registers itself: a loader in backends.LOADERS."""
    loaded = []

    def load(cfg, path, output):
        assert output == ("logits", None)  # what classify's head reads
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        loaded.append(FakeBackend(transformers.AutoConfig.from_pretrained(path)))
        return tokenizer, loaded[-1], backends.openvino.Device()

    monkeypatch.setitem(backends.LOADERS, "fake", load)
    return loaded


def _fake_job(sms_parquet, tiny_classify, out, **overrides):
    job = make_job(sms_parquet, tiny_classify, out, "classify", output__scores=True, **overrides)
    # model.backend's choices are job/config.py's Literal: a backend shipped in batchinfer adds its name there
    return job.model_copy(update={"model": job.model.model_copy(update={"backend": "fake"})})


def test_a_fake_backend_runs_a_whole_job_and_its_results_are_what_it_computed(
    sms_parquet, sms_table, tiny_classify, tmp_path, fake
):
    job = _fake_job(sms_parquet, tiny_classify, tmp_path / "out", batching={"max_tokens": "auto", "strategy": "auto"})
    report = run_job(job)
    assert report["batching"]["backend"] == "fake"
    assert report["batching"]["strategy"] == "padded"  # the fake does not pack: the probe never offers packed
    # Its slices run too fast to measure (microseconds): the probe keeps the backend's own default budget.
    assert report["batching"]["max_tokens"] == FakeBackend.default_budget
    backend = fake[0]
    assert backend.batches and not any(batch.packed for batch in backend.batches)

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_classify)
    table = read_output(tmp_path / "out").sort_by("sms_id")
    texts = dict(zip(sms_table.column("sms_id").to_pylist(), sms_table.column("text").to_pylist()))
    ids = [
        tokenizer(texts[i], truncation=True, max_length=128)["input_ids"] for i in table.column("sms_id").to_pylist()
    ]
    labels = transformers.AutoConfig.from_pretrained(tiny_classify).num_labels
    logits = np.array([expected_logits(row, labels) for row in ids], dtype=np.float64)
    scores = np.exp(logits - logits.max(axis=1, keepdims=True))
    scores /= scores.sum(axis=1, keepdims=True)
    assert table.column("label_id").to_pylist() == scores.argmax(axis=1).tolist()
    np.testing.assert_allclose(np.array(table.column("scores").to_pylist()), scores, rtol=1e-5)
    assert len(table) == 600  # every row of the three shards ran: none in _errors/


def test_a_fake_backend_that_cannot_pack_refuses_packed_naming_its_reason(sms_parquet, tiny_classify, tmp_path, fake):
    from batchinfer.errors import ConfigError

    job = _fake_job(sms_parquet, tiny_classify, tmp_path / "out", batching__strategy="packed")
    with pytest.raises(ConfigError, match="the fake runs padded batches only"):
        run_job(job)


def test_the_heads_of_the_tasks_openvino_runs_read_numpy_and_never_import_torch():
    """forward returns numpy whatever the backend, so these tasks' heads convert nothing (token-classify runs the
    pipeline's entity grouping on numpy, not its torch postprocess)."""
    for task in ("classify", "score", "token_classify", "zero_shot"):
        tree = ast.parse((PACKAGE / "runners" / f"{task}.py").read_text())
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [m for m in imported if m.split(".")[0] == "torch"], task


class FakeScorer:
    """Label scoring's Scorer with no model: log p(target) = -((target + the token at `at`) % 7) / 2, the token at `at`
    being the one that predicts the target (the prompt's last, then the label's previous)."""

    prefix_problem = "the fake keeps no cache"

    def logprobs(self, batch: Targets) -> np.ndarray:
        return -((batch.target + batch.input_ids.reshape(-1)[batch.at]) % 7) / 2


class FakeScoringBackend(FakeBackend):
    def scorer(self) -> FakeScorer:
        return FakeScorer()


def test_label_scoring_runs_on_any_backend_that_gives_a_scorer(
    sms_parquet, sms_table, tiny_llama_plain, tmp_path, monkeypatch
):
    """runners/label_score.py asks the backend's Scorer alone (backends/base.py): no model, no torch of its own."""

    def load(cfg, path, output):
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        return tokenizer, FakeScoringBackend(transformers.AutoConfig.from_pretrained(path)), backends.openvino.Device()

    monkeypatch.setitem(backends.LOADERS, "fake", load)
    labels = ["ham", "spam", "not sure"]
    job = make_job(
        sms_parquet, tiny_llama_plain, tmp_path / "out", "classify", model__labels=labels, output__scores=True
    )
    run_job(job.model_copy(update={"model": job.model.model_copy(update={"backend": "fake"})}))

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llama_plain)
    label_ids = [tokenizer.encode(label, add_special_tokens=False) for label in labels]
    table = read_output(tmp_path / "out").sort_by("sms_id")
    texts = dict(zip(sms_table.column("sms_id").to_pylist(), sms_table.column("text").to_pylist()))
    for row in table.to_pylist():
        last = tokenizer.encode(texts[row["sms_id"]])[-1]  # the prompt is cut from the left: its end stays
        sums = np.array([-sum((t + p) % 7 for t, p in zip(ids, [last, *ids[:-1]])) / 2 for ids in label_ids])
        expected = np.exp(sums - sums.max()) / np.exp(sums - sums.max()).sum()
        assert row["label"] == labels[int(expected.argmax())]
        np.testing.assert_allclose(row["scores"], expected, rtol=1e-5)


def test_a_batch_is_built_once_padded_or_packed_with_token_types_for_pairs():
    items = [Pair([5, 6, 7], [0, 0, 1]), Pair([8], [1])]
    padded, packed = batch_of(items, pad_id=3), batch_of(items, pad_id=3, packed=True)
    assert padded.ids.tolist() == [[5, 6, 7], [8, 3, 3]] and padded.type_ids.tolist() == [[0, 0, 1], [1, 0, 0]]
    assert padded.mask.tolist() == packed.mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert packed.ids.tolist() == [5, 6, 7, 8] and packed.type_ids.tolist() == [0, 0, 1, 1]
    assert packed.cu_lengths.tolist() == [0, 3, 4] and padded.cu_lengths is None
    assert list(padded.inputs()) == ["input_ids", "token_type_ids", "attention_mask"]
    assert batch_of([[1, 2]], pad_id=0).type_ids is None


def _name_compares(path: Path, names: set[str] = NAMES) -> list[str]:
    """Comparisons with one of `names` (==, !=, in, not in; a tuple of names counts) and lookups by one
    (x["torch"]) in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Subscript):
            operands = [node.slice]
        else:
            continue
        for operand in operands:
            values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def _above_backends(names: set[str]) -> list[str]:
    """_name_compares in every module of the layers above backends/."""
    layers = ("runners", "batching", "commands", "serve", "execution")
    paths = [path for layer in layers for path in (PACKAGE / layer).rglob("*.py")]
    return [found for path in sorted(paths) for found in _name_compares(path, names)]


def test_nothing_above_backends_compares_a_backends_name():
    """Runners, the probe, plan and serve ask the Backend (packs, default_budget, precisions, reference), so a new
    backend needs no branch of theirs."""
    found = _above_backends(NAMES)
    assert not found, "\n".join(found)


def test_nothing_compares_an_engines_name():
    """generate.py, serve and resume ask an engine class from runners.engine.ENGINES (Registered: what it needs, why
    it cannot run a job, how it loads; engine.AUTO_FIRST and AUTO_AFTER: what auto tries, in order), so a new engine
    needs no branch of theirs."""
    from batchinfer.runners.engine import ENGINES

    found = _above_backends(set(ENGINES))
    assert not found, "\n".join(found)


class FakeEngine(Registered):
    """A new generation engine, as a module would add one, over the model Registered loads (transformers'): generates
    (sum(prompt) + k) % 50 + 100 at step k, up to a row's max_new, one pass for all rows (it takes each row's
    settings itself). What it ran is kept."""

    name, shared_page, pads = "fake", None, False
    described = {"name": "fake"}
    ran: list = []

    @classmethod
    def over(cls, gen, model, device, pad_id, eos, grammars):
        return cls()

    def passes(self, settings, skip=()):
        return [[i for i in range(len(settings)) if i not in skip]]

    def run(self, rows, max_rows, check):
        from batchinfer.runners.engine import PassOutput

        self.ran.append(rows)
        return PassOutput([(fake_completion(p, n), None) for p, n in zip(rows.prompts, rows.max_new)])

    def note(self, note):
        pass

    def serve(self, gen, max_rows, max_length):
        raise NotImplementedError


def fake_completion(prompt: list[int], max_new: int) -> list[int]:
    return [(sum(prompt) + k) % 50 + 100 for k in range(max_new)]


def test_a_fake_engine_registered_in_one_line_runs_a_whole_generation_job(sms_table, tiny_llama, tmp_path, monkeypatch):
    """A new engine is one module (a Registered class with `over`, `passes`, `run`) and one line in
    runners.engine.ENGINES."""
    import pyarrow.parquet as pq

    from batchinfer.runners import engine

    monkeypatch.setitem(engine.ENGINES, "fake", f"{__name__}:FakeEngine")
    monkeypatch.setattr(FakeEngine, "ran", [])
    pq.write_table(prompt_table(sms_table, 12), tmp_path / "p.parquet")
    job = generate_job(tmp_path / "p.parquet", tiny_llama, tmp_path / "out")
    # generation.engine's choices are job/config.py's Literal: an engine shipped in batchinfer adds its name there
    job = job.model_copy(update={"generation": job.generation.model_copy(update={"engine": "fake"})})
    report = run_job(job)
    assert report["rows_ok"] == 12 and FakeEngine.ran
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    rows = read_output(tmp_path / "out").sort_by("id").to_pylist()
    table = prompt_table(sms_table, 12).sort_by("id").to_pylist()
    for row, asked in zip(rows, table):
        prompt = tokenizer(asked["text"])["input_ids"]
        expected = fake_completion(prompt, asked["budget"] or 16)
        assert row["text"] == tokenizer.decode(expected, skip_special_tokens=True), row
        assert (row["prompt_tokens"], row["completion_tokens"]) == (len(prompt), len(expected))
