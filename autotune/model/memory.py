"""Analytic memory model of one verl GRPO step, per GPU, by phase and component.

verl colocates the actor, the reference model and vLLM on every GPU (hybrid engine). Phases:
- rollout: vLLM is awake and owns `gpu_memory_utilization * total`; the actor keeps its sharded
  parameters (unless param_offload) and optimizer state (unless optimizer_offload) on the GPU.
  vLLM refuses to start when less than that share is free ("Free memory on device ... is less than
  desired GPU memory utilization"), and needs room for at least one max-length sequence of KV cache.
- old_log_prob / ref: forward-only passes; vLLM sleeps (free_cache_engine=True, rollout.yaml:61).
- update_actor: forward+backward per micro-batch, then the optimizer step. verl loads offloaded
  parameters, gradients and optimizer state back for the whole phase (engine/base.py BaseEngineCtx:
  train_mode moves the optimizer to the GPU on entry, back to the CPU on exit), so offload lowers the
  other phases' peaks but not this one's.
Constants come from model/calibration.py. Units: bytes inside, GiB at the interface.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.hardware import GIB, GpuSpec
from autotune.models import ModelSpec
from autotune.model.calibration import ACTIVATIONS, DEFAULT_CONSTANTS, ActivationConstants, ModelConstants
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload
from autotune.verl.rollout import effective_batched_tokens
from autotune.verl.pipeline_split import in_flight_layers, largest_stage_layers
from autotune.verl.roles import need_reference_policy, separate_reference

BF16 = 2
FP32 = 4


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    capacity_gib: float
    phase_peak_gib: dict[str, float]  # every phase's predicted peak on the most loaded GPU
    components_gib: dict[str, float]  # the components at the worst phase
    kv_cache_gib: float  # vLLM KV cache left inside gpu_memory_utilization
    kv_cache_needed_gib: float  # one max-length sequence: vLLM's minimum
    worst_phase: str = field(default="")

    @property
    def peak_gib(self) -> float:
        return max(self.phase_peak_gib.values())

    @property
    def kv_cache_fits(self) -> bool:
        return self.kv_cache_gib >= self.kv_cache_needed_gib

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.capacity_gib and self.kv_cache_fits

    @property
    def over_gib(self) -> float:
        """How far past capacity (or short of KV room); grades the sampler's constraint."""
        return max(self.peak_gib - self.capacity_gib, self.kv_cache_needed_gib - self.kv_cache_gib, 0.0)


# ---- building blocks (also used by the calibration check) -------------------------------------------

def mlp_width(model: ModelSpec) -> int:
    """Intermediate width whose activations a token stores: routed experts for MoE."""
    if model.is_moe:
        return model.num_experts_per_tok * model.moe_intermediate_size
    return model.intermediate_size


def activation_bytes_per_token_per_layer(model: ModelSpec, c: ActivationConstants = ACTIVATIONS, *,
                                         liger: bool = False) -> float:
    per_h = c.per_h - (c.liger_saved_per_h if liger else 0.0)
    per_i = c.per_i - (c.liger_saved_per_i if liger else 0.0)
    return per_h * model.hidden_size + per_i * mlp_width(model)


def train_activation_bytes(model: ModelSpec, tokens: float, *, layers: float, checkpointing: bool,
                           c: ActivationConstants = ACTIVATIONS, liger: bool = False) -> float:
    """Saved activations of `tokens` tokens through `layers` layers, plus the recompute of one layer."""
    full_layer = activation_bytes_per_token_per_layer(model, c, liger=liger) * tokens
    if not checkpointing:
        return full_layer * layers
    return c.ckpt_per_h * model.hidden_size * tokens * layers + full_layer


def train_logits_bytes(model: ModelSpec, tokens: float, *, start_of_backward: bool,
                       c: ActivationConstants = ACTIVATIONS, verl: bool = False) -> float:
    """Logits memory of a training micro-batch: the naive fp32 path the calibration rows ran, or verl's."""
    retained = c.verl_logits_retained_bytes if verl else c.logits_retained_bytes
    transient = c.verl_logits_transient_bytes if verl else c.logits_transient_bytes
    return tokens * model.vocab_size * (retained + (transient if start_of_backward else 0.0))


def fused_logits_bytes(model: ModelSpec, tokens: float, c: ActivationConstants = ACTIVATIONS) -> float:
    """Logits memory of verl's fused log-prob (model.use_fused_kernels): one chunk's, forward or backward."""
    return min(tokens, c.fused_chunk_tokens) * model.vocab_size * c.fused_chunk_bytes


