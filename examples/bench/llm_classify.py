"""Classifying with a causal LM four ways, through `batchinfer run`, on real SMS messages and 3 labels:

- label scoring (task classify, model.labels): each label's log-likelihood as the start of the reply,
  prefill only, the prompt computed once per row for its labels (label_prompt: shared);
- the naive baseline of the same scores: one sequence per (row, label), the prompt repeated;
- free generation of up to 8 tokens, parsed (the first word, lower-cased, without punctuation);
- generation constrained to the labels (generation.choices, xgrammar masks in continuous batching).

Each prints rows/s and the share of rows whose answer is one of the labels. The model is a random
Llama of about 50M parameters with a byte-level BPE tokenizer trained here on the shipped SMS messages
(so its answers are noise: what is measured is cost and validity, not accuracy). Every prompt goes
through the same chat template.

    nice -n 19 python examples/bench/llm_classify.py --rows 2000
    nice -n 19 python examples/bench/llm_classify.py --rows 2000 --other-rows 500   # on a busy CPU

--prefix measures the shared prefix instead (label scoring computes the prompts' common start once per
chunk): the same label-scoring job with the prefix reused and with nothing reused (prefix.MIN_PREFIX_TOKENS
raised past any prompt: today's path before reuse), on three jobs: a ~300-token instruction with a dozen worked
examples before each SMS message (the 50M Llama), the shipped jobs/llm-classify-sms.yaml (tiny-llama), and
the same job on SmolLM2-135M-Instruct where examples/models/convert_smollm2.py has converted it.
Each row of its table gives both rates and how far the reused scores are from a plain transformers forward
of whole prompts on a sample of rows.

    nice -n 19 python examples/bench/llm_classify.py --prefix --rows 600
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "models"))
LABELS = ["spam", "personal", "business"]
QUESTION = "Is this text message spam, personal or business? Answer with one word.\n\n"


def make_model(folder: Path, texts: list[str]) -> int:
    """A random Llama of about 50M parameters (byte-level BPE of up to 16,384 tokens, 512 wide, 12 layers).
    Returns its parameter count."""
    from make_tiny_causal import make_tokenizer, save_random_causal

    tokenizer = make_tokenizer(folder, texts, vocab_size=16384)  # with tiny-llama's special tokens and chat template
    model = save_random_causal(
        folder,
        tokenizer,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    return sum(p.numel() for p in model.parameters())


def sms(rows: int) -> pa.Table:
    table = pa.concat_tables(pq.read_table(p) for p in sorted((ROOT / "examples" / "sms_spam").glob("*.parquet")))
    table = table.slice(0, rows)
    prompts = [QUESTION + text for text in table.column("text").to_pylist()]
    return table.append_column("prompt", pa.array(prompts)).append_column(
        "messages", pa.array([[{"role": "user", "content": p}] for p in prompts])
    )


def answer_of(text: str) -> str:
    words = re.findall(r"[a-z]+", text.lower())
    return words[0] if words else ""


def run(data: Path, model: Path, out: Path, **sections) -> tuple[float, int, pa.Table]:
    """One `batchinfer run` → (its seconds as the report counts them, without loading the model; rows; output)."""
    report = run_report(data, model, out, **sections)
    return report["run"]["seconds"], report["run"]["rows"], ds.dataset(str(out)).to_table()


def run_report(data: Path, model: Path, out: Path, **sections) -> dict:
    """One `batchinfer run` of `data` by `model` into `out`, batching pinned; sections: `section__key` settings.
    Returns its report."""
    from batchinfer.execution.driver import run_job
    from batchinfer.job.config import validate_job

    job = {
        "input": {"path": str(data), "id": "sms_id"},
        "model": {"path": str(model), "max_length": 512},
        "batching": {"max_tokens": 4096, "strategy": "padded"},
        "output": {"path": str(out)},
    }
    for key, value in sections.items():
        section, name = key.split("__")
        job.setdefault(section, {})[name] = value
    return run_job(validate_job(job))


SCORING = dict(input__text="prompt", model__task="classify", model__labels=LABELS)
GENERATING = dict(input__messages="messages", model__task="generate", generation__max_new_tokens=8)
METHODS = {  # name: (job settings, the answers of its output table)
    "label scoring (prompt shared)": ({**SCORING, "model__label_prompt": "shared"}, lambda t: t.column("label")),
    "label scoring, naive (prompt per label)": (
        {**SCORING, "model__label_prompt": "repeated"},
        lambda t: t.column("label"),
    ),
    "free generation, 8 tokens, parsed": (GENERATING, lambda t: [answer_of(x) for x in t.column("text").to_pylist()]),
    "generation constrained to the labels (choices)": (
        {**GENERATING, "generation__choices": LABELS},
        lambda t: t.column("text"),
    ),
}


EXAMPLES = 12  # worked examples in the long instruction, from the end of the shipped messages (never scored)


def instruction(table: pa.Table) -> str:
    """A ~300-token instruction (on the 50M Llama's tokenizer) with EXAMPLES worked examples, then {text}."""
    head = (
        "You sort text messages for a phone company's filter. Answer spam for unsolicited advertising, prize "
        "draws, premium-rate numbers and requests to call or text a number for a reward; answer ham for "
        "everything else: messages between friends, family and colleagues, however short or informal.\n\n"
    )
    rows = table.slice(table.num_rows - EXAMPLES).to_pylist()
    shots = "".join(f"Message: {r['text'][:64]}\nAnswer: {r['label']}\n\n" for r in rows)
    return head + shots + "Message: {text}\nAnswer:"


def direct_scores(model: Path, prompts: list[str], labels: list[str]) -> np.ndarray:
    """[rows, labels] softmax over the labels' summed log-probabilities, one plain transformers forward of the
    whole prompt (through the chat template) and label per (row, label)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model).eval()
    sums = np.zeros((len(prompts), len(labels)))
    for i, text in enumerate(prompts):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer.encode(rendered, add_special_tokens=False)
        for k, label in enumerate(labels):
            ids = tokenizer.encode(label, add_special_tokens=False)
            with torch.no_grad():
                logprobs = lm(torch.tensor([prompt + ids])).logits[0].double().log_softmax(-1)
            sums[i, k] = sum(logprobs[len(prompt) - 1 + j, t].item() for j, t in enumerate(ids))
    shifted = np.exp(sums - sums.max(1, keepdims=True))
    return shifted / shifted.sum(1, keepdims=True)


def prefix_main(args, work: Path) -> None:
    """The --prefix table: each job with the prefix reused and with nothing reused, taking turns on slices."""
    import yaml
    from make_tiny_causal import sms_texts

    import batchinfer.runners.prefix as prefix

    params = make_model(work / "model", sms_texts())
    table = sms(args.rows + EXAMPLES)
    template = instruction(table)
    table = table.slice(0, args.rows)
    shipped = yaml.safe_load((ROOT / "jobs" / "llm-classify-sms.yaml").read_text())
    jobs = {  # name: (model, job settings, the prompt of a row's text)
        f"~300-token instruction, {EXAMPLES} examples (random Llama {params / 1e6:.0f}M)": (
            work / "model",
            dict(input__text=template, model__labels=["ham", "spam"], model__max_length=1024),
            lambda text: template.replace("{text}", text),
        ),
        "jobs/llm-classify-sms.yaml (tiny-llama)": (
            ROOT / shipped["model"]["path"],
            dict(input__text=shipped["input"]["text"], model__labels=shipped["model"]["labels"]),
            lambda text: shipped["input"]["text"].replace("{text}", text),
        ),
    }
    from convert_smollm2 import default_folder

    if (default_folder() / "config.json").is_file():  # the real model the shipped job's comment points to
        jobs["jobs/llm-classify-sms.yaml, model.path SmolLM2-135M-Instruct"] = (
            default_folder(),
            *jobs["jobs/llm-classify-sms.yaml (tiny-llama)"][1:],
        )
    print(
        "\n| job | prefix tokens | saved share | rows | rows/s, prefix reused | rows/s, nothing reused | speed-up "
        "| speed-up by slice | max abs diff to transformers | max abs diff, reused to not |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for j, (name, (model, settings, prompt_of)) in enumerate(jobs.items()):
        seconds, scores, figures = {True: 0.0, False: 0.0}, {True: [], False: []}, None
        slices = []  # each slice's seconds nothing reused over reused: how steady the ratio is on a shared CPU
        for r in range(args.rounds):
            start, stop = r * args.rows // args.rounds, (r + 1) * args.rows // args.rounds
            path = work / f"prefix-{j}-{r}.parquet"
            pq.write_table(table.slice(start, stop - start), path)
            took = {}
            # the two take turns going first: a process's first run carries its imports and first calls
            for reused in (True, False) if r % 2 == 0 else (False, True):
                prefix.MIN_PREFIX_TOKENS = 8 if reused else 1 << 30
                out = work / f"prefix-{j}-{r}-{reused}"
                report = run_report(path, model, out, model__task="classify", output__scores=True, **settings)
                took[reused] = report["run"]["seconds"]  # without the model's load
                seconds[reused] += took[reused]
                scores[reused] += ds.dataset(str(out)).to_table().column("scores").to_pylist()
                figures = report["prefix"] if reused else figures
            slices.append(f"{took[False] / took[True]:.2f}x")
        reused, plain = (np.array(scores[k], dtype=np.float64) for k in (True, False))
        picked = np.linspace(0, args.rows - 1, num=min(args.direct, args.rows)).round().astype(int)
        texts = table.column("text").to_pylist()
        direct = direct_scores(model, [prompt_of(texts[i]) for i in picked], settings["model__labels"])
        rates = {k: args.rows / seconds[k] for k in seconds}
        print(
            f"| {name} | {figures['tokens']} | {figures['saved_share']:.1%} | {args.rows} | {rates[True]:.1f} | "
            f"{rates[False]:.1f} | {rates[True] / rates[False]:.2f}x | {', '.join(slices)} "
            f"| {np.abs(reused[picked] - direct).max():.1e} "
            f"({len(picked)} rows) | {np.abs(reused - plain).max():.1e} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000, help="rows for label scoring")
    parser.add_argument("--other-rows", type=int, default=None, help="rows for the three other methods (default all)")
    parser.add_argument("--rounds", type=int, default=4, help="the rows in this many slices, the methods taking turns")
    parser.add_argument("--prefix", action="store_true", help="measure the shared prefix instead (see above)")
    parser.add_argument("--direct", type=int, default=24, help="--prefix: rows checked against transformers")
    args = parser.parse_args()
    from make_tiny_causal import sms_texts

    work = Path(tempfile.mkdtemp(prefix="llm-classify-"))
    if args.prefix:
        return prefix_main(args, work)
    params = make_model(work / "model", sms_texts())
    print(f"random Llama, {params / 1e6:.1f}M parameters; labels {LABELS}")
    table = sms(args.rows)
    other = args.other_rows or args.rows
    seconds = {name: 0.0 for name in METHODS}
    rows = {name: 0 for name in METHODS}
    answers: dict[str, list] = {name: [] for name in METHODS}
    # the methods take turns on each slice, so that a machine whose speed drifts (a shared CPU) treats them alike
    for r in range(args.rounds):
        start, stop = r * args.rows // args.rounds, (r + 1) * args.rows // args.rounds
        for i, (name, (settings, read)) in enumerate(METHODS.items()):
            take = stop - start if name.startswith("label scoring (") else (stop - start) * other // args.rows
            path = work / f"slice-{r}-{take}.parquet"
            pq.write_table(table.slice(start, take), path)
            spent, done, out = run(path, work / "model", work / f"out-{r}-{i}", **settings)
            seconds[name] += spent
            rows[name] += take
            got = read(out)
            answers[name] += got.to_pylist() if hasattr(got, "to_pylist") else got
            answers[name] += [None] * (take - done)  # error rows: no answer
    print("\n| method | rows | rows/s | valid label |\n|---|---|---|---|")
    for name in METHODS:
        valid = sum(a in LABELS for a in answers[name]) / rows[name]
        print(f"| {name} | {rows[name]} | {rows[name] / seconds[name]:.1f} | {valid:.1%} |")
    shared, naive = (answers[name] for name in list(METHODS)[:2])
    rate = {name: rows[name] / seconds[name] for name in METHODS}
    first = list(METHODS)
    print(f"\nshared against naive: {rate[first[0]] / rate[first[1]]:.2f}x the rows/s", end="")
    if other == args.rows:
        print(f", the same label on {sum(a == b for a, b in zip(shared, naive)) / len(shared):.1%} of rows")
    print()


if __name__ == "__main__":
    main()
