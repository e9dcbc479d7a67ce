"""Tiny tokenizers of the families transformers rebuilds from their class and tokenizer_config.json (no
downloads; conftest's `tokenizer_family` saves each with a tiny random BERT). What each one tests: the part of
the tokenizer that tokenizer.json alone does not say."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["hello", "world", "café", "cafe", "the", "über", "naïve", "résumé", "北", "京", "大", "学", "HELLO", "World"]
LETTERS = list("abcdefghijklmnopqrstuvwxyzéüïABCDEFGHIJKLMNOPQRSTUVWXYZ,.!?")
FAMILIES = ("course_bert", "cased_bert", "roberta_prefix_space", "xlmr_metaspace", "no_chinese_chars", "extra_special")
# Accents, uppercase, CJK, leading, trailing and repeated whitespace, special tokens written in the text.
TRICKY = [
    "Hello World",
    "Café über naïve RÉSUMÉ",
    "北京大学 hello",
    "  hello world  ",
    "hello world ",
    "hello  world",
    " the <ent> [MASK] <mask> x",
    "HELLO\tworld\n",
    "",
]


def _wordpiece():
    from tokenizers import Tokenizer, decoders, models, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*specials, *WORDS, *LETTERS, *(f"##{c}" for c in LETTERS)]))}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _bert(**settings):
    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertTokenizerFast

    tokenizer = _wordpiece()
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return BertTokenizerFast(tokenizer_object=tokenizer, **settings)


def _build(family: str):
    """The transformers tokenizer of `family`, and tokenizer_config.json keys to set after saving it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast, RobertaTokenizerFast, XLMRobertaTokenizerFast

    if family == "course_bert":  # the Hugging Face course's recipe
        tokenizer = _wordpiece()
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.NFD(), normalizers.Lowercase(), normalizers.StripAccents()]
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        return BertTokenizerFast(tokenizer_object=tokenizer), {}
    if family == "cased_bert":  # a cased WordPiece wrapped without do_lower_case
        tokenizer = _wordpiece()
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return BertTokenizerFast(tokenizer_object=tokenizer), {}
    if family == "no_chinese_chars":
        return _bert(tokenize_chinese_chars=False), {}
    if family == "extra_special":  # additional special tokens named in tokenizer_config.json only
        return _bert(), {"extra_special_tokens": ["<ent>"], "additional_special_tokens": ["<ent>"]}
    if family == "roberta_prefix_space":
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
        for piece in [*pre_tokenizers.ByteLevel.alphabet(), "Ġhello", "Ġworld", "hello", "world", "Ġthe"]:
            vocab.setdefault(piece, len(vocab))
        merges = [("h", "e"), ("he", "l"), ("hel", "l"), ("hell", "o"), ("Ġ", "h"), ("Ġh", "e"), ("Ġhe", "l")]
        merges += [("Ġhel", "l"), ("Ġhell", "o")]
        for merge in merges:
            vocab.setdefault("".join(merge), len(vocab))
        tokenizer = Tokenizer(models.BPE(vocab, merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
        return RobertaTokenizerFast(tokenizer_object=tokenizer, add_prefix_space=False), {"add_prefix_space": True}
    if family == "xlmr_metaspace":  # Replace + Metaspace, as XLM-R's Precompiled normalizer is followed
        pieces = ["▁hello", "▁world", "▁", "hello", "world", "▁the", *"abcdefghijklmnopqrstuvwxyz"]
        vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
        vocab += [(piece, -float(i)) for i, piece in enumerate(pieces)] + [("<mask>", 0.0)]
        tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3))
        tokenizer.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tokenizer.decoder = decoders.Metaspace()
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
        return XLMRobertaTokenizerFast(tokenizer_object=tokenizer), {}
    raise ValueError(family)


def save_tokenizer(family: str, folder: Path) -> None:
    """Save the tokenizer of `family` into `folder` as transformers saves it, with its tokenizer_config.json keys."""
    tokenizer, settings = _build(family)
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **settings}))
