"""Packed batches: the rows of a batch laid end to end as one sequence, with no padding.

An encoder spends most of its FLOPs in linear layers, which see every token on its own; packed,
they run on real tokens only. Attention must still keep rows apart. On a CUDA GPU with torch's
varlen flash attention (torch >= 2.10, bf16/fp16) one kernel call does that from the rows'
cumulative lengths, on the packed [T, heads, dim] layout itself. Elsewhere (CPU, fp32, older
torch) the rows are re-padded around each attention call (q, k, v gathered into [rows, heads,
longest, dim], SDPA with a key mask, real positions gathered back): copies that cost memory
traffic, not FLOPs. Either way the output is padded again once at the end so pooling and
classification heads see the usual [rows, longest, hidden] layout.

Shapes: T real tokens in a batch, b rows, L the longest row.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .base import Batch

ATTENTION = "batchinfer_packed"
VARLEN_ATTENTION = "batchinfer_varlen"


@functools.cache
def _varlen_attn():
    """torch's flash attention over cumulative lengths (CUDA kernels only), or None. Imported on first use
    on a GPU: the import pulls in torch's compiler and costs most of a second of every CPU run's start."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "scale" in inspect.signature(varlen_attn).parameters else None  # torch 2.9's: no scale


@dataclass
class Packing:
    """Where each row's tokens sit in the packed sequence and in the padded layout."""

    padded: torch.Tensor  # [b, L] index into the T packed tokens; padding repeats token 0
    real: torch.Tensor  # [T] index into the b*L padded positions
    key_mask: torch.Tensor  # [b, 1, 1, L] bool, True for real tokens
    mask: torch.Tensor  # [b, L] int64 attention mask, as a padded batch would have it
    cu_lengths: torch.Tensor  # [b + 1] int32 where each row starts in the packed sequence, then T
    longest: int  # L

    def pad(self, packed: torch.Tensor, zero_padding: bool = True) -> torch.Tensor:
        """[T, *rest] → [b, L, *rest]. Inside attention the padding may hold anything (the key mask
        hides it and unpad drops it), which saves a multiply per q, k and v on the hot path."""
        out = packed[self.padded]
        if not zero_padding:
            return out
        return out * self.mask.view(*self.mask.shape, *(1,) * (out.dim() - 2)).to(out.dtype)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """[b, L, *rest] → [T, *rest]."""
        return padded.reshape(-1, *padded.shape[2:])[self.real]


def pack(batch: Batch, device: torch.device, first_position: int = 0) -> tuple[dict[str, torch.Tensor], Packing]:
    """A packed Batch → model inputs for one packed sequence (token type ids too, for pairs), and the layout to
    undo it.

    first_position: the position id of a row's first token (RoBERTa-family models start after
    their padding index)."""
    lengths, total, longest = batch.lengths, len(batch.ids), batch.mask.shape[1]
    starts = batch.cu_lengths[:-1].astype(np.int64)
    positions = np.arange(total) - np.repeat(starts, lengths) + first_position  # restarts for every row
    column = np.arange(longest)
    padded = np.where(batch.mask.astype(bool), starts[:, None] + column[None, :], 0)
    real = np.flatnonzero(batch.mask.reshape(-1))

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    mask = tensor(batch.mask)
    inputs = {"input_ids": tensor(batch.ids[None]), "position_ids": tensor(positions[None])}
    if batch.type_ids is not None:
        inputs["token_type_ids"] = tensor(batch.type_ids[None])
    return inputs, Packing(
        tensor(padded), tensor(real), mask.bool()[:, None, None, :], mask, tensor(batch.cu_lengths), longest
    )


def packed_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    is_causal=None,
    packing: Packing | None = None,
    **kwargs,
):
    """transformers attention interface: [1, heads, T, dim] in, [1, T, heads, dim] out."""
    if packing is None:
        raise RuntimeError("packed attention called without a packing layout")

    def padded(x: torch.Tensor) -> torch.Tensor:  # [1, heads, T, d] → [b, heads, L, d]
        return packing.pad(x[0].transpose(0, 1), zero_padding=False).transpose(1, 2)

    out = F.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=packing.key_mask, scale=scaling
    )
    return packing.unpad(out.transpose(1, 2))[None], None


def varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    is_causal=None,
    packing: Packing | None = None,
    **kwargs,
):
    """transformers attention interface over torch's varlen flash attention: [1, heads, T, dim] in,
    [1, T, heads, dim] out, with no re-padding."""
    if packing is None:
        raise RuntimeError("packed attention called without a packing layout")

    def tokens_first(x: torch.Tensor) -> torch.Tensor:  # [1, heads, T, d] → [T, heads, d], a view
        return x[0].transpose(0, 1)

    out = _varlen_attn()(
        tokens_first(query),
        tokens_first(key),
        tokens_first(value),
        packing.cu_lengths,
        packing.cu_lengths,
        packing.longest,
        packing.longest,
        scale=scaling,
    )
    return out[None], None


@functools.cache
def _register_attention() -> None:
    """Both attention functions in transformers' registry, on the first packed batch: importing transformers'
    modeling code costs 1.5 s of start-up that a job run on OpenVINO does not need."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)


def varlen_supported(model, device: torch.device) -> bool:
    """Whether packed attention can be one varlen flash-attention call: torch has the kernel, the
    device is a CUDA GPU with flash attention (sm80 or newer), the weights are bf16 or fp16, and
    the head size is a multiple of 8 up to 256."""
    if device.type != "cuda" or model.dtype not in (torch.bfloat16, torch.float16) or _varlen_attn() is None:
        return False
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    return (
        head_dim % 8 == 0
        and head_dim <= 256
        and torch.backends.cuda.is_flash_attention_available()
        and torch.cuda.get_device_capability(device) >= (8, 0)
    )


@contextmanager
def packed_forward(model, packing: Packing):
    """Run `model` on packed inputs: attention goes through `varlen_attention` where the device and
    model allow it, else `packed_attention`, and the encoder's output is padded back to
    [b, L, hidden] (pooler output recomputed) before any head sees it."""
    base = model.base_model
    config = model.config
    previous = config._attn_implementation

    def repad(_module, _args, output):
        output.last_hidden_state = packing.pad(output.last_hidden_state[0])
        if getattr(output, "pooler_output", None) is not None:
            output.pooler_output = _pooled(base, output.last_hidden_state)
        return output

    _register_attention()
    handle = base.register_forward_hook(repad)
    config._attn_implementation = VARLEN_ATTENTION if varlen_supported(model, packing.mask.device) else ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous
        handle.remove()


def _pooled(base, hidden: torch.Tensor) -> torch.Tensor:
    if hasattr(base, "pooler_activation"):  # ALBERT: a bare Linear on the first token
        return base.pooler_activation(base.pooler(hidden[:, 0]))
    return base.pooler(hidden)  # BertPooler and kin pick the first token themselves


# Encoder families checked to give padded results when packed (tests/test_packing.py): absolute
# positions taken from position_ids, attention through transformers' attention interface, and no
# layer that mixes neighbouring tokens outside attention (MobileBERT's trigram embeddings do) or
# masks by position (ModernBERT's sliding window).
PACKABLE = ("bert", "distilbert", "electra", "albert")
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")


def first_position(config) -> int:
    """RoBERTa-family position ids start at padding_idx + 1."""
    return config.pad_token_id + 1 if config.model_type in ROBERTA_FAMILY else 0


def supports_packing(model) -> str | None:
    """None if `model` can run packed batches, else why not."""
    config = model.config
    if config.model_type not in PACKABLE and config.model_type not in ROBERTA_FAMILY:
        return (
            f"model type {config.model_type!r} is not one packing is checked for "
            f"({', '.join(sorted([*PACKABLE, *ROBERTA_FAMILY]))})"
        )
    if getattr(config, "is_decoder", False) or not getattr(model, "_supports_attention_backend", False):
        return f"{type(model).__name__} does not route its attention through transformers' attention interface"
    return None
