"""Model FLOPs and MFU, computed exactly as verl's `FlopsCounter` does so the numbers compare.

Source: verl 0.9.1 `verl/utils/flops_counter.py`, `_estimate_qwen2_flops` (lines 92-124, used for
qwen2/qwen3/llama/mistral) and `_estimate_qwen2_moe_flops` (lines 417-451, qwen2_moe/qwen3_moe).
verl's MFU (`workers/engine_workers.py:228-235`) is
    estimated_flops / promised_flops / world_size, divided by 3 for forward-only passes.
Derivation, per token: a matmul with N weights costs 2N FLOPs forward and 4N backward, so 6N per
trained token; causal attention adds 6 * seqlen * head_dim * heads * layers per token (verl's term;
it differs from PaLM's 12*L*H*Q*T, see verl issue #1076). The embedding and LM head are both counted
(vocab * hidden * 2) even when tied, as verl does. Recompute from checkpointing is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.models import ModelSpec

_DENSE_TYPES = {"qwen2", "qwen3", "llama", "mistral"}
# gpt_oss: _estimate_gpt_oss_flops (same terms; its sliding-window layers are counted at full length here).
# mixtral has no verl formula (verl reports MFU 0 for it); the qwen2_moe terms are the same SwiGLU experts.
_MOE_TYPES = {"qwen2_moe", "qwen3_moe", "gpt_oss", "mixtral"}
# _estimate_deepseek_v3_flops (MLA linear terms, shared experts, first_k_dense_replace dense layers);
# deepseek_v2 has no verl formula and the same shapes, so the same terms.
_MLA_TYPES = {"deepseek_v3", "deepseek_v2"}


def verl_dense_n(model: ModelSpec) -> int:
    """verl's "dense_N": the weight count whose 6x is FLOPs per trained token (active experts only)."""
    if model.model_type not in _DENSE_TYPES | _MOE_TYPES | _MLA_TYPES:
        raise ValueError(f"verl has no FLOPs formula for model_type={model.model_type!r}")
    h, d = model.hidden_size, model.head_dim
    emb_and_lm_head_n = model.vocab_size * h * 2
    if model.model_type in _MLA_TYPES:
        q_head = model.qk_nope_head_dim + model.qk_rope_head_dim
        attn = (h * model.q_lora_rank + model.num_heads * q_head * model.q_lora_rank if model.q_lora_rank
                else h * model.num_heads * q_head)
        attn += h * (model.kv_lora_rank + model.qk_rope_head_dim)
        attn += model.num_heads * (model.qk_nope_head_dim + model.v_head_dim) * model.kv_lora_rank
        attn += model.num_heads * model.v_head_dim * h
        moe = h * model.num_experts + h * model.moe_intermediate_size * (model.num_experts_per_tok
                                                                        + model.n_shared_experts) * 3
        dense = h * model.intermediate_size * 3
        return ((moe + attn) * model.moe_layers + (dense + attn) * (model.num_layers - model.moe_layers)
                + emb_and_lm_head_n)
    attn_linear_n = h * (model.num_heads * d + 2 * model.num_kv_heads * d + model.num_heads * d)
    if model.model_type in _MOE_TYPES:
        mlp_n = h * model.num_experts_per_tok * model.moe_intermediate_size * 3 + h * model.num_experts
    else:
        mlp_n = h * model.intermediate_size * 3
    return (mlp_n + attn_linear_n) * model.num_layers + emb_and_lm_head_n


def train_flops(model: ModelSpec, seqlens: Sequence[int]) -> float:
    """FLOPs of one forward+backward over sequences of these lengths (verl's estimate_flops numerator)."""
    tokens = sum(seqlens)
    seqlen_square_sum = sum(s * s for s in seqlens)
    dense = 6 * verl_dense_n(model) * tokens
    attn = 6 * seqlen_square_sum * model.attn_core_head_dim * model.num_heads * model.num_layers
    return float(dense + attn)


def forward_flops(model: ModelSpec, seqlens: Sequence[int]) -> float:
    """Forward-only pass (log-prob): verl divides the training MFU by 3 for these."""
    return train_flops(model, seqlens) / 3.0


def train_flops_uniform(model: ModelSpec, num_seqs: float, seqlen: float, seqlen_sq: float | None = None) -> float:
    """`train_flops` for `num_seqs` sequences of mean length `seqlen`, without building a list: attention counts
    each sequence's own length squared (the sum of squares above), so `seqlen_sq`, the mean of the squared lengths,
    where they vary (default: all of one length)."""
    dense = 6 * verl_dense_n(model) * num_seqs * seqlen
    sq = seqlen * seqlen if seqlen_sq is None else seqlen_sq
    attn = 6 * num_seqs * sq * model.attn_core_head_dim * model.num_heads * model.num_layers
    return float(dense + attn)


def mfu(flops: float, seconds: float, n_gpus: int, peak_flops_per_gpu: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the promised FLOP/s of all GPUs."""
    if seconds <= 0 or n_gpus <= 0 or peak_flops_per_gpu <= 0:
        raise ValueError(f"mfu needs positive time, GPUs and peak, but got {seconds=}, {n_gpus=}, {peak_flops_per_gpu=}")
    return flops / seconds / (peak_flops_per_gpu * n_gpus)
