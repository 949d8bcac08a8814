"""GRPO maths, log-prob and entropy kernels, and the packed (remove-padding) attention function."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.nn.functional as F

# verl actor defaults (verl 0.9.1 actor/actor.yaml): PPO clip 0.2, dual-clip c=3, KL loss coefficient 0.001
# (low_var_kl).
CLIP_RATIO = 0.2
CLIP_RATIO_C = 3.0
KL_LOSS_COEF = 0.001
# Tokens per fp32 log-softmax chunk: 2048 x 152k vocab x 4 bytes = 1.2 GiB transient at most. On CUDA the
# kernels are fused (no fp32 tensor), so a chunk bounds only the bf16 gradient written back: 8192 x 152k x 2
# bytes = 2.3 GiB.
LOGPROB_CHUNK_TOKENS = 2048
LOGPROB_CUDA_CHUNK_TOKENS = 8192


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps) per group of rollout.n consecutive trajectories.

    verl trainer/ppo/core_algos.py compute_grpo_outcome_advantage (norm_adv_by_std_in_grpo=True,
    unbiased std, a group of one gets mean 0 and std 1). A trailing partial group is its own group.
    """
    advantages = torch.empty_like(rewards, dtype=torch.float32)
    for start in range(0, rewards.numel(), group_size):
        group = rewards[start:start + group_size].float()
        mean = group.mean() if group.numel() > 1 else group.new_zeros(())
        std = group.std() if group.numel() > 1 else group.new_ones(())
        advantages[start:start + group_size] = (group - mean) / (std + eps)
    return advantages


def low_var_kl(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """verl core_algos.kl_penalty "low_var_kl" (k3 estimator, clamped to [-10, 10])."""
    kl = ref_log_prob - log_prob
    ratio = torch.exp(kl)
    return torch.clamp(ratio - kl - 1, min=-10, max=10)


def grpo_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
              ref_log_prob: torch.Tensor | None) -> torch.Tensor:
    """Dual-clip PPO loss, token-mean (verl compute_policy_loss_vanilla), plus the KL loss term."""
    adv = advantages[:, None]
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP_RATIO, 1 + CLIP_RATIO))
    dual_clipped = torch.minimum(-adv * CLIP_RATIO_C, clipped)
    pg_loss = torch.where(adv < 0, dual_clipped, clipped).mean()
    if ref_log_prob is None:
        return pg_loss
    return pg_loss + KL_LOSS_COEF * low_var_kl(log_prob, ref_log_prob).mean()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """verl utils/torch_functional.py entropy_from_logits, upcast to fp32."""
    logits = logits.float()
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def _lse_and_label_logit(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-sum-exp of each row and the label's logit; the fp32 upcast is fused away when compiled."""
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1), logits.gather(-1, labels[:, None]).squeeze(-1)


def _label_log_prob_grad(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                         grad: torch.Tensor) -> torch.Tensor:
    """d log p(label) / d logits = onehot(label) - softmax(logits), scaled by the incoming gradient."""
    probs = torch.exp(logits.float() - lse[:, None])
    onehot = torch.zeros_like(probs).scatter_(-1, labels[:, None], 1.0)
    return ((onehot - probs) * grad[:, None]).to(logits.dtype)


_compiled: dict[str, Callable] = {}


def _kernel(fn: Callable, cuda: bool) -> Callable:
    """`fn` compiled once per process on CUDA (dynamic: micro-batches vary in tokens), eager elsewhere."""
    if not cuda:
        return fn
    if fn.__name__ not in _compiled:
        _compiled[fn.__name__] = torch.compile(fn, dynamic=True)
    return _compiled[fn.__name__]