def forward_logits_bytes(model: ModelSpec, tokens: float, c: ActivationConstants = ACTIVATIONS,
                         verl: bool = False, compiled: bool = True, padded_entropy: bool = False) -> float:
    if not verl:
        return tokens * model.vocab_size * c.logits_forward_bytes
    if padded_entropy:  # verl's padded branch: uncompiled entropy on fp32 logits (calibration.py)
        return tokens * model.vocab_size * c.verl_padded_entropy_forward_bytes
    entropy = c.verl_entropy_compiled_bytes if compiled else c.verl_entropy_bytes
    return tokens * model.vocab_size * (c.verl_logits_forward_bytes + entropy)


# ---- verl's engines ---------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ActorState:
    weights: float
    grads: float
    optimizer: float  # on the GPU while it trains
    gather_buffer: float  # unsharded FSDP units alive during compute (current + prefetched)
    optimizer_on_host: float = 0.0  # Megatron's CPU optimizer share, always on the host


def lora_params(model: ModelSpec, rank: int, target_modules: str | list | tuple = "all-linear") -> int:
    """LoRA A and B matrices, rank r each: r x (in + out) per targeted projection of every layer.

    verl's target_modules "all-linear" (peft: every linear layer but the LM head) means q, k, v, o,
    gate, up and down (routed experts' for MoE); a list targets the projections it names.
    """
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    width = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    experts = model.num_experts if model.is_moe else 1
    in_plus_out = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h,
                   "gate_proj": experts * (h + width), "up_proj": experts * (h + width),
                   "down_proj": experts * (width + h)}
    targets = in_plus_out if target_modules == "all-linear" else set(
        [target_modules] if isinstance(target_modules, str) else target_modules)
    return rank * model.num_layers * sum(size for name, size in in_plus_out.items() if name in targets)


def trained_params(model: ModelSpec, workload: Workload | None) -> int:
    """Parameters that get gradients and Adam state: the adapters with LoRA, else all of them."""
    if workload is None or not workload.lora_rank:
        return model.param_count()
    return lora_params(model, workload.lora_rank, workload.lora_target_modules)


def actor_state_bytes(model: ModelSpec, cand: Candidate, layout: ParallelLayout,
                      workload: Workload | None = None) -> ActorState:
    """Per-GPU bytes of actor parameters, gradients and Adam state as verl's engine shards them.

    FSDP (engine/fsdp.yaml): fp32 master parameters (model_dtype: fp32), fp32 gradients, fp32 Adam
    moments, all sharded over every rank (fsdp_size=-1); bf16 compute copies of one or two layers.
    Megatron (engine/megatron.yaml): bf16 parameters split by TP x PP (experts by EP x ETP), fp32
    gradient buffer, distributed optimizer holding fp32 main params + Adam moments split over DP; with the user's
    CPU optimizer (workload.megatron_optimizer_on_host) that share of it stays on the host.
    """
    n_total = model.param_count()
    if not cand.is_megatron:
        shard = layout.world_size
        layer_params = model.attn_params_per_layer() + model.mlp_params_per_layer()
        largest_unit = max(layer_params, model.vocab_size * model.hidden_size)
        # LoRA: the base is frozen (no gradients, no optimizer state); only the adapters train
        trained = trained_params(model, workload)
        adapters = trained if workload is not None and workload.lora_rank else 0  # held beside the base
        return ActorState(weights=FP32 * (n_total + adapters) / shard,
                          grads=FP32 * trained / shard, optimizer=2 * FP32 * trained / shard,
                          gather_buffer=2 * BF16 * largest_unit)
    expert_params = model.num_layers * model.mlp_params_per_layer() if model.is_moe else 0
    dense_params = n_total - expert_params
    per_rank = dense_params / (cand.actor_tp * cand.actor_pp)
    per_rank += expert_params / (cand.actor_ep * cand.actor_etp * cand.actor_pp)
    dp = max(layout.dp, 1)
    optimizer = 3 * FP32 * per_rank / dp
    on_host = workload.megatron_optimizer_on_host if workload is not None else 0.0
    return ActorState(weights=BF16 * per_rank, grads=FP32 * per_rank, optimizer=optimizer * (1 - on_host),
                      gather_buffer=0.0, optimizer_on_host=optimizer * on_host)


def ref_weight_bytes(model: ModelSpec, cand: Candidate, layout: ParallelLayout) -> float:
    """bf16 reference weights per GPU: FSDP shards over every rank; Megatron's ref copies the actor's
    TP/PP/EP/ETP (ref/megatron_ref.yaml:29-45)."""
    if not cand.is_megatron:
        return BF16 * model.param_count() / layout.world_size
    expert_params = model.num_layers * model.mlp_params_per_layer() if model.is_moe else 0
    dense = (model.param_count() - expert_params) / (cand.actor_tp * cand.actor_pp)
    return BF16 * (dense + expert_params / (cand.actor_ep * cand.actor_etp * cand.actor_pp))


