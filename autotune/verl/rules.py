"""verl 0.9.1's startup and first-step checks, as pure rules over a candidate.

Each rule returns a `Violation` (rule id, the message verl or the engine would print, who enforces it,
where) or None. `check()` runs them all; the driver stores violations as a rejected trial before any
backend runs, so a config verl would refuse never costs a GPU launch. Sources are verl 0.9.1 wheel
paths (see ../shared/reference/verl.md section 2) or the engine that raises at init.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload
from autotune.verl.pipeline_split import derived_split
from autotune.verl.roles import reference, separate_reference


@dataclass(frozen=True, kw_only=True)
class Violation:
    rule: str
    message: str
    enforced_by: str  # verl | vllm | megatron-core | autotune
    source: str
    # "config": verl refuses it at start-up from the config alone (validate_config, the config dataclasses, the
    # worker's asserts before any engine starts; autotune/verl/judge.py runs exactly these on CPU);
    # "worker": an engine, vLLM or the first step refuses it (needs GPUs; docs/verl-judge.md)
    stage: str = "worker"

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class CheckContext:
    model: ModelSpec
    workload: Workload
    candidate: Candidate
    layout: ParallelLayout


Rule = Callable[[CheckContext], "Violation | None"]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def _v(rule_id: str, message: str, enforced_by: str, source: str, *, stage: str = "worker") -> Violation:
    return Violation(rule=rule_id, message=message, enforced_by=enforced_by, source=source, stage=stage)


# ---- world size and parallel layout -------------------------------------------------------------

@rule
def world_divisible_by_model_parallel(ctx: CheckContext) -> Violation | None:
    c, n = ctx.candidate, ctx.layout.world_size
    if not c.is_megatron:
        return None
    mp = c.actor_tp * c.actor_pp
    if n % (mp * c.actor_cp) == 0:
        return None
    return _v("world_divisible_by_model_parallel",
              f"n_gpus ({n}) must be divisible by model_parallel_size ({mp}) times context_parallel_size ({c.actor_cp})",
              "verl", "verl/utils/config.py:109-114 (validate_config)",
              # validate_config checks it in static batching only; Megatron's init refuses it either way
              stage="worker" if c.use_dynamic_bsz else "config")


@rule
def world_divisible_by_ulysses(ctx: CheckContext) -> Violation | None:
    c, n = ctx.candidate, ctx.layout.world_size
    if c.is_megatron or n % c.ulysses_sp == 0:
        return None
    return _v("world_divisible_by_ulysses", f"world size {n} is not divisible by ulysses_sequence_parallel_size {c.ulysses_sp}",
              "verl", "torch init_device_mesh via verl/workers/engine/fsdp/transformer_impl.py (dp x sp mesh)")


@rule
def real_train_batch_divisible(ctx: CheckContext) -> Violation | None:
    c, w, lay = ctx.candidate, ctx.workload, ctx.layout
    if c.use_dynamic_bsz or not lay.dp:
        return None
    minimal_bsz = lay.dp * c.ppo_micro_batch_size_per_gpu if c.is_megatron else lay.world_size
    real = w.trajectories_per_step
    if real % minimal_bsz == 0:
        return None
    return _v("real_train_batch_divisible",
              f"real_train_batch_size ({real}) must be divisible by minimal possible batch size ({minimal_bsz})",
              "verl", "verl/utils/config.py:118-127 (validate_config)", stage="config")


@rule
def mini_batch_divisible_by_dp(ctx: CheckContext) -> Violation | None:
    lay = ctx.layout
    mini = ctx.workload.trajectories_per_mini_batch
    if not lay.dp or mini % lay.dp == 0:
        return None
    return _v("mini_batch_divisible_by_dp", f"Got mini_batch_size={mini} and dp_size={lay.dp}",
              "verl", "verl/workers/engine_workers.py:261-270 (train_mini_batch assert)")


@rule
def micro_batch_divides_mini_batch(ctx: CheckContext) -> Violation | None:
    c, lay = ctx.candidate, ctx.layout
    mini = ctx.workload.trajectories_per_mini_batch
    if c.use_dynamic_bsz or not lay.dp or mini % lay.dp:
        return None
    per_rank = mini // lay.dp
    if per_rank % c.ppo_micro_batch_size_per_gpu == 0:
        return None
    return _v("micro_batch_divides_mini_batch",
              f"{per_rank} % {c.ppo_micro_batch_size_per_gpu} != 0 (per-rank mini-batch {per_rank} is not divisible by "
              f"ppo_micro_batch_size_per_gpu {c.ppo_micro_batch_size_per_gpu})",
              "verl", "verl/utils/tensordict_utils.py make_iterator; verl/workers/engine/utils.py:92-131")


def _log_prob_micro_rule(ctx: CheckContext, role: str, micro: int) -> Violation | None:
    lay = ctx.layout
    full = ctx.workload.trajectories_per_step
    if ctx.candidate.use_dynamic_bsz or not lay.dp or full % lay.dp:
        return None
    per_rank = full // lay.dp
    if per_rank % micro == 0:
        return None
    return _v(f"{role}_log_prob_micro_divides_batch",
              f"data size must be divisible by force_group_size * micro_batch_size_per_gpu "
              f"({role}: per-rank batch {per_rank}, log_prob_micro_batch_size_per_gpu {micro})",
              "verl", "verl/workers/engine/utils.py:92-131 (static micro-batching in infer_batch)")


@rule
def rollout_log_prob_micro_divides_batch(ctx: CheckContext) -> Violation | None:
    return _log_prob_micro_rule(ctx, "rollout", ctx.candidate.log_prob_micro_batch_size_per_gpu)


@rule
def ref_log_prob_micro_divides_batch(ctx: CheckContext) -> Violation | None:
    if not separate_reference(ctx.workload):  # LoRA: the actor's log-prob pass (autotune/verl/roles.py)
        return None
    return _log_prob_micro_rule(ctx, "ref", ctx.candidate.ref_log_prob_micro_batch_size_per_gpu)


@rule
def rollout_world_divisible(ctx: CheckContext) -> Violation | None:
    n, tp = ctx.layout.world_size, ctx.candidate.rollout_tp
    if n % tp == 0:
        return None
    return _v("rollout_world_divisible", f"rollout world_size: {n} is not divisible by infer_world_size: {tp}",
              "verl", "verl/workers/engine_workers.py:652-661", stage="config")


@rule
def rollout_replica_spans_whole_nodes(ctx: CheckContext) -> Violation | None:
    tp, per_node = ctx.candidate.rollout_tp, ctx.layout.gpus_per_node
    node_share = min(per_node, tp)  # replica.py:113: min(gpus_per_node, replica world size)
    if tp % node_share == 0 or node_share % tp == 0:
        return None
    return _v("rollout_replica_spans_whole_nodes", f"world_size {tp} must be divisible by gpus_per_node {node_share}",
              "verl", "verl/workers/rollout/replica.py:107-116")


@rule
def vllm_heads_divisible_by_tp(ctx: CheckContext) -> Violation | None:
    heads, tp = ctx.model.num_heads, ctx.candidate.rollout_tp
    if heads % tp == 0:
        return None
    return _v("vllm_heads_divisible_by_tp",
              f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
              "vllm", "vllm/config/parallel.py (ModelConfig.verify_with_parallel_config)")


# ---- Megatron ---------------------------------------------------------------------------------------

@rule
def megatron_heads_divisible_by_tp(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    if not c.is_megatron or m.num_heads % c.actor_tp == 0:
        return None
    return _v("megatron_heads_divisible_by_tp",
              f"num_attention_heads ({m.num_heads}) must be a multiple of tensor_model_parallel_size ({c.actor_tp}).",
              "megatron-core", "megatron/core/transformer/transformer_config.py (__post_init__)")


@rule
def megatron_kv_heads_divisible_by_tp(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    if not c.is_megatron or m.num_kv_heads % c.actor_tp == 0:
        return None
    return _v("megatron_kv_heads_divisible_by_tp",
              f"num_query_groups ({m.num_kv_heads}) must be a multiple of tensor_model_parallel_size ({c.actor_tp}).",
              "megatron-core", "megatron/core/transformer/transformer_config.py (__post_init__)")


@rule
def megatron_layers_divisible_by_pp(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    # layers that do not divide by PP get an uneven split (verl/pipeline_split.py), which Megatron builds
    # without virtual pipeline stages only
    if not c.is_megatron or m.num_layers % c.actor_pp == 0 or (c.actor_vpp == 1 and derived_split(m.num_layers,
                                                                                                   c.actor_pp)):
        return None
    return _v("megatron_layers_divisible_by_pp", "num_layers should be divisible by pipeline_model_parallel_size "
              f"(num_layers={m.num_layers}, pipeline_model_parallel_size={c.actor_pp}); autotune's uneven split "
              "applies without virtual pipeline stages only",
              "megatron-core", "megatron/core/transformer/transformer_config.py (__post_init__, uneven PP)")


@rule
def megatron_vpp_layout(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    if not c.is_megatron or c.actor_vpp == 1:
        return None
    if c.actor_pp < 2:
        msg = f"virtual_pipeline_model_parallel_size ({c.actor_vpp}) needs pipeline_model_parallel_size > 1"
    elif (m.num_layers // c.actor_pp) % c.actor_vpp:
        msg = (f"layers per pipeline rank ({m.num_layers // c.actor_pp}) must be divisible by "
               f"virtual_pipeline_model_parallel_size ({c.actor_vpp})")
    else:
        return None
    return _v("megatron_vpp_layout", msg, "megatron-core", "verl/utils/megatron/router_replay_utils.py:105-153")


def _vpp_pass(ctx: CheckContext, rule_id: str, pass_name: str, per_rank: float, micro: int) -> Violation | None:
    """With VPP, a pass's micro-batch count must be divisible by microbatch_group_size_per_vp_stage (= PP);
    verl asserts it for training and for the log-prob passes in infer_batch."""
    c, lay = ctx.candidate, ctx.layout
    if not c.is_megatron or c.actor_vpp == 1 or c.use_dynamic_bsz or not lay.dp:
        return None
    n_micro = per_rank / micro
    if n_micro == int(n_micro) and int(n_micro) % c.actor_pp == 0:
        return None
    return _v(rule_id, f"micro_batches {n_micro:g} must be divisible by num_batches_divided_by {c.actor_pp} for "
              f"megatron backend ({pass_name} pass)", "verl", "verl/workers/engine/megatron/transformer_impl.py:873-918")


@rule
def megatron_vpp_micro_batches(ctx: CheckContext) -> Violation | None:
    lay, w, c = ctx.layout, ctx.workload, ctx.candidate
    return _vpp_pass(ctx, "megatron_vpp_micro_batches", "update_actor",
                     w.trajectories_per_mini_batch / max(lay.dp, 1), c.ppo_micro_batch_size_per_gpu)


@rule
def megatron_vpp_log_prob_micro_batches(ctx: CheckContext) -> Violation | None:
    lay, w, c = ctx.layout, ctx.workload, ctx.candidate
    return _vpp_pass(ctx, "megatron_vpp_log_prob_micro_batches", "old_log_prob",
                     w.trajectories_per_step / max(lay.dp, 1), c.log_prob_micro_batch_size_per_gpu)


@rule
def megatron_vpp_ref_micro_batches(ctx: CheckContext) -> Violation | None:
    lay, w, c = ctx.layout, ctx.workload, ctx.candidate
    if not separate_reference(w):
        return None
    return _vpp_pass(ctx, "megatron_vpp_ref_micro_batches", "ref",
                     w.trajectories_per_step / max(lay.dp, 1), c.ref_log_prob_micro_batch_size_per_gpu)


@rule
def megatron_experts_divisible_by_ep(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    if not c.is_megatron or c.actor_ep == 1:
        return None
    if not m.is_moe:
        return _v("megatron_experts_divisible_by_ep", f"expert_model_parallel_size {c.actor_ep} > 1 needs an MoE model",
                  "autotune", "megatron-core: EP applies only to MoE layers")
    if m.num_experts % c.actor_ep == 0:
        return None
    return _v("megatron_experts_divisible_by_ep",
              f"num_moe_experts ({m.num_experts}) must be divisible by expert_model_parallel_size ({c.actor_ep})",
              "megatron-core", "megatron/core/transformer/moe/moe_layer.py (num_local_experts)")


@rule
def megatron_expert_group_fits(ctx: CheckContext) -> Violation | None:
    c, n = ctx.candidate, ctx.layout.world_size
    if not c.is_megatron or (c.actor_ep == 1 and c.actor_etp == 1):
        return None
    group = c.actor_ep * c.actor_etp * c.actor_pp
    if n % group == 0:
        return None
    return _v("megatron_expert_group_fits",
              f"world size ({n}) must be divisible by expert_tensor_parallel_size x expert_model_parallel_size x "
              f"pipeline_model_parallel_size ({c.actor_etp} x {c.actor_ep} x {c.actor_pp})",
              "megatron-core", "megatron/core/parallel_state.py (initialize_model_parallel, expert decoder mesh)")


@rule
def megatron_device_max_connections(ctx: CheckContext) -> Violation | None:
    """verl exports CUDA_DEVICE_MAX_CONNECTIONS=1 itself on Ampere/Hopper (trainer/constants_ppo.py:122-124) and
    megatron-core only warns about other values, so any value is accepted for Megatron; the cost model
    prices the overlap it loses."""
    c = ctx.candidate
    if not c.is_megatron and c.cuda_device_max_connections:
        return _v("megatron_device_max_connections", "CUDA_DEVICE_MAX_CONNECTIONS applies to the Megatron engine only",
                  "autotune", "autotune search space")
    return None


# ---- FSDP and Ulysses -----------------------------------------------------------------------------

@rule
def engine_knobs_match_engine(ctx: CheckContext) -> Violation | None:
    c = ctx.candidate
    if c.is_megatron and c.ulysses_sp != 1:
        return _v("engine_knobs_match_engine", "ulysses_sequence_parallel_size applies to FSDP; use context parallel "
                  "with Megatron", "verl", "verl/trainer/config/engine/megatron.yaml")
    if c.is_megatron and c.activation_offload:
        return _v("engine_knobs_match_engine", "enable_activation_offload is supported by the FSDP engine only",
                  "verl", "verl/workers/engine/fsdp/transformer_impl.py:477-479")
    if c.is_megatron and c.use_liger:
        # verl's Megatron engine never reads model.use_liger: the knob would be a silent no-op
        return _v("engine_knobs_match_engine", "use_liger is applied by the FSDP engine only", "verl",
                  "verl/workers/engine/fsdp/transformer_impl.py:307-316")
    megatron_only = (c.actor_tp, c.actor_pp, c.actor_vpp, c.actor_cp, c.actor_ep, c.actor_etp)
    if not c.is_megatron and any(v != 1 for v in megatron_only):
        return _v("engine_knobs_match_engine", "tensor/pipeline/context/expert parallel sizes apply to the Megatron "
                  "engine only (model_engine=megatron)", "verl", "verl/trainer/config/engine/megatron.yaml")
    if c.actor_engine not in ("fsdp", "fsdp2", "megatron"):
        return _v("engine_knobs_match_engine", f"strategy {c.actor_engine} not supported", "verl",
                  "verl/workers/config/engine.py:306")
    return None


@rule
def ulysses_heads_divisible(ctx: CheckContext) -> Violation | None:
    c, m = ctx.candidate, ctx.model
    sp = c.ulysses_sp
    if sp == 1:
        return None
    if m.num_heads % sp:
        return _v("ulysses_heads_divisible", f"num_attention_heads {m.num_heads} must be divisible by ulysses_sp_size {sp}",
                  "verl", "verl/models/transformers/monkey_patch.py:343-350")
    if m.num_kv_heads % sp and sp % m.num_kv_heads:
        return _v("ulysses_heads_divisible", f"num_key_value_heads {m.num_kv_heads} must be divisible by ulysses_sp_size "
                  f"{sp}or vise versa. Upon ulysses_sp_size % num_key_value_heads == 0,kv heads are repeated to ensure "
                  "correct ulysses.", "verl", "verl/models/transformers/monkey_patch.py:343-350")
    return None


@rule
def ulysses_needs_remove_padding(ctx: CheckContext) -> Violation | None:
    c = ctx.candidate
    if c.ulysses_sp == 1 or c.use_remove_padding:
        return None
    return _v("ulysses_needs_remove_padding",
              "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`.",
              "verl", "verl/workers/config/actor.py:331-341 (FSDPActorConfig.validate)", stage="config")


# ---- dynamic batch size ---------------------------------------------------------------------------

def _token_floor(ctx: CheckContext, rule_id: str, key: str, budget: int) -> Violation | None:
    c, w = ctx.candidate, ctx.workload
    if not c.use_dynamic_bsz:
        return None
    # verl scales the budget by the sequence-splitting degree: Ulysses SP, or Megatron CP
    # (engine/megatron/transformer_impl.py:836 -> engine/utils.py:111)
    sp = c.actor_cp if c.is_megatron else c.ulysses_sp
    if budget * sp >= w.seq_len:
        return None
    return _v(rule_id, f"max_token_len must be greater than the sequence length. Got max_token_len={budget * sp} and "
              f"max_seq_len={w.seq_len} ({key}={budget} x sequence split {sp})",
              "verl", "verl/utils/seqlen_balancing.py:384-386")


@rule
def dynamic_bsz_token_floor(ctx: CheckContext) -> Violation | None:
    c = ctx.candidate
    return _token_floor(ctx, "dynamic_bsz_token_floor", "ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu)


@rule
def dynamic_bsz_log_prob_token_floor(ctx: CheckContext) -> Violation | None:
    c = ctx.candidate
    return _token_floor(ctx, "dynamic_bsz_log_prob_token_floor", "log_prob_max_token_len_per_gpu",
                        c.log_prob_max_token_len_per_gpu)


# ---- vLLM scheduler -------------------------------------------------------------------------------

@rule
def vllm_batched_tokens_cover_seqs(ctx: CheckContext) -> Violation | None:
    c = ctx.candidate
    if c.max_num_batched_tokens >= c.max_num_seqs:
        return None
    return _v("vllm_batched_tokens_cover_seqs",
              f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be greater than or equal to max_num_seqs "
              f"({c.max_num_seqs}).", "vllm", "vllm/config/scheduler.py (SchedulerConfig._verify_args)")


@rule
def max_model_len_within_context(ctx: CheckContext) -> Violation | None:
    limit, wanted = ctx.model.max_position_embeddings, ctx.workload.rollout_max_model_len
    if not limit or wanted <= limit:
        return None  # 0: the model's context is not known (no config.json at hand)
    return _v("max_model_len_within_context",
              f"max_model_len ({wanted}) should be less than or equal to max_position_embeddings ({limit})",
              "verl", "verl/workers/rollout/vllm_rollout/vllm_async_server.py:1107-1111 (_validate_configs)")


# No rule for max_num_batched_tokens < max_model_len with chunked prefill off: verl raises max_num_batched_tokens to
# max_model_len itself (verl/workers/rollout/vllm_rollout/vllm_async_server.py:1113-1119); the memory model prices
# the raised value (verl/rollout.py effective_batched_tokens).


@rule
def ref_offload_needs_ref(ctx: CheckContext) -> Violation | None:
    if ctx.candidate.ref_param_offload and not separate_reference(ctx.workload):
        return _v("ref_offload_needs_ref", "ref param_offload set but the workload has no reference model of its own "
                  f"(reference: {reference(ctx.workload)})", "autotune", "verl/trainer/ppo/utils.py:75-79 (need_reference_policy)")
    return None


def check(model: ModelSpec, workload: Workload, candidate: Candidate, layout: ParallelLayout) -> list[Violation]:
    """All violations of verl's rules for this candidate (empty when verl would accept it)."""
    ctx = CheckContext(model=model, workload=workload, candidate=candidate, layout=layout)
    return [v for v in (r(ctx) for r in RULES) if v is not None]
