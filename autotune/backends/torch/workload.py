"""One GRPO-shaped step loop on real transformers modules: the measuring half of `--backend torch`.

Run as `python -m autotune.backends.torch.workload --request request.json --out result.json`
(under `torchrun` for several GPUs). `TorchRunner` (torch_runner.py) writes the request, reads one
JSON line per finished step from stdout, and turns the result file or the exit code into a
ProbeResult or a ProbeError. The file protocol and exit codes live in torch_runner.py so the parent
never imports torch.

A step mirrors verl 0.9.1's sync trainer (`trainer/ppo/v1/trainer_base.py`), phase names as its
`timing_s/<name>` metrics:
  gen             batched sampling with a KV cache whose size follows vLLM's block budget
  old_log_prob    actor forward only, log-probs and entropy of the response tokens
  ref             reference model forward only (only when workload.use_kl_loss)
  update_actor    GRPO clipped policy-gradient loss + low_var_kl, grad accumulation, AdamW
  update_weights  actor -> rollout weight copy
Weights are random (speed and memory do not depend on them); nothing is downloaded. The maths is
GRPO's, but its numbers are not the point: shapes, memory and FLOPs are.

Choices that differ from verl, each because the real thing needs a package we do not assume:
- Packing as verl's `use_remove_padding`: a micro-batch is one row of concatenated sequences with
  position ids restarting per sequence, and attention runs PyTorch's flash-attention varlen kernel
  (`torch.nn.attention.varlen.varlen_attn`, registered with transformers as an attention function)
  over the sequence boundaries, as verl's flash-attn `unpad_input` path does. FLOPs and activation
  memory follow the real tokens, not a padded width. On the CPU (tests) the same function runs one
  causal sdpa per sequence. `use_remove_padding=False` pads every row to prompt+response max like verl.
- Log-probs: verl uses flash-attn's Triton cross-entropy kernel when flash-attn is installed
  (verl/utils/torch_functional.py `logprobs_from_logits`): one fused pass over the bf16 logits in
  fp32 arithmetic forward and one backward that writes the gradient over the logits in place, so no
  fp32 copy and no second logits-sized tensor exist. On CUDA the same maths is compiled by Inductor
  into fused Triton kernels (compiled once per probe, in its untimed warm-up step), with the same
  in-place backward. On the CPU it runs eagerly a chunk of tokens at a time, with the same result.
- Rollout uses HF modules, not vLLM, so decode is far slower than vLLM (calibration README); the KV
  budget, concurrency limit, chunked prefill and the "no cache blocks" failure follow vLLM. Prompts
  of a wave are left-padded to the wave's longest. rollout_tp > 1 is emulated in memory (weights
  and KV heads split, one GPU's share of the replica's sequences), not in time: decode here reads
  all the weights on one GPU.
- One process stands for one GPU of an N-GPU job: it does 1/dp of the step's trajectories but holds
  a whole actor (FSDP2 over a world of one, as verl wraps even one GPU), so its memory is an upper
  bound on FSDP's unless it runs under torchrun with the job's real GPU count, where the actor is
  sharded over every rank.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import re
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from autotune.hardware import GIB
from autotune.models import ModelSpec, get_model
from autotune.model.flops import mfu, train_flops
from autotune.model.memory import kv_bytes_per_token, vllm_kv_budget_bytes
from autotune.backends.torch.runner import (
    EXIT_ENVIRONMENT,
    EXIT_KV_CACHE_TOO_SMALL,
    EXIT_OOM,
    EXIT_REJECTED,
    PHASES,
    rank_result_path,
)
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload
from autotune.verl.roles import need_reference_policy, separate_reference

# verl actor defaults (verl 0.9.1 actor/actor.yaml, optim/fsdp.yaml): PPO clip 0.2, dual-clip c=3,
# KL loss coefficient 0.001 (low_var_kl), grad clip 1.0, AdamW lr 1e-6 and weight decay 0.01.
CLIP_RATIO = 0.2
CLIP_RATIO_C = 3.0
KL_LOSS_COEF = 0.001
GRAD_CLIP = 1.0
LR = 1e-6
WEIGHT_DECAY = 0.01
# Tokens per fp32 log-softmax chunk: 2048 x 152k vocab x 4 bytes = 1.2 GiB transient at most. On CUDA the
# kernels are fused (no fp32 tensor), so a chunk bounds only the bf16 gradient written back: 8192 x 152k x 2
# bytes = 2.3 GiB.
LOGPROB_CHUNK_TOKENS = 2048
LOGPROB_CUDA_CHUNK_TOKENS = 8192


# ----------------------------------------------------------------------------------------------
# The request
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WorkloadRequest:
    """request.json, parsed. `gpus_per_node` x `nodes` is the job being measured, which sets dp."""

    model: ModelSpec
    workload: Workload
    candidate: Candidate
    gpus_per_node: int
    nodes: int
    warmup_steps: int
    timed_steps: int
    device: str  # "cuda" or "cpu"
    peak_flops_per_gpu: float
    seed: int
    scale_trajectories: int | None  # trajectories this process handles per step
    device_mem_gib: float | None  # total device memory for vLLM's budget; None: ask the device
    test_raise_oom_in: str | None  # test double: raise torch.OutOfMemoryError in this phase

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout.of(self.candidate, self.workload, gpus_per_node=self.gpus_per_node, nodes=self.nodes)


def parse_request(data: dict) -> WorkloadRequest:
    override = data.get("shape_override") or {}
    # a config.json model has no table entry: its whole spec travels in shape_override (torch_runner)
    model = ModelSpec(**override) if len(override) == len(fields(ModelSpec)) else get_model(data["model"])
    if override:
        model = replace(model, **data["shape_override"])
    scale = data.get("scale") or {}
    oom_phase = data.get("test_raise_oom_in")
    if oom_phase is not None and oom_phase not in PHASES:
        raise ValueError(f"test_raise_oom_in must be one of {PHASES}, but got {oom_phase=}")
    timed_steps = int(data.get("timed_steps", 2))
    if timed_steps < 1:
        raise ValueError(f"timed_steps must be >= 1 (the result is their median), but got {timed_steps=}")
    return WorkloadRequest(
        model=model,
        workload=Workload(**data.get("workload", {})),
        candidate=Candidate(**data.get("candidate", {})),
        gpus_per_node=int(data.get("gpus_per_node", 1)),
        nodes=int(data.get("nodes", 1)),
        warmup_steps=int(data.get("warmup_steps", 1)),
        timed_steps=timed_steps,
        device=data.get("device", "cuda"),
        peak_flops_per_gpu=float(data["peak_flops_per_gpu"]),
        seed=int(data.get("seed", 0)),
        scale_trajectories=scale.get("trajectories"),
        device_mem_gib=data.get("device_mem_gib"),
        test_raise_oom_in=oom_phase,
    )


# ----------------------------------------------------------------------------------------------
# Batch plan: pure arithmetic, no tensors
# ----------------------------------------------------------------------------------------------


class ConfigRejected(ValueError):
    """A configuration verl itself refuses at its first step; reported as a rejection, not a crash."""


def local_trajectories(layout: ParallelLayout, scale_trajectories: int | None) -> int:
    """Trajectories one rank handles per step: train_batch_size*n / dp, or the probe's scale."""
    if scale_trajectories is not None:
        return max(1, int(scale_trajectories))
    if layout.dp < 1:
        raise ConfigRejected(f"the job's {layout.world_size} GPUs do not divide into data-parallel ranks "
                         f"(model_parallel={layout.model_parallel})")
    return max(1, int(layout.trajectories_per_rank))


