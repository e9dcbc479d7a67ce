"""Writes three tiny random-weight BERT models with a WordPiece tokenizer trained in a second on the
shipped SMS messages, for the example jobs of tasks score, token-classify and zero-shot. They exist to
show the pipelines offline; their outputs are noise. For real results point model.path at a trained
cross-encoder, NER model or NLI model (see the README's "Tasks").

    python examples/models/make_tiny_encoders.py     # writes examples/models/tiny-{cross-encoder,ner,nli}/
"""

from __future__ import annotations

from pathlib import Path

from make_tiny_causal import sms_texts

KINDS = {
    "cross-encoder": {"LABEL_0": 0},
    "ner": {"O": 0, "B-PER": 1, "I-PER": 2, "B-LOC": 3, "I-LOC": 4, "B-ORG": 5, "I-ORG": 6},
    "nli": {"contradiction": 0, "neutral": 1, "entailment": 2},
}


def make_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=2000, special_tokens=specials, show_progress=False)
    )
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def make_tiny_encoder(kind: str, folder: Path, tokenizer) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

    labels = KINDS[kind]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=len(labels),
        id2label={i: name for name, i in labels.items()},
        label2id=labels,
    )
    model = (BertForTokenClassification if kind == "ner" else BertForSequenceClassification)(config)
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    shared = make_tokenizer(sms_texts())
    for kind in KINDS:
        print(make_tiny_encoder(kind, here / f"tiny-{kind}", shared))
