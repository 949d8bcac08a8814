"""Analytic time model of one verl GRPO step, by phase.

Phases follow verl's `timing_s/*` (trainer/ppo/v1/trainer_base.py): gen (vLLM rollout, including
wake-up and sleep), old_log_prob, ref, update_actor, update_weights, plus a fixed per-step cost.
Training and forward passes are compute-bound with an MFU that grows with tokens per micro-batch
(fitted to H200 measurements); decode is bandwidth-bound with KV-limited concurrency; collectives
use link bandwidth x efficiency with partial overlap. Constants: model/calibration.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.model.calibration import DEFAULT_CONSTANTS, THROUGHPUT, ModelConstants, ThroughputConstants
from autotune.verl.flops import train_flops_uniform
from autotune.model.memory import (BF16, FP32, actor_state_bytes, ref_weight_bytes,
                                        tokens_per_micro_batch, trained_params,
                                        train_activation_bytes, vllm_kv_cache_bytes)
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload
from autotune.verl.roles import need_reference_policy, separate_reference


@dataclass(frozen=True, kw_only=True)
class StepTime:
    phase_s: dict[str, float]
    step_s: float
    tokens_per_step: float
    tokens_per_s_per_gpu: float
    mfu_actor: float  # verl's perf/mfu/actor: update_actor FLOPs / time / peak / world
    rollout_concurrency: float  # sequences decoded at once per vLLM replica
    # the FLOPs the update really computes over its time, peak and GPUs: differs from verl's with LoRA
    mfu_actor_model_flops: float = 0.0


def gpu_curve_factors(gpu: GpuSpec | None, c: ThroughputConstants = THROUGHPUT) -> tuple[float, float]:
    """(tokens-to-half-peak factor, MFU-ceiling factor) of this GPU against the H200 the curve was fitted on.

    Roofline: a GEMM needs arithmetic intensity above the ridge point (peak / HBM bandwidth) to be
    compute-bound, so the tokens per micro-batch that reach half the peak scale with the ridge. The ceiling
    is the matmul rate plus bandwidth-bound elementwise work (calibration.py, ThroughputConstants)."""
    if gpu is None:
        return 1.0, 1.0
    ridge_fit = c.fit_peak_flops / c.fit_hbm_bytes_per_s
    ridge = gpu.peak_bf16_flops / gpu.hbm_bytes_per_s
    elementwise = (1 / c.mfu_max_cap - 1 / c.matmul_peak_fraction) / ridge_fit  # per unit of ridge
    ceiling = 1 / (1 / (c.matmul_peak_fraction * matmul_rate_factor(gpu, c)) + elementwise * ridge)
    return ridge / ridge_fit, ceiling / c.mfu_max_cap


def matmul_rate_factor(gpu: GpuSpec, c: ThroughputConstants = THROUGHPUT) -> float:
    """This GPU's reachable GEMM rate, as a share of its peak, against the H200's that the constants were fitted at
    (1.0 where no measurement of its own is known): it scales every compute-bound term priced as a share of peak."""
    if gpu.matmul_peak_fraction is None:
        return 1.0
    return gpu.matmul_peak_fraction / c.matmul_peak_fraction


def train_mfu(tokens_per_micro: float, hidden_per_gpu: float, c: ThroughputConstants = THROUGHPUT, *,
              gpu: GpuSpec | None = None, t_half_hidden: float | None = None) -> float:
    """Training MFU (verl FLOPs) at this many tokens per micro-batch and this GEMM width (hidden size).

    `t_half_hidden` (default the same) sets the tokens to half-peak: a GEMM of t tokens against a K x N weight
    has arithmetic intensity ~ t while t << K, N. `gpu` rescales both for GPUs other than the H200
    (gpu_curve_factors); None is the H200."""
    doublings = math.log2(max(hidden_per_gpu, 64) / 2048)
    t_doublings = math.log2(max(t_half_hidden or hidden_per_gpu, 64) / 2048)
    t_factor, ceiling_factor = gpu_curve_factors(gpu, c)
    mfu_max = min(c.mfu_max_at_h2048 + c.mfu_max_log2_slope * doublings, c.mfu_max_cap) * ceiling_factor
    t_half = c.t_half_tokens_at_h2048 * (c.t_half_log2_slope ** t_doublings) * t_factor
    return max(mfu_max, 0.05) * tokens_per_micro / (tokens_per_micro + t_half)


def _collective_s(bytes_per_gpu: float, group: int, link_bytes_per_s: float, k: ModelConstants) -> float:
    """Ring collective time: (g-1)/g of the payload crosses each link."""
    if group <= 1:
        return 0.0
    return bytes_per_gpu * (group - 1) / group / (link_bytes_per_s * k.system.collective_efficiency)


def _link(gpu: GpuSpec, group: int, gpus_per_node: int) -> float:
    return gpu.intra_node_bytes_per_s if group <= gpus_per_node else gpu.inter_node_bytes_per_s


def _host_copy_s(nbytes: float, gpu: GpuSpec, k: ModelConstants) -> float:
    return nbytes / (gpu.host_link_bytes_per_s * k.system.host_link_efficiency)


def _expert_n(model: ModelSpec) -> float:
    """Routed-expert weights a token passes through (verl's MoE dense_N less attention, router and heads)."""
    if not model.is_moe:
        return 0.0
    return float(model.num_layers * model.num_experts_per_tok * 3 * model.hidden_size * model.moe_intermediate_size)


@dataclass(frozen=True)
class PassTime:
    """One rank's full-batch pass: compute and communication, in seconds."""

    compute_s: float
    comm_hidden_s: float  # communication that overlaps compute (FSDP gathers, DP reduce, CP ring)
    comm_critical_s: float  # communication the compute waits for (TP/SP collectives, Ulysses and EP all-to-alls)
    total_s: float
    flops: float


def _pass_parts(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate, layout: ParallelLayout, *,
                forward_only: bool, role: str = "actor", k: ModelConstants) -> PassTime:
    """Compute and communication of one rank's share of a full-batch pass (all mini-batches, all epochs)."""
    # without remove-padding every row is padded to the longest prompt + response, attention included
    seq = workload.mean_seq_len if cand.use_remove_padding else workload.seq_len
    seq_sq = mean_square_seq_len(workload) if cand.use_remove_padding else None
    seqs_per_rank = layout.trajectories_per_rank
    split = cand.actor_tp * cand.actor_cp * cand.actor_pp if cand.is_megatron else cand.ulysses_sp
    flops = train_flops_uniform(model, seqs_per_rank, seq, seq_sq) / split
    expert_flops = 6 * _expert_n(model) * seqs_per_rank * seq / split
    if forward_only:
        flops /= 3.0
        expert_flops /= 3.0
    else:
        flops *= workload.ppo_epochs
        expert_flops *= workload.ppo_epochs
        if workload.lora_rank:
            # frozen base: backward computes input gradients only (4N, not 6N), but peft's adapters run slower
            # than that saving (measured, calibration.py lora_time_factor)
            flops *= 4.0 / 6.0 * k.throughput.lora_time_factor
            expert_flops *= 4.0 / 6.0 * k.throughput.lora_time_factor
    # mean micro-batch: dynamic batching splits each mini-batch into balanced micro-batches (memory.dynamic_split)
    tok_micro = tokens_per_micro_batch(cand, workload, forward_only=forward_only, role=role, layout=layout,
                                       largest=False)
    # Megatron TP with sequence parallel gathers the sequence before every column-parallel GEMM, so each
    # matmul sees all tokens of the micro-batch (split only by CP); Ulysses splits the sequence for the GEMMs
    gemm_tokens = tok_micro / (cand.actor_cp if cand.is_megatron else cand.ulysses_sp)
    mfu_factor = 1.0
    if forward_only:
        mfu_factor *= k.throughput.forward_mfu_factor
    elif cand.gradient_checkpointing:
        mfu_factor *= k.throughput.ckpt_throughput_factor
    if not forward_only and cand.actor_engine == "fsdp2":
        mfu_factor *= k.system.fsdp2_throughput_factor
    if cand.use_liger:
        mfu_factor *= k.throughput.liger_throughput_factor
    # the hand-set ceiling bounds every variant: Liger shortens the elementwise work, not the matmuls, which
    # already run near the H200's reachable rate (~790 of 989 TFLOP/s, torch.profiler on the probe)
    cap = k.throughput.mfu_max_cap * gpu_curve_factors(gpu, k.throughput)[1]

    def mfu_at(tokens: float, width: float) -> float:
        m = train_mfu(tokens, width, k.throughput, gpu=gpu, t_half_hidden=model.hidden_size)
        return min(m * mfu_factor, cap)

    # the curve's width is the model's hidden size under TP too: a column- or row-parallel GEMM keeps K (or N)
    # and all M tokens, and the fitted width dependence stands for the model's shapes, not for a split of them;
    # TP's cost is its collectives (tests/model/test_published_model.py checks it step by step)
    compute_s = (flops - expert_flops) / (mfu_at(gemm_tokens, model.hidden_size) * gpu.peak_bf16_flops)
    if expert_flops:
        ep = cand.actor_ep if cand.is_megatron else 1
        etp = cand.actor_etp if cand.is_megatron else 1
        expert_tokens = gemm_tokens * ep * model.num_experts_per_tok / model.num_experts
        compute_s += expert_flops / (mfu_at(expert_tokens, model.hidden_size / etp) * gpu.peak_bf16_flops)
        passes = 1 if forward_only else (4 if cand.gradient_checkpointing else 3)
        # this rank's tokens (split by TP/SP x CP) through its layers (L / PP): seqs x seq / split x L
        permute_bytes = (k.throughput.moe_permute_copies * model.num_experts_per_tok * model.hidden_size * BF16
                         * seqs_per_rank * seq / split * model.num_layers)
        compute_s += passes * permute_bytes / gpu.hbm_bytes_per_s

    n_micro = max(seqs_per_rank * seq / max(tok_micro, 1.0), 1.0) * (1 if forward_only else workload.ppo_epochs)
    if not cand.is_megatron:
        # host-bound floor: below some size a micro-batch takes as long as the CPU needs to issue HF's eager
        # modules and FSDP's hooks, layer by layer (forward; backward counts twice; recompute once more)
        passes = 1 if forward_only else (4 if cand.gradient_checkpointing else 3)
        compute_s = max(compute_s, n_micro * model.num_layers * passes * k.throughput.host_s_per_layer_pass)
    hidden_comm, critical_comm = _parallel_comm_s(model, gpu, cand, layout, n_micro=n_micro, tok_micro=tok_micro,
                                                  workload=workload, forward_only=forward_only, k=k)
    overlapped = min(hidden_comm * k.system.comm_overlap, compute_s)
    total = compute_s + hidden_comm - overlapped + critical_comm
    if cand.is_megatron and cand.actor_pp > 1 and not forward_only:
        m = n_micro / max(workload.train_batch_size // workload.ppo_mini_batch_size, 1)
        bubble = (cand.actor_pp - 1) / (cand.actor_vpp * m + cand.actor_pp - 1)
        total /= (1 - bubble)
    if cand.activation_offload and not forward_only:
        act = train_activation_bytes(model, tok_micro, layers=model.num_layers,
                                     checkpointing=cand.gradient_checkpointing, c=k.activations, liger=cand.use_liger)
        total += 0.5 * 2 * _host_copy_s(act, gpu, k) * n_micro  # D2H in forward, H2D in backward, half hidden
    return PassTime(compute_s=compute_s, comm_hidden_s=hidden_comm, comm_critical_s=critical_comm, total_s=total,
                    flops=flops)


def _pass_s(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate, layout: ParallelLayout, *,
            forward_only: bool, role: str = "actor", k: ModelConstants) -> tuple[float, float]:
    """(seconds, FLOPs) for one rank's share of a full-batch pass (all mini-batches, all epochs)."""
    p = _pass_parts(model, gpu, workload, cand, layout, forward_only=forward_only, role=role, k=k)
    return p.total_s, p.flops


def _parallel_comm_s(model: ModelSpec, gpu: GpuSpec, cand: Candidate, layout: ParallelLayout, *,
                     workload: Workload, n_micro: float, tok_micro: float, forward_only: bool,
                     k: ModelConstants) -> tuple[float, float]:
    """(overlappable, critical-path) communication seconds per full-batch pass on one rank.

    FSDP's all-gathers are prefetched, the DP gradient reduction and CP's ring exchange run beside compute;
    Megatron's TP/SP all-gathers and reduce-scatters (no tp_comm_overlap in verl's defaults), Ulysses'
    all-to-alls and EP's token all-to-alls sit between the GEMMs that need their output."""
    n = model.param_count()
    passes = 1 if forward_only else 2  # all-gather for forward, again for backward (reshard_after_forward)
    if not cand.is_megatron:
        world = layout.world_size
        link = _link(gpu, world, layout.gpus_per_node)
        gather = _collective_s(BF16 * n, world, link, k) * passes * n_micro
        trained = trained_params(model, workload)
        reduce = 0.0 if forward_only else _collective_s(FP32 * trained, world, link, k) * n_micro
        sp = cand.ulysses_sp
        a2a = 0.0
        if sp > 1:  # 4 all-to-alls per layer (q, k, v, out) forward, again backward
            a2a_bytes = tok_micro / sp * model.hidden_size * BF16 * 4 * model.num_layers * passes
            a2a = _collective_s(a2a_bytes, sp, gpu.intra_node_bytes_per_s, k) * n_micro
        return gather + reduce, a2a
    tp, cp, dp = cand.actor_tp, cand.actor_cp, max(layout.dp, 1)
    layers = model.num_layers / cand.actor_pp
    # TP with sequence parallel: 2 all-gathers + 2 reduce-scatters of the activations per layer per pass
    tp_bytes = tok_micro / cp * model.hidden_size * BF16 * 4 * layers * passes / 2
    tp_s = _collective_s(tp_bytes, tp, gpu.intra_node_bytes_per_s, k) * n_micro
    if cand.cuda_device_max_connections not in (0, 1):  # 0: unset, verl exports 1 itself
        tp_s *= 1.3  # no kernel-ordering guarantee: TP collectives overlap worse (Megatron docs)
    cp_s = _collective_s(tok_micro / cp * model.kv_dim * BF16 * 2 * layers * passes, cp,
                         gpu.intra_node_bytes_per_s, k) * n_micro
    ep_s = 0.0
    if model.is_moe and cand.actor_ep > 1:
        a2a = tok_micro / (tp * cp) * model.hidden_size * BF16 * model.num_experts_per_tok * 2 * layers * passes
        ep_s = _collective_s(a2a, cand.actor_ep, _link(gpu, cand.actor_ep * tp, layout.gpus_per_node), k) * n_micro
    dp_s = 0.0
    if not forward_only:
        state = actor_state_bytes(model, cand, layout, workload)
        # at every optimizer step (each mini-batch of each epoch: verl 0.9.1's train_mini_batch loops over them,
        # workers/engine_workers.py:287-314, and each train_batch steps the optimizer, workers/engine/base.py:113-128),
        # Megatron's DDP reduce-scatters the accumulated gradients and its distributed optimizer (verl's default,
        # megatron optim use_distributed_optimizer) all-gathers the updated bf16 parameters
        steps = max(workload.train_batch_size // workload.ppo_mini_batch_size, 1) * workload.ppo_epochs
        link = _link(gpu, layout.world_size, layout.gpus_per_node)
        dp_s = (_collective_s(state.grads, dp, link, k) + _collective_s(state.weights, dp, link, k)) * steps
    return cp_s + dp_s, tp_s + ep_s


def experts_touched(model: ModelSpec, batch: float) -> float:
    """Expected share of a MoE layer's experts that a decode batch routes to: 1 - (1 - k/E)^batch, tokens routed
    independently and uniformly (Qwen3-MoE's load-balancing loss pushes toward uniform). 0.87 of Qwen3-30B-A3B's
    128 experts at batch 32, 0.98 at 64: decode reads nearly all expert weights, not only the active ones."""
    if not model.is_moe:
        return 1.0
    return 1.0 - (1.0 - model.num_experts_per_tok / model.num_experts) ** max(batch, 1.0)


def decode_weight_bytes(model: ModelSpec, batch: float) -> float:
    """bf16 weight bytes one decode step reads at this batch: everything but the experts, plus the experts routed to."""
    if not model.is_moe:
        return BF16 * model.active_param_count()
    experts = model.num_layers * model.num_experts * 3 * model.hidden_size * model.moe_intermediate_size
    return BF16 * (model.param_count() - experts + experts * experts_touched(model, batch))


def mean_square_seq_len(workload: Workload) -> float:
    """Mean of the squared prompt + response lengths, what attention's FLOPs grow with (verl counts each sequence's
    own length squared: utils/flops_counter.py, seqlen_square_sum). The response's variance is the exponential's
    (its mean squared; the same right-skewed assumption as expected_longest), at most the largest any lengths within
    the cap allow, mean x (cap - mean) (Bhatia and Davis 2000): none when every response runs to the cap."""
    mean, cap = workload.response_mean, float(workload.max_response_length)
    variance = min(mean * mean, mean * max(cap - mean, 0.0))
    return workload.mean_seq_len ** 2 + variance


def expected_longest(n: float, mean_len: float, max_len: float) -> float:
    """Expected longest of `n` responses of mean `mean_len` capped at `max_len`: the longest of n exponential draws
    is the mean times the n-th harmonic number (about ln n + 0.577), capped. An assumption (response lengths are
    right-skewed; the exponential is the widest tail a mean alone allows without a pile-up at the cap), replacing
    "some response always runs to the cap", which made gen grow linearly with max_response_length at a fixed mean
    (issue 30: 18 s at a 2,048 cap to 125 s at 16,384). Every response at the cap (mean = max) gives the cap."""
    if mean_len >= max_len:
        return max_len
    n = max(n, 1.0)
    harmonic = math.log(n) + 0.5772156649 + 1 / (2 * n) if n > 1 else 1.0
    return min(max_len, mean_len * harmonic)


def decode_steps(seqs: float, concurrency: float, mean_len: float, max_len: float, *,
                 hard_slots: bool = True) -> float:
    """Decode steps of one replica's requests under continuous batching: the slots stay full while requests wait,
    then the step lasts until the longest response ends.

    The waiting is fractional (seqs / concurrency - 1 waves of the mean) wherever slots free at different times:
    responses of different lengths, or a concurrency set by the KV cache, which vLLM fills block by block as
    sequences grow (a KV-bound concurrency of 127.9 for 128 sequences costs a preemption near the end, not a whole
    second wave: issue 30). Only max_num_seqs slots (`hard_slots`) filled by responses that all run to the cap free
    together, in whole waves of max_len."""
    ratio = seqs / max(concurrency, 1.0)
    if hard_slots and mean_len >= max_len:
        return math.ceil(ratio - 1e-9) * max_len
    return max(ratio - 1.0, 0.0) * mean_len + expected_longest(seqs, mean_len, max_len)


def _rollout_s(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate,
               layout: ParallelLayout, k: ModelConstants, *, eager: bool = False) -> tuple[float, float]:
    """(gen seconds, concurrency) for vLLM: prefill + decode over the response-length distribution, with
    concurrency limited by the KV cache and max_num_seqs. `eager`: vLLM runs without CUDA graphs
    (rollout.enforce_eager), and every decode step pays the host's launches layer by layer."""
    tp = cand.rollout_tp
    replicas = max(layout.rollout_replicas, 1)
    seqs = workload.trajectories_per_step / replicas
    prompt = workload.prompt_fill * workload.max_prompt_length
    resp_max, resp_mean = workload.max_response_length, workload.response_mean
    kv_per_token = model.kv_cache_bytes_per_token(tp)
    kv_tokens = max(vllm_kv_cache_bytes(model, gpu, cand, k), 0.0) / kv_per_token
    # vLLM allocates KV blocks as tokens arrive, so a slot holds the prompt and its response so far
    concurrency = max(min(cand.max_num_seqs, kv_tokens / (prompt + resp_mean), seqs), 1.0)
    bw = gpu.hbm_bytes_per_s * k.rollout.decode_hbm_efficiency
    weight_read_s = decode_weight_bytes(model, concurrency) / tp / bw
    allreduce_s = 2 * model.num_layers * k.rollout.tp_allreduce_latency_s if tp > 1 else 0.0
    steps = decode_steps(seqs, concurrency, resp_mean, resp_max, hard_slots=concurrency >= cand.max_num_seqs)
    active = model.active_param_count()
    generated = seqs * resp_mean
    # per step: the larger of reading the weights and the batch's matmuls; per token: reading its KV cache
    prefill_flops_per_s = gpu.peak_bf16_flops * k.rollout.prefill_mfu * matmul_rate_factor(gpu, k.throughput)
    compute_total_s = 2 * active * generated / tp / prefill_flops_per_s
    kv_total_s = generated * (prompt + resp_mean / 2) * kv_per_token / bw
    decode_s = (max(steps * weight_read_s, compute_total_s) + kv_total_s
                + steps * (allreduce_s + k.rollout.decode_step_overhead_s))
    if eager:
        decode_s += steps * model.num_layers * k.rollout.eager_decode_s_per_layer
    prefill_tokens = seqs * prompt
    chunks = prefill_tokens / cand.max_num_batched_tokens
    prefill_s = max(2 * active * prefill_tokens / tp / prefill_flops_per_s,
                    chunks * weight_read_s)
    stall = k.rollout.chunked_prefill_stall if cand.enable_chunked_prefill else k.rollout.unchunked_prefill_stall
    wake_sleep_s = 2 * _host_copy_s(BF16 * model.param_count() / tp, gpu, k)  # sleep level 1 offloads weights
    return decode_s + stall * prefill_s + wake_sleep_s + k.rollout.verl_poll_wait_s, concurrency


def _update_weights_s(model: ModelSpec, gpu: GpuSpec, cand: Candidate, layout: ParallelLayout,
                      k: ModelConstants) -> float:
    """Actor -> vLLM weight sync: gather bf16 weights into each rollout shard (checkpoint_engine naive)."""
    shard_bytes = BF16 * model.param_count() / cand.rollout_tp
    s = k.system.weight_sync_fixed_s + shard_bytes / (_link(gpu, layout.world_size, layout.gpus_per_node)
                                                   * k.system.collective_efficiency)
    if cand.param_offload:
        s += _host_copy_s(actor_state_bytes(model, cand, layout).weights, gpu, k)
    return s


# The time model's revision: a node profile holds residuals against one model, so a model that prices a new cause
# starts new profiles (storage/node_profile.py NodeKind.model). Bump it with every change to phase times.
MODEL_REVISION = "2026-12-07-attention-mean-square"


def logprob_loop_s(workload: Workload, cand: Candidate, layout: ParallelLayout, *, forward_only: bool,
                   k: ModelConstants) -> float:
    """One rank's seconds in verl's per-token log-prob loop for one full-batch pass, on a node where verl takes it
    (autotune/verl/logprob_path.py). The FSDP engine runs it over the real tokens of its micro-batches (both padding
    paths narrow the logits to them first: engine/fsdp/transformer_impl.py:1416-1428, 1500-1522), each Ulysses rank
    over its share; the fused log-prob (model.use_fused_kernels) and the Megatron engine's vocab-parallel
    cross-entropy never call it."""
    if cand.is_megatron or cand.use_fused_kernels:
        return 0.0
    tokens = layout.trajectories_per_rank * workload.mean_seq_len / cand.ulysses_sp
    if forward_only:
        return tokens * k.system.logprob_loop_forward_s
    return tokens * k.system.logprob_loop_train_s * workload.ppo_epochs


def estimate_step_time(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate,
                       layout: ParallelLayout, *, constants: ModelConstants = DEFAULT_CONSTANTS,
                       logprob_loop: bool = False, vllm_eager: bool = False) -> StepTime:
    """`logprob_loop`: verl computes log-probs with its per-token loop on the node (no flash-attn cross-entropy;
    autotune/verl/logprob_path.py), priced by logprob_loop_s. `vllm_eager`: the job runs vLLM without CUDA graphs
    (rollout.enforce_eager; autotune/verl/rollout.py vllm_eager)."""
    k = constants
    gen_s, concurrency = _rollout_s(model, gpu, workload, cand, layout, k, eager=vllm_eager)
    old_s, _ = _pass_s(model, gpu, workload, cand, layout, forward_only=True, role="actor", k=k)
    ref_s = 0.0
    if need_reference_policy(workload):  # with LoRA the pass runs on the actor (autotune/verl/roles.py)
        ref_s, _ = _pass_s(model, gpu, workload, cand, layout, forward_only=True, role="ref", k=k)
        if cand.ref_param_offload and separate_reference(workload):
            ref_s += 2 * _host_copy_s(ref_weight_bytes(model, cand, layout), gpu, k)
    update_s, _ = _pass_s(model, gpu, workload, cand, layout, forward_only=False, k=k)
    state = actor_state_bytes(model, cand, layout, workload)
    if cand.optimizer_offload:
        update_s += 2 * _host_copy_s(state.optimizer, gpu, k)
    if cand.param_offload:
        moves = 2 * (2 + need_reference_policy(workload))  # load+offload around old_log_prob, (ref,) update
        update_s += moves / 2 * _host_copy_s(state.weights, gpu, k)
        old_s += _host_copy_s(state.weights, gpu, k)
    if logprob_loop:
        forward_loop_s = logprob_loop_s(workload, cand, layout, forward_only=True, k=k)
        old_s += forward_loop_s
        if need_reference_policy(workload):
            ref_s += forward_loop_s
        update_s += logprob_loop_s(workload, cand, layout, forward_only=False, k=k)
    sync_s = _update_weights_s(model, gpu, cand, layout, k)
    phase_s = {"gen": gen_s, "old_log_prob": old_s, "update_actor": update_s, "update_weights": sync_s}
    if need_reference_policy(workload):
        phase_s["ref"] = ref_s
    step_s = sum(phase_s.values()) + k.system.step_fixed_s
    tokens = workload.trajectories_per_step * workload.mean_seq_len
    world = layout.world_size
    # verl counts the real (unpadded) tokens of the batch (engine_workers.py:228-235, global_token_num)
    real_flops = train_flops_uniform(model, workload.trajectories_per_step, workload.mean_seq_len,
                                     mean_square_seq_len(workload)) * workload.ppo_epochs
    mfu_actor = real_flops / update_s / (gpu.peak_bf16_flops * world)
    # verl's FlopsCounter knows nothing of LoRA and counts 6N per token; a frozen base needs 4N
    model_flops_share = 4.0 / 6.0 if workload.lora_rank else 1.0
    return StepTime(phase_s=phase_s, step_s=step_s, tokens_per_step=tokens, tokens_per_s_per_gpu=tokens / step_s / world,
                    mfu_actor=mfu_actor, rollout_concurrency=concurrency,
                    mfu_actor_model_flops=mfu_actor * model_flops_share)
