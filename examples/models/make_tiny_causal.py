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


def save_random_causal(folder: Path, tokenizer, kind: str = "llama", bos=None, eos=None, **sizes):
    """A causal LM (kind: llama or gpt2) with random weights (seed 0) for `tokenizer`, its end and padding
    tokens set for generation too, saved in `folder`. bos, eos: token ids (default: the tokenizer's).
    sizes: the config's own fields. Returns the model."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    bos = tokenizer.bos_token_id if bos is None else bos
    eos = tokenizer.eos_token_id if eos is None else eos
    config, cls = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (GPT2Config, GPT2LMHeadModel)
    torch.manual_seed(0)
    model = cls(
        config(
            vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, **sizes
        )
    )
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval().save_pretrained(folder)
    return model


def make_tiny_causal(kind: str, folder: Path, texts: list[str]) -> Path:
    """kind: llama or gpt2. A wide init gives peaked logits, so greedy decoding has no near-ties that
    float noise between attention kernels could flip."""
    tokenizer = make_tokenizer(folder, texts)
    if kind == "llama":
        sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
        sizes.update(num_key_value_heads=2, max_position_embeddings=2048)
    else:
        sizes = dict(n_embd=64, n_layer=2, n_head=4, n_positions=2048)
    save_random_causal(folder, tokenizer, kind, initializer_range=0.3, **sizes)
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
