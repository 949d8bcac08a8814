"""flash_attn_varlen_func and flash_attn_func (flash-attn 2.8.3 signatures) over torch's varlen_attn.

Shapes as flash-attn's: varlen q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim), cu_seqlens int32
of batch+1 offsets; padded q (batch, seqlen, nheads, headdim). nheads_k may divide nheads (GQA, as Qwen2's 12/2):
k and v are repeated per query head, which the kernel then sees as plain multi-head attention.
"""
import inspect
import math

import torch
from torch.nn.attention.varlen import varlen_attn

_VARLEN_PARAMS = set(inspect.signature(varlen_attn).parameters)


def _unsupported(dropout_p, window_size, softcap, alibi_slopes, return_attn_probs):
    if dropout_p:
        raise NotImplementedError("flash_attn (torchvarlen shim): dropout_p > 0 is not supported")
    if window_size is not None and tuple(window_size) != (-1, -1):
        raise NotImplementedError("flash_attn (torchvarlen shim): sliding-window attention is not supported")
    if softcap:
        raise NotImplementedError("flash_attn (torchvarlen shim): softcap is not supported")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn (torchvarlen shim): ALiBi is not supported")
    if return_attn_probs:
        raise NotImplementedError("flash_attn (torchvarlen shim): return_attn_probs is not supported")


def _scaled(q, softmax_scale):
    """The kernel's scale, or q pre-scaled where this PyTorch's varlen_attn takes none (its default 1/sqrt(d))."""
    default = 1.0 / math.sqrt(q.shape[-1])
    if softmax_scale is None or math.isclose(softmax_scale, default, rel_tol=1e-6):
        return q, {}
    if "scale" in _VARLEN_PARAMS:
        return q, {"scale": softmax_scale}
    return q * (softmax_scale / default), {}


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    _unsupported(dropout_p, window_size, softcap, alibi_slopes, return_attn_probs)
    if block_table is not None:
        raise NotImplementedError("flash_attn (torchvarlen shim): paged KV (block_table) is not supported")
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    q, extra = _scaled(q, softmax_scale)
    if "is_causal" in _VARLEN_PARAMS:
        extra["is_causal"] = bool(causal)
    elif causal:  # PyTorch 2.11's varlen_attn says causal as window_size (-1, 0) (its docstring; no is_causal)
        extra["window_size"] = (-1, 0)
    return varlen_attn(q, k, v, cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32), int(max_seqlen_q),
                       int(max_seqlen_k), **extra)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    batch, seqlen_q = q.shape[:2]
    seqlen_k = k.shape[1]
    cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device=q.device)
    cu_k = torch.arange(0, (batch + 1) * seqlen_k, seqlen_k, dtype=torch.int32, device=q.device)
    out = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
                                 cu_q, cu_k, seqlen_q, seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
                                 alibi_slopes, deterministic, return_attn_probs)
    return out.reshape(batch, seqlen_q, *out.shape[1:])


def flash_attn_with_kvcache(*args, **kwargs):
    """Imported by transformers' flash_attention_2 path (modeling_flash_attention_utils._lazy_imports) beside the two
    above; it serves cached decoding, which training does not run. PyTorch's varlen kernel has no KV-cache form."""
    raise NotImplementedError("flash_attn (torchvarlen shim): flash_attn_with_kvcache (decoding with a KV cache) "
                              "is not supported")