class _LabelLogProbs(torch.autograd.Function):
    """log p(label) in fp32 arithmetic over bf16 logits, with verl's memory behaviour: no fp32 copy of the
    logits is kept, and backward writes the logits' gradient over the logits themselves (flash-attn's
    cross_entropy_loss with inplace_backward=True, as verl's logprobs_from_logits calls it:
    verl/utils/torch_functional.py), so training never holds a second logits-sized tensor. Chunks of rows
    bound the fp32 temporaries."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        lse_fn = _kernel(_lse_and_label_logit, logits.is_cuda)
        parts = [lse_fn(logits[s:s + chunk_rows], labels[s:s + chunk_rows])
                 for s in range(0, logits.shape[0], chunk_rows)]
        lse = torch.cat([p[0] for p in parts])
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_rows = chunk_rows
        return torch.cat([p[1] for p in parts]) - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad_fn, rows = _kernel(_label_log_prob_grad, logits.is_cuda), ctx.chunk_rows
        for s in range(0, logits.shape[0], rows):
            logits[s:s + rows].copy_(grad_fn(logits[s:s + rows], labels[s:s + rows], lse[s:s + rows],
                                             grad[s:s + rows]))
        return logits, None, None


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> torch.Tensor:
    """log p(label) for [N, V] logits (see _LabelLogProbs): Inductor-fused kernels on CUDA, eager on the CPU."""
    return _LabelLogProbs.apply(logits, labels, chunk_tokens if not logits.is_cuda else LOGPROB_CUDA_CHUNK_TOKENS)


# verl's fused log-prob (model.use_fused_kernels, impl_backend torch): FusedLinearForPPO's chunk_size default
# (verl/utils/experimental/torch_functional.py:104, 221)
FUSED_CHUNK_TOKENS = 512


def fused_log_probs(hidden: torch.Tensor, lm_head: Callable, labels: torch.Tensor, entropy_fn: Callable | None,
                    chunk_tokens: int = FUSED_CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) (and the entropy) of [N, H] hidden states through the LM head, `chunk_tokens` rows at a time,
    as verl's fused kernels compute them (utils/experimental/torch_functional.py:36-58, 130-150): each chunk's
    logits in fp32, log_softmax and gather, then dropped; backward recomputes a chunk's logits from its hidden rows
    (:183-206), here through activation checkpointing. The whole logits never exist."""
    from torch.utils.checkpoint import checkpoint

    def part(h: torch.Tensor, y: torch.Tensor):
        logits = lm_head(h).float()
        log_p = logits.log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
        return (log_p, entropy_fn(logits)) if entropy_fn is not None else (log_p,)

    parts = [checkpoint(part, hidden[s:s + chunk_tokens], labels[s:s + chunk_tokens], use_reentrant=False)
             for s in range(0, hidden.shape[0], chunk_tokens)]
    log_probs = torch.cat([p[0] for p in parts])
    return log_probs, (torch.cat([p[1] for p in parts]) if entropy_fn is not None else None)


def chunked_entropy(logits: torch.Tensor, entropy_fn: Callable, chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> torch.Tensor:
    return torch.cat([entropy_fn(logits[s:s + chunk_tokens]) for s in range(0, logits.shape[0], chunk_tokens)])


PACKED_ATTENTION = "autotune_packed"


def _varlen_kwargs() -> dict:
    """Causal flag for torch's varlen_attn across versions: 2.9-2.11 take is_causal, later ones a
    window (-1, 0); GQA is native in the flash kernel, explicit (enable_gqa) where the keyword exists."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kwargs = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs


def varlen_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                            max_seqlen: int, scale: float | None) -> torch.Tensor:
    """Causal attention within each packed sequence; [T, H, D] in and out, sequences delimited by
    cu_seqlens (flash-attn's varlen convention, which verl's remove-padding path uses)."""
    if query.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        dtype = query.dtype
        if dtype not in (torch.bfloat16, torch.float16):  # flash kernels take half precision only (as HF casts)
            query, key, value = (t.to(torch.bfloat16) for t in (query, key, value))
        out = varlen_attn(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale,
                          **_varlen_kwargs())
        return out.to(dtype)
    # CPU (tests): the same maths one sequence at a time
    bounds = cu_seqlens.tolist()
    pieces = [F.scaled_dot_product_attention(query[a:b].transpose(0, 1), key[a:b].transpose(0, 1),
                                             value[a:b].transpose(0, 1), is_causal=True, scale=scale,
                                             enable_gqa=True).transpose(0, 1)
              for a, b in zip(bounds[:-1], bounds[1:])]
    return torch.cat(pieces)


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers attention function (AttentionInterface): varlen attention over one packed row when
    the forward passes cu_seq_lens_q (flash-attn kwarg names), plain sdpa otherwise."""
    if cu_seq_lens_q is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q, k, v = (t.squeeze(0).transpose(0, 1) for t in (query, key, value))  # [1, H, T, D] -> [T, H, D]
    return varlen_causal_attention(q, k, v, cu_seq_lens_q, int(max_length_q), scaling).unsqueeze(0), None


def register_packed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
