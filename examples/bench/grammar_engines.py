"""xgrammar against llguidance on this machine: what batchinfer's constrained output costs with each.

For a byte-level BPE tokenizer (trained here on the shipped SMS messages and, where present, the shared
text in /work/shared/data, at --vocab tokens), each engine:
- builds its tokenizer view once (per model),
- compiles three grammars (a JSON schema, a choice of three labels, a regex): cold, then from its cache,
- walks a valid answer token by token, timing the mask of the next allowed tokens at every step and the
  token accepted after it (what each decoding step pays per constrained request).

    nice -n 19 python examples/bench/grammar_engines.py --vocab 32000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["ham", "spam", "unsure"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reasons": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["label", "confidence", "reasons"],
    "additionalProperties": False,
}
ANSWERS = {
    "json_schema": '{"label": "spam", "confidence": 0.93, "reasons": ["prize claim", "premium-rate number"]}',
    "choices": "unsure",
    "regex": "2024-05-17",
}
CHOICES = ["ham", "spam", "unsure"]
REGEX = r"\d{4}-\d{2}-\d{2}"


def corpus() -> list[str]:
    import pyarrow.parquet as pq

    root = Path(__file__).resolve().parents[1]
    texts = [t for p in sorted((root / "sms_spam").glob("*.parquet")) for t in pq.read_table(p).column("text")]
    texts = [str(t) for t in texts]
    shared = Path("/work/shared/data")
    for name in ("sst2/train.tsv", "ag_news/test.csv", "trec/TREC.train", "rt-polarity/rt-polarity.pos"):
        if (shared / name).exists():
            texts += (shared / name).read_text(encoding="utf-8", errors="replace").splitlines()
    return texts


def tokenizer(vocab: int):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus(), vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"])
    with tempfile.TemporaryDirectory() as folder:
        PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(folder)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)


def timed(fn, repeat: int = 1):
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def xgrammar_engine(tok):
    import xgrammar as xgr

    setup, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.eos_token_id]))
    compiler = xgr.GrammarCompiler(info, max_threads=2)
    compile_ = {
        "json_schema": lambda: compiler.compile_json_schema(json.dumps(SCHEMA)),
        "choices": lambda: compiler.compile_regex("|".join(map(_escape, CHOICES))),
        "regex": lambda: compiler.compile_regex(REGEX),
    }
    bitmask = xgr.allocate_token_bitmask(1, len(tok))

    def walk(grammar, ids):
        matcher = xgr.GrammarMatcher(grammar)
        mask_s, accept_s = [], []
        for token in ids + [tok.eos_token_id]:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            t1 = time.perf_counter()
            ok = matcher.accept_token(token)
            mask_s.append(t1 - t0)
            accept_s.append(time.perf_counter() - t1)
            assert ok, token
        assert matcher.is_terminated()
        return mask_s, accept_s

    return setup, compile_, walk, compiler.clear_cache


def llguidance_engine(tok):
    import llguidance
    import llguidance.hf

    setup, lltok = timed(lambda: llguidance.hf.from_tokenizer(tok))
    compile_ = {
        "json_schema": lambda: llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)),
        "choices": lambda: llguidance.LLMatcher(lltok, llguidance.grammar_from("choice", CHOICES)),
        "regex": lambda: llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(REGEX)),
    }
    words = (len(tok) + 31) // 32
    bitmask = torch.zeros(1, words, dtype=torch.int32)

    def walk(matcher, ids):
        assert not matcher.is_error(), matcher.get_error()
        mask_s, accept_s = [], []
        for token in ids + [tok.eos_token_id]:
            t0 = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), words * 4)
            t1 = time.perf_counter()
            ok = matcher.consume_token(token)
            mask_s.append(t1 - t0)
            accept_s.append(time.perf_counter() - t1)
            assert ok, (token, matcher.get_error())
        assert matcher.is_stopped() or matcher.is_accepting()
        return mask_s, accept_s

    return setup, compile_, walk, lambda: None


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tok = tokenizer(args.vocab)
    print(f"byte-level BPE, {len(tok)} tokens")
    header = "engine | tokenizer view | grammar | compile cold | compile again | mask per token (median, p90) | accept"
    print(f"| {header} |")
    print("|---|---|---|---|---|---|---|")
    for name, make in (("xgrammar", xgrammar_engine), ("llguidance", llguidance_engine)):
        setup, compile_, walk, clear = make(tok)
        for kind, build in compile_.items():
            clear()
            cold, grammar = timed(build)
            again, grammar = timed(build, repeat=3)
            ids = tok.encode(ANSWERS[kind], add_special_tokens=False)
            masks, accepts = walk(grammar, ids)
            p90 = float(np.percentile(masks, 90))
            print(
                f"| {name} | {setup * 1e3:.0f} ms | {kind} | {cold * 1e3:.1f} ms | {again * 1e3:.2f} ms | "
                f"{statistics.median(masks) * 1e6:.0f} us, {p90 * 1e6:.0f} us | "
                f"{statistics.median(accepts) * 1e6:.0f} us |"
            )


if __name__ == "__main__":
    main()