def mini_batch_sizes(n_trajectories: int, layout: ParallelLayout) -> list[int]:
    """Per-rank mini-batches: ppo_mini_batch_size*n/dp each (engine_workers.py train_mini_batch).

    A scaled-down probe keeps the mini-batch size (so micro-batch shapes and gradient accumulation
    match the job) and runs fewer of them; a remainder becomes a last, smaller mini-batch.
    """
    per_rank = max(1, int(layout.mini_batch_per_rank))
    full, rest = divmod(n_trajectories, per_rank)
    return [per_rank] * full + ([rest] if rest else [])


def static_micro_batches(indices: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Fixed-count micro-batches (verl workers/engine/utils.py, static path)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro-batch size must be >= 1, but got {micro_batch_size=}")
    return [list(indices[i:i + micro_batch_size]) for i in range(0, len(indices), micro_batch_size)]


def seqlen_workload(length: int) -> int:
    """verl's balancing weight of one sequence (utils/seqlen_balancing.py calculate_workload)."""
    return 24576 * length + length * length


def pack_by_token_budget(lengths: dict[int, int], max_tokens: int, *, padded: bool = False) -> list[list[int]]:
    """use_dynamic_bsz micro-batches as verl 0.9.1 forms them (utils/seqlen_balancing.py
    rearrange_micro_batches): ceil(total / max_tokens) micro-batches, sequences balanced across them by
    workload, one more micro-batch until none is over the bound. So with 1.4 budgets of tokens, two
    micro-batches of 0.7 budgets each run, not one full and one small.

    verl balances with Karmarkar-Karp; this takes the longest-processing-time greedy, which balances
    as closely on GRPO's many similar lengths. Packed (use_remove_padding) micro-batches are bounded by
    their real tokens, verl's bound; padded ones by the tensor we build, rows x longest.
    """
    too_long = max(lengths.values(), default=0)
    if too_long > max_tokens:
        # verl utils/seqlen_balancing.py:384-386
        raise ConfigRejected(f"max_token_len must be greater than the sequence length. "
                             f"Got max_token_len={max_tokens} and max_seq_len={too_long}")
    if not lengths:
        return []

    def cost(batch: list[int]) -> int:
        return len(batch) * max(lengths[i] for i in batch) if padded else sum(lengths[i] for i in batch)

    order = sorted(lengths, key=lambda i: (-seqlen_workload(lengths[i]), i))
    count = min(len(lengths), -(-sum(lengths.values()) // max_tokens))
    while True:
        bins: list[list[int]] = [[] for _ in range(count)]
        loads = [0] * count
        for index in order:
            lightest = min(range(count), key=lambda b: (loads[b], b))
            bins[lightest].append(index)
            loads[lightest] += seqlen_workload(lengths[index])
        if all(cost(b) <= max_tokens for b in bins):
            return [sorted(b) for b in bins]
        count += 1


def micro_batches(indices: Sequence[int], lengths: dict[int, int], *, dynamic: bool, micro_batch_size: int,
                  max_tokens: int, padded: bool = False) -> list[list[int]]:
    """Micro-batches of one pass over `indices`: by count, or by token budget when dynamic."""
    if dynamic:
        return pack_by_token_budget({i: lengths[i] for i in indices}, max_tokens, padded=padded)
    return static_micro_batches(list(indices), micro_batch_size)  # in order, as verl splits a batch


def sample_prompt_lengths(rng: random.Random, count: int, workload: Workload) -> list[int]:
    """Prompt lengths uniform around prompt_fill*max_prompt_length (symmetric, so the mean holds)."""
    mean = workload.prompt_fill * workload.max_prompt_length
    half_width = min(mean - 1, workload.max_prompt_length - mean, 0.5 * mean)
    low, high = mean - half_width, mean + half_width
    return [max(1, min(workload.max_prompt_length, round(rng.uniform(low, high)))) for _ in range(count)]


# ----------------------------------------------------------------------------------------------
# Rollout memory: vLLM's KV block budget
# ----------------------------------------------------------------------------------------------


class KvCacheTooSmall(Exception):
    """vLLM refuses to start: the KV budget cannot hold one sequence."""

    def __init__(self, message: str, *, over_gib: float | None) -> None:
        super().__init__(message)
        self.over_gib = over_gib


def kv_cache_budget_bytes(total_mem_bytes: float, model: ModelSpec, candidate: Candidate) -> float:
    """gpu_memory_utilization x total memory, less the weights and vLLM's profile run (v1
    gpu_worker.determine_available_memory), on one GPU of a replica: the sim backend's own function."""
    return vllm_kv_budget_bytes(model, candidate, total_mem_bytes)


def check_kv_cache(budget_bytes: float, model: ModelSpec, candidate: Candidate, max_model_len: int) -> None:
    """vLLM's start-up check (v1/core/kv_cache_utils.py check_enough_kv_cache_memory), same words."""
    if budget_bytes <= 0:
        raise KvCacheTooSmall("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                              "when initializing the engine.", over_gib=-budget_bytes / GIB)
    needed = max_model_len * kv_bytes_per_token(model, max(1, candidate.rollout_tp))
    if needed > budget_bytes:
        raise KvCacheTooSmall(
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget_bytes / GIB:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.", over_gib=(needed - budget_bytes) / GIB)


def rollout_concurrency(budget_bytes: float, model: ModelSpec, candidate: Candidate, workload: Workload) -> int:
    """Sequences decoded together on this GPU's share: min(max_num_seqs, KV capacity) / rollout_tp.

    A TP-k vLLM replica holds (budget / per-GPU KV bytes per sequence) sequences for k GPUs' share of
    the batch, so one GPU's share runs 1/k of them; KV per sequence uses the mean prompt length
    (vLLM allocates blocks as tokens arrive; every response runs to max_response_length here).
    """
    check_kv_cache(budget_bytes, model, candidate, workload.seq_len)
    per_seq_bytes = kv_bytes_per_token(model, max(1, candidate.rollout_tp)) * workload.mean_seq_len
    replica_seqs = min(candidate.max_num_seqs, int(budget_bytes // per_seq_bytes))
    return max(1, replica_seqs // max(1, candidate.rollout_tp))


# ----------------------------------------------------------------------------------------------
# GRPO maths
# ----------------------------------------------------------------------------------------------


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


def chunked_entropy(logits: torch.Tensor, entropy_fn: Callable, chunk_tokens: int = LOGPROB_CHUNK_TOKENS) -> torch.Tensor:
    return torch.cat([entropy_fn(logits[s:s + chunk_tokens]) for s in range(0, logits.shape[0], chunk_tokens)])


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build weights directly in `dtype`; `from_config`'s dtype keyword is torch_dtype in 4.x, dtype in 5.x."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


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


def _register_packed_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)


def build_causal_lm(model: ModelSpec, *, dtype: torch.dtype, device: torch.device, max_len: int,
                    attention: str = "sdpa"):
    """The model's transformers class from the model table, random weights."""
    import transformers

    transformers.logging.set_verbosity_error()
    if attention == PACKED_ATTENTION:
        _register_packed_attention()
    cls = getattr(transformers, model.architecture)
    config = cls.config_class(**model.hf_config(), attn_implementation=attention,
                              max_position_embeddings=max(max_len, 32768), use_cache=False)
    with _default_dtype(dtype), torch.device(device):
        return cls(config)


def apply_liger(lm) -> None:
    """Liger's RMSNorm, SwiGLU and RoPE Triton kernels on this instance, exactly as verl applies them
    (engine/fsdp/transformer_impl.py:307-316: fused_linear_cross_entropy=False, swiglu=True)."""
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=lm, fused_linear_cross_entropy=False, swiglu=True)


def enable_gradient_checkpointing(lm) -> None:
    """Non-reentrant, as verl (engine/fsdp/transformer_impl.py); transformers 5.2x renamed the method."""
    if hasattr(lm, "activation_checkpointing_enable"):
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _cache_kwarg(decoder) -> str:
    """transformers 5.2x renamed the decoder's `past_key_values` argument to `cache`."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class MicroBatch:
    """One forward's input. Packed: input_ids [1, sum of lengths] with per-sequence position ids and
    cu_seqlens. Padded: [B, T] right-padded rows. `targets` [B, R] index the flattened [B*T] logits
    at the positions that predict each response token."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0

    def decoder_kwargs(self) -> dict:
        if self.cu_seqlens is None:
            return {}
        return {"position_ids": self.position_ids, "cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_seqlen, "max_length_k": self.max_seqlen}


def packed_micro_batch(sequences: Sequence[torch.Tensor], prompt_lengths: Sequence[int], response_length: int,
                       device: torch.device) -> MicroBatch:
    """Concatenate sequences into one row (verl's remove-padding layout)."""
    lengths = [seq.numel() for seq in sequences]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    ids = torch.cat(list(sequences)).to(device)[None, :]
    position_ids = torch.cat([torch.arange(length, device=device) for length in lengths])[None, :]
    starts = torch.tensor([o + p - 1 for o, p in zip(offsets, prompt_lengths)], device=device)
    targets = starts[:, None] + torch.arange(response_length, device=device)[None, :]
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=device)
    return MicroBatch(ids, targets, position_ids, cu_seqlens, max(lengths))


def padded_micro_batch(sequences: Sequence[torch.Tensor], prompt_lengths: Sequence[int], response_length: int,
                       width: int, device: torch.device) -> MicroBatch:
    """Right-padded rows of `width` tokens; causal attention never looks ahead, so no mask is needed."""
    ids = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, :seq.numel()] = seq
    starts = torch.tensor(prompt_lengths, device=device) - 1 + torch.arange(len(sequences), device=device) * width
    targets = starts[:, None] + torch.arange(response_length, device=device)[None, :]
    return MicroBatch(ids, targets)


class PolicyHead(torch.nn.Module):
    """Decoder + LM head -> log-probs (and entropy) of the response tokens, one module so FSDP2 can shard it.

    Logits are computed for every position as verl's forward does (the LM head FLOPs verl counts),
    in bf16; only the fp32 log-softmax is chunked.
    """

    def __init__(self, lm, entropy_fn: Callable) -> None:
        super().__init__()
        self.lm = lm
        self.entropy_fn = entropy_fn

    def forward(self, batch: MicroBatch, with_entropy: bool = False):
        hidden = self.lm.get_decoder()(input_ids=batch.input_ids, use_cache=False,
                                       **batch.decoder_kwargs()).last_hidden_state
        logits = self.lm.get_output_embeddings()(hidden)
        vocab = logits.shape[-1]
        # next token of each position; a sequence's last position (unused) reads its neighbour's first
        labels = torch.roll(batch.input_ids, shifts=-1, dims=1).reshape(-1)
        flat = logits.reshape(-1, vocab)
        log_probs = token_log_probs(flat, labels)[batch.targets]
        if not with_entropy:
            return log_probs, None
        return log_probs, chunked_entropy(flat, self.entropy_fn)[batch.targets]


def make_entropy_fn(candidate: Candidate) -> Callable:
    # verl 0.9.1 reads fsdp_config.use_torch_compile and compiles only entropy_from_logits
    # (engine/fsdp/transformer_impl.py:183-187, torch.compile(..., dynamic=True)); the model is eager.
    if candidate.use_torch_compile:
        return torch.compile(entropy_from_logits, dynamic=True)
    return entropy_from_logits


# ----------------------------------------------------------------------------------------------
# Devices, memory and clocks
# ----------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mem_gib(device: torch.device) -> float:
    """CUDA: max_memory_allocated (verl's actor/perf/max_memory_allocated_gb). CPU: peak RSS so far."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux reports KiB


def reset_peak_mem(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def total_device_mem_bytes(device: torch.device, override_gib: float | None) -> float:
    if override_gib is not None:
        return float(override_gib) * GIB
    if device.type != "cuda":
        raise ValueError("device_mem_gib is required when device is not cuda (it sizes the KV cache)")
    return float(torch.cuda.mem_get_info(device)[1])


def is_oom(exc: BaseException) -> bool:
    """A real CUDA OOM, or the allocator failures cuBLAS and NCCL report as plain RuntimeErrors."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text)


_SIZE = r"([\d.]+) (GiB|MiB|KiB)"


def oom_over_gib(message: str) -> float | None:
    """From torch's message: requested minus free ("Tried to allocate X ... of which Y is free")."""
    units = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2}
    tried = re.search(r"Tried to allocate " + _SIZE, message)
    if not tried:
        return None
    tried_gib = float(tried.group(1)) * units[tried.group(2)]
    free = re.search(r"of which " + _SIZE + " is free", message)
    free_gib = float(free.group(1)) * units[free.group(2)] if free else 0.0
    return max(tried_gib - free_gib, 0.0)


@dataclass
class PhaseClock:
    """Per-phase wall time (synchronized) and peak memory; remembers the phase an error escaped from."""

    device: torch.device
    test_raise_oom_in: str | None = None
    current: str | None = None
    peak_gib: float = 0.0

    @contextmanager
    def phase(self, name: str, seconds: dict[str, float], mem_gib: dict[str, float]) -> Iterator[None]:
        self.current = name
        synchronize(self.device)
        reset_peak_mem(self.device)
        start_s = time.perf_counter()
        if name == self.test_raise_oom_in:  # test double for the OOM path, set only by tests
            raise torch.OutOfMemoryError(f"test double: simulated out of memory in {name}")
        yield
        synchronize(self.device)
        seconds[name] = time.perf_counter() - start_s
        mem_gib[name] = peak_mem_gib(self.device)
        self.peak_gib = max(self.peak_gib, mem_gib[name])
        self.current = None


@contextmanager
def resident(module: torch.nn.Module, device: torch.device, *, offload: bool, pinned: bool) -> Iterator[None]:
    """Parameters on the device for the duration, on the CPU otherwise (verl's param_offload:
    load_fsdp_model_to_gpu / offload_fsdp_model_to_cpu around each actor or ref call). `pinned`: verl's
    FSDP2 copies, `.to(..., non_blocking=True)`, which land in pinned host blocks and copy back
    asynchronously on the same stream (utils/fsdp_utils.py offload_fsdp2_model_to_cpu); else pageable
    copies of exact size (see move_optimizer_state)."""
    if offload:
        module.to(device, non_blocking=pinned)
    try:
        yield
    finally:
        if offload:
            module.to("cpu", non_blocking=pinned)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str, *, pinned: bool = True) -> None:
    """verl's optimizer_offload: Adam moments live on the CPU between update phases.

    verl sends them with `.to("cpu", non_blocking=True)` (offload_fsdp_optimizer), which lands in pinned
    blocks rounded up to a power of two, one per tensor: FSDP2's per-parameter shards. FSDP1, which this
    probe runs as FSDP2, has one flat parameter per layer and rounds far less (model/host_memory.py);
    `pinned=False` copies to exact-size pageable memory instead, nearer FSDP1's host footprint."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=pinned)


# ----------------------------------------------------------------------------------------------
# Distributed (torchrun): FSDP2
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())


def init_dist(device_kind: str) -> Dist:
    """The process group: torchrun's, or one of a single rank, since verl wraps the actor in FSDP even
    on one GPU and FSDP2 needs a group (mixed precision then works as verl's: bf16 compute copies
    gathered per layer, fp32 master weights and gradients)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise EnvironmentError("the torch backend was asked for cuda, but torch.cuda.is_available() is False")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not torch.distributed.is_initialized():
        if world_size > 1:
            torch.distributed.init_process_group(backend)
        else:
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    return Dist(rank=torch.distributed.get_rank(), world_size=world_size, device=device)


def fsdp2_shard(policy: PolicyHead, *, param_dtype: torch.dtype) -> None:
    """FSDP2 as verl's fsdp2 strategy: one unit per decoder layer, the root holds embed/norm/head.

    bf16 compute with fp32 gradient reduction (verl engine/fsdp MixedPrecisionPolicy defaults).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in policy.lm.get_decoder().layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(policy, mp_policy=mp_policy)


def full_param(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter: FSDP2 holds DTensor shards, gathered for the rollout copy."""
    return param.full_tensor() if hasattr(param, "full_tensor") else param


# ----------------------------------------------------------------------------------------------
# LoRA (peft, as verl's FSDP engine)
# ----------------------------------------------------------------------------------------------

# verl 0.9.1 model/hf_model.yaml defaults: lora_alpha 16, target_modules all-linear (peft then skips
# the LM head); the sim's lora_params counts the same projections (workload.lora_target_modules).
LORA_ALPHA = 16
LORA_TARGET_MODULES = "all-linear"


def apply_lora(lm, rank: int, target_modules: str | list | tuple = LORA_TARGET_MODULES):
    """Frozen base, trainable rank-r adapters (peft.get_peft_model, as verl's FSDP engine does)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("LoRA in the torch backend needs peft: pip install peft") from exc
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=LORA_ALPHA, target_modules=targets, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(lm, config)


def _base_name(peft_name: str) -> str:
    """peft's parameter name -> the plain model's ("base_model.model.X.base_layer.weight" -> "X.weight")."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def lora_merged_weights(peft_lm) -> Iterator[tuple[str, torch.Tensor]]:
    """(plain name, W + scaling * B @ A) for every weight of a peft model: what a merged rollout holds.

    verl can also hand vLLM the adapters alone; copying merged weights is the upper bound of that sync.
    """
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in peft_lm.named_modules():
        if isinstance(module, LoraLayer) and module.lora_A:
            adapter = module.active_adapters[0]
            a = full_param(module.lora_A[adapter].weight)
            b = full_param(module.lora_B[adapter].weight)
            deltas[_base_name(name + ".base_layer.weight")] = module.scaling[adapter] * (b @ a)
    for name, param in peft_lm.named_parameters():
        if "lora_" in name:
            continue
        plain = _base_name(name)
        weight = full_param(param)
        yield plain, (weight + deltas[plain] if plain in deltas else weight)


# ----------------------------------------------------------------------------------------------
# The probe
# ----------------------------------------------------------------------------------------------


@dataclass
class Trajectories:
    prompt_lengths: list[int]
    tokens: list[torch.Tensor]  # prompt + response, int64, on the device
    response_length: int

    @property
    def seq_lengths(self) -> dict[int, int]:
        return {i: p + self.response_length for i, p in enumerate(self.prompt_lengths)}


class GrpoProbe:
    """Holds the models and optimizer; `step()` runs and times one GRPO step."""

    def __init__(self, req: WorkloadRequest, dist: Dist, clock: PhaseClock) -> None:
        self.req = req
        self.dist = dist
        self.device = dist.device
        self.cand = req.candidate
        # verl's FSDP2 offloads to pinned blocks (non_blocking); the probe runs FSDP1 as FSDP2, and for it
        # copies to pageable memory of exact size, nearer FSDP1's flat per-layer blocks
        self.pinned_offload = self.cand.actor_engine == "fsdp2" and self.device.type == "cuda"
        self.work = req.workload
        self.rng = random.Random(req.seed + dist.rank)
        self.generator = torch.Generator(device=self.device).manual_seed(req.seed + dist.rank)
        self.layout = req.layout
        self.n_trajectories = local_trajectories(self.layout, req.scale_trajectories)
        self.clock = clock
        budget = kv_cache_budget_bytes(total_device_mem_bytes(self.device, req.device_mem_gib), req.model, self.cand)
        self.concurrency = rollout_concurrency(budget, req.model, self.cand, self.work)
        self.kv_budget_bytes = budget
        self._build_models()

    def autocast(self) -> torch.autocast:
        """bf16 autocast around the forward, as verl's dp_actor (FSDP2 already computes in bf16)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # -- set-up ---------------------------------------------------------------------------------

    def _build_models(self) -> None:
        req, cand, device = self.req, self.cand, self.device
        max_len = self.work.seq_len
        attention = PACKED_ATTENTION if cand.use_remove_padding else "sdpa"
        # verl FSDP keeps fp32 master weights (fsdp_config.model_dtype: fp32) and computes in bf16.
        actor_lm = build_causal_lm(req.model, dtype=torch.float32, device=device, max_len=max_len, attention=attention)
        if cand.use_liger:  # before the adapters, as verl (the engine patches the module, then wraps it)
            apply_liger(actor_lm)
        if self.work.lora_rank:
            actor_lm = apply_lora(actor_lm, self.work.lora_rank, self.work.lora_target_modules)
        if cand.gradient_checkpointing:
            enable_gradient_checkpointing(actor_lm)
        self.actor = PolicyHead(actor_lm, make_entropy_fn(cand))
        self.rollout = build_causal_lm(req.model, dtype=torch.bfloat16, device=device, max_len=max_len).eval()
        self.ref = None
        # With LoRA the reference is the actor with its adapters disabled (verl's ref_in_actor,
        # trainer/ppo/ray_trainer.py: "the reference policy will be actor without lora applied").
        if separate_reference(self.work):
            ref_lm = build_causal_lm(req.model, dtype=torch.bfloat16, device=device, max_len=max_len,
                                     attention=attention).eval()
            if cand.use_liger:  # the reference is built by the same engine code
                apply_liger(ref_lm)
            self.ref = PolicyHead(ref_lm, entropy_from_logits)
        fsdp2_shard(self.actor, param_dtype=torch.bfloat16)
        if self.ref is not None:
            fsdp2_shard(self.ref, param_dtype=torch.bfloat16)
        trainable = [p for p in self.actor.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY, fused=device.type == "cuda")
        self._copy_actor_to(self.rollout)  # the rollout starts from the actor, as vLLM's first sync
        if cand.param_offload:
            self.actor.to("cpu", non_blocking=self.pinned_offload)
        if self.ref is not None and cand.ref_param_offload:
            self.ref.to("cpu", non_blocking=self.pinned_offload)

    def _copy_actor_to(self, target) -> None:
        """fp32 -> bf16 cast copy of every weight; with LoRA, of the merged weights W + s*B@A."""
        with torch.no_grad():
            if not self.work.lora_rank:
                for dst, src in zip(target.parameters(), self.actor.lm.parameters(), strict=True):
                    dst.copy_(full_param(src))
                return
            for name, dst in lora_merged_weights(self.actor.lm):
                target.get_parameter(name).copy_(dst)

    # -- phases ---------------------------------------------------------------------------------

    def generate(self, prompt_lengths: list[int]) -> Trajectories:
        """Waves of `concurrency` sequences: chunked prefill, last-position logits, multinomial decode."""
        response_len = self.work.max_response_length
        vocab = self.req.model.vocab_size
        tokens: list[torch.Tensor] = []
        pool = self._reserve_kv_pool(prompt_lengths)
        with torch.no_grad():
            for start in range(0, len(prompt_lengths), self.concurrency):
                wave = prompt_lengths[start:start + self.concurrency]
                prompts = [torch.randint(0, vocab, (p,), device=self.device, generator=self.generator) for p in wave]
                responses = self._generate_wave(prompts, response_len)
                tokens.extend(torch.cat([p, r]) for p, r in zip(prompts, responses))
        del pool
        return Trajectories(prompt_lengths=list(prompt_lengths), tokens=tokens, response_length=response_len)

    def _reserve_kv_pool(self, prompt_lengths: list[int]) -> list[torch.Tensor] | None:
        """vLLM allocates its whole KV budget up front; hold the part our caches do not use (CUDA only:
        on the CPU the budget is nominal)."""
        if self.device.type != "cuda":
            return None
        # verl puts the trainer to sleep before vLLM wakes: its cached blocks go back to the driver. Without
        # this, one large allocation fails on fragmentation (measured on the H200: 53 GiB reserved but
        # unallocated, a 64 GiB hold refused), which vLLM's paged pool never meets.
        torch.cuda.empty_cache()
        seqs = min(self.concurrency, len(prompt_lengths))
        used = seqs * (max(prompt_lengths) + self.work.max_response_length) * kv_bytes_per_token(self.req.model)
        slack = int(self.kv_budget_bytes - used)
        if slack <= 0:
            return None
        block = 1 << 30  # vLLM's pool is many blocks, not one tensor: hold it in 1 GiB pieces
        return [torch.empty(min(block, slack - off), dtype=torch.uint8, device=self.device)
                for off in range(0, slack, block)]

    def _generate_wave(self, prompts: list[torch.Tensor], response_len: int) -> list[torch.Tensor]:
        from transformers import DynamicCache

        decoder, head = self.rollout.get_decoder(), self.rollout.get_output_embeddings()
        cache_kw = _cache_kwarg(decoder)
        width = max(p.numel() for p in prompts)
        batch = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for row, prompt in enumerate(prompts):
            batch[row, width - prompt.numel():] = prompt  # left-padded; pad tokens are attended (see docstring)
        cache = DynamicCache()
        # Chunked prefill: at most max_num_batched_tokens tokens per forward, as vLLM's scheduler.
        chunk = max(1, self.cand.max_num_batched_tokens // len(prompts))
        for start in range(0, width, chunk):
            hidden = decoder(input_ids=batch[:, start:start + chunk], use_cache=True, **{cache_kw: cache}).last_hidden_state
        # Only the last position's logits: full-vocab logits at prefill OOM (calibration README).
        next_token = self._sample(head(hidden[:, -1]))
        out = [next_token]
        for _ in range(response_len - 1):
            hidden = decoder(input_ids=next_token, use_cache=True, **{cache_kw: cache}).last_hidden_state
            next_token = self._sample(head(hidden[:, -1]))
            out.append(next_token)
        del cache
        return list(torch.cat(out, dim=1))

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float(), dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator)

    def _micro_batch(self, traj: Trajectories, indices: list[int]) -> MicroBatch:
        sequences = [traj.tokens[i] for i in indices]
        prompt_lens = [traj.prompt_lengths[i] for i in indices]
        if self.cand.use_remove_padding:
            return packed_micro_batch(sequences, prompt_lens, traj.response_length, self.device)
        # verl without remove-padding pads every row to prompt+response max
        return padded_micro_batch(sequences, prompt_lens, traj.response_length, self.work.seq_len, self.device)

    def _forward_log_probs(self, policy: PolicyHead, traj: Trajectories, batches: list[list[int]],
                           with_entropy: bool) -> torch.Tensor:
        out = torch.empty(len(traj.tokens), traj.response_length, device=self.device)
        with torch.no_grad(), self.autocast():
            for indices in batches:
                log_probs, _entropy = policy(self._micro_batch(traj, indices), with_entropy=with_entropy)
                out[indices] = log_probs
        return out

    def _resident(self, module: torch.nn.Module, offload: bool):
        """`module` on this rank's GPU for the duration, offloaded the way this candidate's engine does."""
        return resident(module, self.device, offload=offload, pinned=self.pinned_offload)

    def _micro_batches(self, lengths: dict[int, int], indices: Sequence[int], micro_batch_size: int,
                       max_tokens: int) -> list[list[int]]:
        return micro_batches(indices, lengths, dynamic=self.cand.use_dynamic_bsz,
                             micro_batch_size=micro_batch_size, max_tokens=max_tokens,
                             padded=not self.cand.use_remove_padding)

    def _log_prob_batches(self, traj: Trajectories, micro_batch_size: int) -> list[list[int]]:
        return self._micro_batches(traj.seq_lengths, range(len(traj.tokens)), micro_batch_size,
                                   self.cand.log_prob_max_token_len_per_gpu)

    def old_log_prob(self, traj: Trajectories) -> torch.Tensor:
        batches = self._log_prob_batches(traj, self.cand.log_prob_micro_batch_size_per_gpu)
        self.actor.eval()
        with self._resident(self.actor, self.cand.param_offload):
            return self._forward_log_probs(self.actor, traj, batches, with_entropy=True)

    def ref_log_prob(self, traj: Trajectories) -> torch.Tensor:
        batches = self._log_prob_batches(traj, self.cand.ref_log_prob_micro_batch_size_per_gpu)
        if self.ref is None:  # LoRA: the actor with its adapters disabled
            self.actor.eval()
            with self._resident(self.actor, self.cand.param_offload), self.actor.lm.disable_adapter():
                return self._forward_log_probs(self.actor, traj, batches, with_entropy=False)
        with self._resident(self.ref, self.cand.ref_param_offload):
            return self._forward_log_probs(self.ref, traj, batches, with_entropy=False)

    def update_actor(self, traj: Trajectories, old_lp: torch.Tensor, ref_lp: torch.Tensor | None,
                     advantages: torch.Tensor) -> float:
        """ppo_epochs x mini-batches x micro-batches; returns the FLOPs verl counts for this rank."""
        flops = 0.0
        lengths = traj.seq_lengths
        self.actor.train()
        with self._resident(self.actor, self.cand.param_offload):
            if self.cand.optimizer_offload:
                move_optimizer_state(self.optimizer, self.device)
            for _epoch in range(self.work.ppo_epochs):
                start = 0
                for size in mini_batch_sizes(len(traj.tokens), self.layout):
                    mini = list(range(start, start + size))
                    start += size
                    self._train_mini_batch(traj, mini, lengths, old_lp, ref_lp, advantages)
                    flops += train_flops(self.req.model, [lengths[i] for i in mini])
            if self.cand.optimizer_offload:
                move_optimizer_state(self.optimizer, "cpu", pinned=self.pinned_offload)
        return flops

    def _train_mini_batch(self, traj: Trajectories, mini: list[int], lengths: dict[int, int],
                          old_lp: torch.Tensor, ref_lp: torch.Tensor | None, advantages: torch.Tensor) -> None:
        batches = self._micro_batches(lengths, mini, self.cand.ppo_micro_batch_size_per_gpu,
                                      self.cand.ppo_max_token_len_per_gpu)
        offload = torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")
        for indices in batches:
            batch = self._micro_batch(traj, indices)
            with self.autocast(), (offload if self.cand.activation_offload else nullcontext()):
                log_prob, _ = self.actor(batch)
                ref = ref_lp[indices] if ref_lp is not None else None
                loss = grpo_loss(log_prob, old_lp[indices], advantages[indices], ref)
            # verl scales each micro-batch loss by its share of the mini-batch (dp_actor.update_policy).
            (loss * (len(indices) / len(mini))).backward()
        torch.nn.utils.clip_grad_norm_(self.actor.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def update_weights(self) -> None:
        """Actor -> rollout copy. verl syncs FSDP shards into vLLM's bf16 weights; on one GPU the
        honest stand-in is the same gather-and-cast copy into our rollout model.

        Between generation and this sync vLLM sleeps (rollout.free_cache_engine=True: sleep level 1
        moves its weights to host memory and drops the KV cache), so the rollout weights are not on
        the GPU while the actor trains; they come back here, as verl's wake_up before the sync."""
        self.rollout.to(self.device)
        with self._resident(self.actor, self.cand.param_offload):
            self._copy_actor_to(self.rollout)

    # -- one step -------------------------------------------------------------------------------

    def step(self) -> dict:
        seconds: dict[str, float] = {name: 0.0 for name in PHASES}
        mem_gib: dict[str, float] = {}
        phase = lambda name: self.clock.phase(name, seconds, mem_gib)  # noqa: E731
        prompt_lengths = sample_prompt_lengths(self.rng, self.n_trajectories, self.work)
        synchronize(self.device)
        start_s = time.perf_counter()
        with phase("gen"):
            traj = self.generate(prompt_lengths)
            self.rollout.to("cpu")  # vLLM sleeps until the next weight sync (see update_weights)
        rewards = torch.randint(0, 2, (len(traj.tokens),), device=self.device, generator=self.generator)
        advantages = grpo_advantages(rewards, self.work.rollout_n)
        with phase("old_log_prob"):
            old_lp = self.old_log_prob(traj)
        ref_lp = None
        if need_reference_policy(self.work):
            with phase("ref"):
                ref_lp = self.ref_log_prob(traj)
        with phase("update_actor"):
            flops = self.update_actor(traj, old_lp, ref_lp, advantages)
        with phase("update_weights"):
            self.update_weights()
        synchronize(self.device)
        step_s = time.perf_counter() - start_s
        return self._step_record(step_s, seconds, mem_gib, traj, flops)

    def _step_record(self, step_s: float, seconds: dict, mem_gib: dict, traj: Trajectories, flops: float) -> dict:
        # verl perf/throughput: prompt+response tokens of every trajectory / step time / GPUs.
        tokens = self.dist.sum(float(sum(traj.seq_lengths.values())))
        total_flops = self.dist.sum(flops)
        return {
            "step_s": step_s,
            "phase_s": seconds,
            "phase_peak_mem_gib": mem_gib,
            "tokens": tokens,
            "tokens_per_s_per_gpu": tokens / step_s / self.dist.world_size,
            # verl perf/mfu/actor: update-phase FLOPs / update time / promised FLOP/s / world size
            "mfu": mfu(total_flops, seconds["update_actor"], self.dist.world_size, self.req.peak_flops_per_gpu),
        }

    def plan(self) -> dict:
        return {
            "trajectories_per_rank": self.n_trajectories,
            "world_size": self.dist.world_size,
            "dp": self.layout.dp,
            "rollout_concurrency": self.concurrency,
            "kv_cache_budget_gib": self.kv_budget_bytes / GIB,
            "mini_batches": mini_batch_sizes(self.n_trajectories, self.layout),
        }


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def summarize(records: list[dict], warmup_steps: int, peak_gib: float, plan: dict) -> dict:
    """Medians over the timed steps (gpt-fast style: warm-up and compile steps are not timed).

    `series` holds the timed steps under verl's metric names, as the sim backend's series do.
    """
    timed = records[warmup_steps:]
    median = statistics.median
    phase_peaks = {name: max(r["phase_peak_mem_gib"].get(name, 0.0) for r in records) for name in PHASES}
    series = {
        "perf/throughput": [r["tokens_per_s_per_gpu"] for r in timed],
        "perf/mfu/actor": [r["mfu"] for r in timed],
        "timing_s/step": [r["step_s"] for r in timed],
        **{f"timing_s/{name}": [r["phase_s"][name] for r in timed] for name in PHASES},
        "perf/max_memory_allocated_gb": [max(r["phase_peak_mem_gib"].values()) for r in timed],
    }
    return {
        "ok": True,
        "tokens_per_s_per_gpu": median(series["perf/throughput"]),
        "mfu": median(series["perf/mfu/actor"]),
        "peak_mem_gib": peak_gib,
        "phase_peak_mem_gib": phase_peaks,
        "step_s": median(series["timing_s/step"]),
        "phase_s": {name: median(series[f"timing_s/{name}"]) for name in PHASES},
        "series": series,
        "steps": [{"step": i, "timed": i >= warmup_steps, **r} for i, r in enumerate(records)],
        "plan": plan,
    }


def run(req: WorkloadRequest, dist: Dist, clock: PhaseClock) -> dict:
    torch.manual_seed(req.seed)
    probe = GrpoProbe(req, dist, clock)
    records = []
    for step in range(req.warmup_steps + req.timed_steps):
        record = probe.step()
        records.append(record)
        if dist.rank == 0:
            # phase times ride along so a probe killed at its deadline still leaves where its time went
            line = {"step": step, "tokens_per_s_per_gpu": record["tokens_per_s_per_gpu"],
                    "timed": step >= req.warmup_steps, "mfu": record["mfu"],
                    "phase_s": {name: round(s, 3) for name, s in record["phase_s"].items()},
                    "peak_mem_gib": round(max(record["phase_peak_mem_gib"].values()), 2)}
            print(json.dumps(line), flush=True)
    return summarize(records, req.warmup_steps, clock.peak_gib, probe.plan())


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:500]


def _oom_record(exc: BaseException, clock: PhaseClock | None) -> dict:
    """What the runner needs for ProbeOOM; "init" when the models themselves did not fit."""
    phase = clock.current if clock and clock.current else "init"
    peak_gib = max(clock.peak_gib, peak_mem_gib(clock.device)) if clock else None
    return {"ok": False, "oom": True, "phase": phase, "peak_mem_gib": peak_gib,
            "over_gib": oom_over_gib(str(exc)), "message": _first_line(exc)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.request) as f:
        req = parse_request(json.load(f))
    out_path = rank_result_path(args.out, int(os.environ.get("RANK", "0")))
    clock: PhaseClock | None = None
    try:
        dist = init_dist(req.device)
        clock = PhaseClock(dist.device, test_raise_oom_in=req.test_raise_oom_in)
        result = run(req, dist, clock)
        if dist.rank == 0:
            _write_json(out_path, result)
        torch.distributed.destroy_process_group()
        return 0
    except ConfigRejected as exc:
        _write_json(out_path, {"ok": False, "rejected": True, "message": _first_line(exc)})
        return EXIT_REJECTED
    except KvCacheTooSmall as exc:
        _write_json(out_path, {"ok": False, "kv_cache_too_small": True, "phase": "rollout",
                               "over_gib": exc.over_gib, "message": str(exc)})
        return EXIT_KV_CACHE_TOO_SMALL
    except (ImportError, EnvironmentError) as exc:
        _write_json(out_path, {"ok": False, "environment": True, "message": _first_line(exc)})
        return EXIT_ENVIRONMENT
    except Exception as exc:  # an OOM is a measurement; anything else is a crash and re-raised
        if not is_oom(exc):
            raise
        traceback.print_exc(file=sys.stderr)
        _write_json(out_path, _oom_record(exc, clock))
        return EXIT_OOM


if __name__ == "__main__":
    sys.exit(main())