@dataclass(frozen=True)
class DynamicSplit:
    """use_dynamic_bsz micro-batches on one rank: per mini-batch (update) or per batch (log-prob passes)."""

    count: int
    mean_tokens: float
    largest_tokens: float  # sets the memory peak


def _dynamic_bound(cand: Candidate, workload: Workload, *, forward_only: bool) -> float:
    """Most tokens a dynamic micro-batch may hold: the budget across the SP group, never less than one sequence."""
    budget = cand.log_prob_max_token_len_per_gpu if forward_only else cand.ppo_max_token_len_per_gpu
    sp = cand.actor_cp if cand.is_megatron else cand.ulysses_sp
    return max(budget * sp, workload.seq_len)


def dynamic_split(cand: Candidate, workload: Workload, layout: ParallelLayout, *, forward_only: bool) -> DynamicSplit:
    """verl splits a rank's batch into ceil(tokens / budget) micro-batches balanced by workload
    (utils/seqlen_balancing.py rearrange_micro_batches), so each holds about tokens / count, the largest
    less than one sequence more, never over the budget: 1.4 budgets run as two micro-batches of 0.7."""
    seq = workload.mean_seq_len if cand.use_remove_padding else workload.seq_len
    bound = _dynamic_bound(cand, workload, forward_only=forward_only)
    total = (layout.trajectories_per_rank if forward_only else layout.mini_batch_per_rank) * seq
    if total <= 0:
        return DynamicSplit(count=1, mean_tokens=bound, largest_tokens=bound)
    count = math.ceil(total / bound)
    mean = total / count
    largest = min(bound, max(mean + (workload.seq_len if count > 1 else 0.0), workload.seq_len))
    return DynamicSplit(count=count, mean_tokens=mean, largest_tokens=largest)


def tokens_per_micro_batch(cand: Candidate, workload: Workload, *, forward_only: bool, role: str = "actor",
                           layout: ParallelLayout | None = None, largest: bool = True) -> float:
    """Tokens one GPU processes in one micro-batch (before TP/CP/SP splitting).

    Dynamic batching: the largest micro-batch (the memory peak) or, with `largest=False`, the mean (the
    time); without a `layout`, the budget."""
    if cand.use_dynamic_bsz:
        if layout is None:
            return _dynamic_bound(cand, workload, forward_only=forward_only)
        split = dynamic_split(cand, workload, layout, forward_only=forward_only)
        return split.largest_tokens if largest else split.mean_tokens
    seq = workload.mean_seq_len if cand.use_remove_padding else workload.seq_len
    if not forward_only:
        micro = cand.ppo_micro_batch_size_per_gpu
    else:
        # with LoRA the reference pass runs on the actor with its log-prob micro-batch (autotune/verl/roles.py)
        ref = role == "ref" and separate_reference(workload)
        micro = cand.ref_log_prob_micro_batch_size_per_gpu if ref else cand.log_prob_micro_batch_size_per_gpu
    return micro * seq


def accumulates_gradients(cand: Candidate, workload: Workload, layout: ParallelLayout) -> bool:
    """More than one micro-batch per mini-batch on a rank (static: count; dynamic: verl's split)."""
    if cand.use_dynamic_bsz:
        return dynamic_split(cand, workload, layout, forward_only=False).count > 1
    return layout.micro_batches_per_mini > 1


def _token_split(cand: Candidate) -> int:
    """Ways one micro-batch's tokens are split across GPUs: Megatron SP(=TP) x CP, or Ulysses SP."""
    return cand.actor_tp * cand.actor_cp if cand.is_megatron else cand.ulysses_sp


def vllm_weights_bytes(model: ModelSpec, rollout_tp: int) -> float:
    return BF16 * model.param_count() / rollout_tp


