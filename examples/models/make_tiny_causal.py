"""Writes a tiny random-weight causal LM with a byte-level BPE tokenizer (trained in a second on the
shipped SMS messages) and a chat template. It exists to show and test the generate pipeline
offline; its text is gibberish. For real completions point model.path at an instruct model.

    python examples/models/make_tiny_causal.py            # writes examples/models/tiny-llama/
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(folder: Path, texts: list[str], vocab_size: int = 600):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    specials = ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>"]
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=specials, show_progress=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>", pad_token="<|pad|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


def make_tiny_causal(kind: str, folder: Path, texts: list[str]) -> Path:
    """kind: llama or gpt2. A wide init gives peaked logits, so greedy decoding has no near-ties that
    float noise between attention kernels could flip."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer(folder, texts)
    torch.manual_seed(0)
    ids = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if kind == "llama":
        config = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            initializer_range=0.3,
            **ids,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=2048, initializer_range=0.3, **ids)
        model = GPT2LMHeadModel(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval().save_pretrained(folder)
    return folder


def sms_texts() -> list[str]:
    import pyarrow.parquet as pq

    folder = Path(__file__).resolve().parents[1] / "sms_spam"
    return [
        t
        for p in sorted(folder.glob("*.parquet"))
        for t in pq.read_table(p, columns=["text"]).column("text").to_pylist()
    ]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "tiny-llama"
    make_tiny_causal("llama", target, sms_texts())
    print(f"wrote {target}")