def inference_bytes_per_token(model: ModelSpec, k: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """Transient bytes per token of one layer's forward without autograd (the widest bf16 tensors)."""
    r = k.rollout
    return r.activation_bytes_per_token_h * model.hidden_size + r.activation_bytes_per_token_i * mlp_width(model)


def vllm_profile_bytes(model: ModelSpec, cand: Candidate, k: ModelConstants = DEFAULT_CONSTANTS,
                       max_model_len: int = 0) -> float:
    """What vLLM's profile run reserves before sizing the KV cache: activations of one
    max_num_batched_tokens forward (split by TP) and fp32 sampler logits of max_num_seqs rows."""
    r = k.rollout
    tokens = effective_batched_tokens(cand, max_model_len)
    activations = r.activation_base_gib * GIB + tokens * inference_bytes_per_token(model, k) / cand.rollout_tp
    sampler = cand.max_num_seqs * model.vocab_size * r.sampler_logits_bytes
    return activations + sampler


def vllm_kv_budget_bytes(model: ModelSpec, cand: Candidate, total_mem_bytes: float,
                         k: ModelConstants = DEFAULT_CONSTANTS, max_model_len: int = 0) -> float:
    """KV cache vLLM can allocate on a GPU of `total_mem_bytes`: its share minus weights and what its
    profile run reserved. The torch probe measures the same quantities instead
    (backends/torch/probe/step.py), so the two can be compared."""
    share = cand.gpu_memory_utilization * total_mem_bytes
    return share - vllm_weights_bytes(model, cand.rollout_tp) - vllm_profile_bytes(model, cand, k, max_model_len)


def vllm_kv_cache_bytes(model: ModelSpec, gpu: GpuSpec, cand: Candidate,
                        k: ModelConstants = DEFAULT_CONSTANTS, max_model_len: int = 0) -> float:
    return vllm_kv_budget_bytes(model, cand, gpu.mem_gib * GIB, k, max_model_len)


def estimate_memory(model: ModelSpec, gpu: GpuSpec, workload: Workload, cand: Candidate,
                    layout: ParallelLayout, *, constants: ModelConstants = DEFAULT_CONSTANTS,
                    typical: bool = False) -> MemoryEstimate:
    """Predicted peak per phase on the most loaded GPU, with the components of the worst phase.

    Checked with every response at max_response_length (the search's gate: no late long-response OOM, verl
    issue 1232), or with `typical=True` at the workload's mean response length (what a run mostly sees)."""
    if not typical:
        workload = workload.at_max_length()
    k, act_c = constants, constants.activations
    state = actor_state_bytes(model, cand, layout, workload)
    overhead = k.system.cuda_context_gib * GIB + (k.system.nccl_buffers_gib * GIB if layout.world_size > 1 else 0.0)
    frag = k.system.allocator_fragmentation
    # with LoRA verl computes reference log-probs with the actor's adapters disabled: no second model
    ref_weights = ref_weight_bytes(model, cand, layout) if separate_reference(workload) else 0.0
    ref_resident = 0.0 if cand.ref_param_offload else ref_weights
    optim_resident = 0.0 if cand.optimizer_offload else state.optimizer
    weights_resident = 0.0 if cand.param_offload else state.weights
    split = _token_split(cand)
    # the fullest stage of an uneven split (verl/pipeline_split.py) holds ceil(L/PP)-ish layers, not L/PP
    layers_on_rank = largest_stage_layers(model.num_layers, cand.actor_pp) if cand.is_megatron else model.num_layers
    vocab_split = cand.actor_tp if cand.is_megatron else 1
    sleeping_vllm = k.rollout.sleep_residual_gib * GIB

    # rollout: vLLM's whole share plus what the trainer keeps resident
    vllm_share = cand.gpu_memory_utilization * gpu.mem_gib * GIB
    rollout = weights_resident + optim_resident + ref_resident + vllm_share + overhead

    # forward-only passes: one layer's activations + logits of a micro-batch
    def forward_pass(role: str, weights: float) -> float:
        tok = tokens_per_micro_batch(cand, workload, forward_only=True, role=role, layout=layout) / split
        # no autograd: only one layer's transient tensors live at a time, as in vLLM's profile forward
        act = inference_bytes_per_token(model, k) * tok
        # the entropy is computed in the actor's old_log_prob pass only (calculate_entropy), on the padded batch
        # when remove-padding and Ulysses are both off (FSDP engine; transformer_impl.py:1456-1491)
        padded = role == "actor" and not cand.is_megatron and not cand.use_remove_padding and cand.ulysses_sp == 1
        logits = forward_logits_bytes(model, tok, act_c, verl=True,
                                       # the Megatron engine never reads use_torch_compile (autotune/verl/keys.py)
                                       compiled=cand.use_torch_compile and not cand.is_megatron,
                                       padded_entropy=padded) / vocab_split
        if cand.use_fused_kernels and not cand.is_megatron:
            logits = fused_logits_bytes(model, tok, act_c)
        return (weights + optim_resident + ref_resident * (role != "ref") + state.gather_buffer
                + frag * (act + logits) + sleeping_vllm + overhead)

    old_log_prob = forward_pass("actor", state.weights)
    ref = forward_pass("ref", state.weights * (not cand.param_offload) + ref_weights) if need_reference_policy(workload) else 0.0

    # actor update: start of backward (activations + logits transients) vs end (all grads) vs optimizer step;
    # the optimizer state is resident throughout, offloaded or not (train_mode loads it on entry)
    tok = tokens_per_micro_batch(cand, workload, forward_only=False, layout=layout) / split
    in_flight = min(cand.actor_pp, max(layout.micro_batches_per_mini, 1)) if cand.is_megatron else 1
    # the interleaved schedule holds (1 + (p-1)/(p*v)) times 1F1B's activations on the first stage (Korthikanti et al.
    # 2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 4.2.3); plain 1F1B (v = 1) holds
    # min(PP - r, m) micro-batches of stage r's layers, the peak over stages (verl/pipeline_split.in_flight_layers)
    vpp_extra = 1 + (cand.actor_pp - 1) / (cand.actor_pp * cand.actor_vpp) if cand.is_megatron and cand.actor_vpp > 1 else 1
    if cand.is_megatron and cand.actor_vpp == 1:
        layers_on_rank = in_flight_layers(model.num_layers, cand.actor_pp, layout.micro_batches_per_mini) / in_flight
    act = train_activation_bytes(model, tok, layers=layers_on_rank, checkpointing=cand.gradient_checkpointing,
                                 c=act_c, liger=cand.use_liger)
    act *= in_flight * vpp_extra  # 1F1B keeps up to PP micro-batches of L/PP layers on the first stage
    if cand.activation_offload:
        act = train_activation_bytes(model, tok, layers=1, checkpointing=False, c=act_c,  # one layer on GPU at a time
                                     liger=cand.use_liger)
    logits_start = train_logits_bytes(model, tok, start_of_backward=True, c=act_c, verl=True) / vocab_split
    logits_end = train_logits_bytes(model, tok, start_of_backward=False, c=act_c, verl=True) / vocab_split
    if cand.use_fused_kernels and not cand.is_megatron:
        logits_start = logits_end = fused_logits_bytes(model, tok, act_c)
    static = state.weights + ref_resident + state.gather_buffer + sleeping_vllm + overhead
    # gradient accumulation: from a mini-batch's second micro-batch on, the first ones' gradients are held
    # through the whole forward and backward (verl zero_grads once per mini-batch, dp_actor.update_policy)
    accumulated = state.grads if accumulates_gradients(cand, workload, layout) else 0.0
    layer_inputs = act_c.ckpt_per_h * model.hidden_size * tok * layers_on_rank  # kept until their layer's backward
    if cand.gradient_checkpointing and not cand.activation_offload:
        # the logits (and their in-place gradient) are gone once the LM head's backward has run, before the
        # first layer is recomputed: the two peaks do not stack
        recompute = activation_bytes_per_token_per_layer(model, act_c, liger=cand.use_liger) * tok
        bwd_start = static + accumulated + state.optimizer + frag * (layer_inputs * in_flight * vpp_extra
                                                                     + max(logits_start, recompute))
    else:
        bwd_start = static + accumulated + state.optimizer + frag * (act + logits_start)
    bwd_end = static + state.optimizer + state.grads + frag * (logits_end + layer_inputs)
    opt_step = static + state.grads + state.optimizer
    update = max(bwd_start, bwd_end, opt_step)
    if cand.actor_engine == "fsdp2":
        fixed = sleeping_vllm + overhead
        update = fixed + k.system.fsdp2_memory_factor * (update - fixed)

    phases = {"rollout": rollout, "old_log_prob": old_log_prob, "update_actor": update}
    if need_reference_policy(workload):
        phases["ref"] = ref
    worst = max(phases, key=phases.get)
    components = {
        "weights": state.weights / GIB, "gradients": state.grads / GIB, "optimizer": state.optimizer / GIB,
        "activations": act / GIB, "logits": logits_start / GIB, "reference": ref_resident / GIB,
        "vllm_share": vllm_share / GIB, "overhead": overhead / GIB,
    }
    # vLLM must hold one sequence of rollout.max_model_len (exported: prompt + response unless the user set it)
    kv = vllm_kv_cache_bytes(model, gpu, cand, k, workload.rollout_max_model_len)
    kv_needed = model.kv_cache_bytes_per_token(cand.rollout_tp) * workload.rollout_max_model_len
    return MemoryEstimate(capacity_gib=gpu.mem_gib, phase_peak_gib={k: v / GIB for k, v in phases.items()},
                          components_gib=components, kv_cache_gib=kv / GIB, kv_cache_needed_gib=kv_needed / GIB,
                          worst_phase=worst)
