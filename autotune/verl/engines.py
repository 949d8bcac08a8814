"""What an engine switch (FSDP/FSDP2 <-> Megatron) carries, drops and cannot carry, and what the search holds at
the user's value because of it: the declared table the export and the semantic judge (autotune/verl/semantic.py)
both read.

verl 0.9.1 runs two training engines with two config trees: FSDP (`actor.fsdp_config.*`, PEFT LoRA from
`model.lora_rank`, FSDPOptimizerConfig) and Megatron (`actor.megatron.*`, Megatron-Bridge LoRA from `model.lora.*`,
McoreOptimizerConfig). A searched knob moves between them through the key table (autotune/verl/keys.py). Of a
user's other keys in an engine's own section, some only change speed or memory and are dropped on a switch
(`SPEED_ONLY_ENGINE_KEYS`, each with why); every other one has no exact counterpart in the other engine, so it
holds the user's engine family (`holds`), and the first lines and best.yaml's header say so.
"""

from __future__ import annotations

from typing import NamedTuple

from autotune.verl.keys import A, ARO, M, R, TABLE

ENGINE_FAMILIES = {"fsdp": ("fsdp", "fsdp2"), "fsdp2": ("fsdp", "fsdp2"), "megatron": ("megatron",)}
ROLES = (f"{ARO}.actor.", f"{ARO}.ref.", "critic.")

# The optimizer fields both engines share with one meaning: verl's base OptimizerConfig
# (workers/config/optimizer.py:33-55), which both read the same way (warm-up: lr_warmup_steps, or
# lr_warmup_steps_ratio * total steps when <= 0: engine/fsdp/transformer_impl.py:514-516,
# utils/megatron/optimizer.py:246-249). Every other optimizer field belongs to one engine's config:
# FSDPOptimizerConfig (lr_scheduler_type, min_lr_ratio, ...: :87-125) or McoreOptimizerConfig (lr_decay_style,
# min_lr, lr_warmup_init, ...: :127-234); `optimizer` and `override_optimizer_config` are declared by both but
# name a torch.optim class and its kwargs under FSDP, Megatron's optimizer and its OptimizerConfig fields under
# Megatron (utils/megatron/optimizer.py:208-211). Such a key has no exact counterpart in the other engine, and
# dropping it would change the learning-rate schedule (what the model learns): it holds the user's engine.
SHARED_OPTIM_FIELDS = frozenset({"lr", "lr_warmup_steps_ratio", "total_training_steps", "weight_decay",
                                 "lr_warmup_steps", "betas", "clip_grad", "grad_clip"})
OPTIM_SECTIONS = (f"{A}.optim.", "critic.optim.")

# Keys both engines' configs declare with different defaults (verl 0.9.1 composed with and without
# model_engine=megatron; tests/verl/test_semantic.py checks this list against verl's configs). At both defaults
# they are the same training:
ENGINE_DEFAULT_DIFFERENCES = {
    **{f"{role}{leaf}": "the engine's own config class and strategy name"
       for role in ROLES for leaf in ("_target_", "strategy", "checkpoint._target_")},
    **{f"{section}_target_": "the engine's own optimizer config class" for section in OPTIM_SECTIONS},
    **{f"{section}optimizer": "AdamW under both: torch.optim.AdamW (FSDP) and megatron-core's 'adam', Adam with "
       "decoupled weight decay (megatron/core/optimizer/__init__.py: FusedAdam, adam_w_mode)"
       for section in OPTIM_SECTIONS},
    **{f"{section}override_optimizer_config": "empty under both (None under FSDP, {} under Megatron)"
       for section in OPTIM_SECTIONS},
    f"{R}.qat.activation_observer": "the rollout's QAT settings follow the engine's qat section "
                                    "(rollout.yaml:482); QAT is off (qat.enable: False) under both",
    f"{R}.qat.ignore_patterns": "as qat.activation_observer",
    "model_engine": "the Hydra group that selects the engine (ppo_trainer.yaml:9)",
}

# A user's key in one engine's own section that only changes speed, memory or how weights are loaded: dropped
# when the search moves to the other engine. Keys are relative to a role (actor_rollout_ref.actor., .ref.,
# critic.); a trailing dot matches a whole section.
SPEED_ONLY_ENGINE_KEYS = {
    "megatron.use_mbridge": "how HF weights are converted (Megatron-Bridge or verl's converter): same weights",
    "megatron.vanilla_mbridge": "as use_mbridge",
    "megatron.use_dist_checkpointing": "load from a Megatron dist checkpoint of the same weights (start-up only)",
    "megatron.dist_checkpointing_path": "as use_dist_checkpointing",
    "megatron.dist_checkpointing_prefix": "as use_dist_checkpointing",
    "megatron.use_megatron_fsdp": "how Megatron shards parameters (memory and communication)",
    "megatron.use_distributed_optimizer": "how Megatron shards optimizer state (memory)",
    "megatron.sequence_parallel": "activation sharding within tensor parallelism (memory)",
    "megatron.override_ddp_config.": "gradient buckets and overlap (communication)",
    **{f"megatron.override_transformer_config.{leaf}": "kernel fusion (speed): the same operations"
       for leaf in ("gradient_accumulation_fusion", "apply_rope_fusion", "persist_layer_norm", "masked_softmax_fusion",
                    "bias_dropout_fusion", "bias_activation_fusion", "moe_permute_fusion", "moe_grouped_gemm",
                    "moe_router_fusion", "attention_backend")},
    **{f"megatron.override_transformer_config.{leaf}": "expert token communication (speed): same routing"
       for leaf in ("moe_token_dispatcher_type", "moe_enable_deepep", "moe_flex_dispatcher_backend",
                    "moe_shared_expert_overlap")},
    **{f"megatron.override_transformer_config.{leaf}": "activation recomputation (memory); autotune's "
       "gradient_checkpointing knob" for leaf in ("recompute_granularity", "recompute_method", "recompute_num_layers",
                                                  "recompute_modules")},
    **{f"megatron.override_transformer_config.{leaf}": "which pipeline stage holds which layers (memory, bubbles)"
       for leaf in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")},
    "megatron.override_transformer_config.deallocate_pipeline_outputs": "frees pipeline outputs early (memory)",
    "fsdp_config.fsdp_size": "the FSDP sharding group (memory and communication)",
    "fsdp_config.forward_prefetch": "FSDP prefetch (overlap)",
    "fsdp_config.reshard_after_forward": "FSDP resharding (memory)",
    "fsdp_config.wrap_policy.": "FSDP unit size (memory and overlap)",
    "fsdp_config.offload_policy": "FSDP2's CPU offload (memory)",
    "fsdp_config.use_orig_params": "FSDP1's parameter views",
    "grad_clip": "read by nothing in verl 0.9.1: both engines clip with optim.clip_grad "
                 "(engine/fsdp/transformer_impl.py:795-811)",
    "entropy_checkpointing": "recomputes the entropy in the backward pass (memory)",
    "pad_to_length": "pads micro-batches to a fixed length (speed)",
    "use_remove_padding": "the FSDP actor's copy of model.use_remove_padding, a searched knob",
    "checkpoint.mbridge_config": "how Megatron-Bridge saves checkpoints",
    "nccl_timeout": "the Megatron critic's collective timeout (GRPO has no critic)",
}


# Keys of the shared model section that one engine reads and the other ignores: a user's non-default value there
# does not survive a switch even though the key stays in the config.
ENGINE_READS = {
    "fsdp": {f"{M}.{leaf}": "PEFT LoRA (engine/fsdp/transformer_impl.py:162, 342-368)"
             for leaf in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path")},
    "megatron": {f"{M}.lora.": "Megatron-Bridge LoRA (workers/config/megatron_peft.py, "
                              "engine/megatron/transformer_impl.py:433-437)"},
}


def family(engine: str) -> str:
    """The engine family (fsdp for FSDP and FSDP2) whose config tree an engine uses."""
    return "megatron" if engine == "megatron" else "fsdp"


def _listed(key: str, entries) -> bool:
    """`key` is an entry, or lies under an entry that ends with a dot (a whole section)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in entries)


def read_only_by(key: str) -> str | None:
    """The engine family that alone reads this shared key (ENGINE_READS), else None."""
    return next((engine for engine, keys in ENGINE_READS.items() if _listed(key, keys)), None)


# What only one engine family's actor/ref/critic config declares (verl 0.9.1: dp_actor.yaml, dp_ref.yaml,
# engine/fsdp.yaml against megatron_actor.yaml, megatron_ref.yaml, engine/megatron.yaml), relative to the role; a
# trailing dot is a whole section. Such a key is dropped when the candidate runs the other engine, since verl's
# config dataclasses refuse it at worker start ("McoreActorConfig.__init__() got an unexpected keyword argument
# 'grad_clip'": workers/config/actor.py); tests/verl/test_semantic.py checks this list against verl's configs.
# The optimizer's own fields are OPTIM_SECTIONS' business.
ENGINE_OWN = {
    "fsdp": ("fsdp_config.", "fsdp.", "ulysses_sequence_parallel_size", "strategy", "grad_clip",
             "entropy_checkpointing", "pad_to_length", "use_remove_padding", "forward_micro_batch_size",
             "forward_micro_batch_size_per_gpu"),
    "megatron": ("megatron.", "checkpoint.mbridge_config", "nccl_timeout"),
}


def relative_to_role(key: str) -> str | None:
    """`megatron.x` for `actor_rollout_ref.actor.megatron.x` (and the ref's, the critic's); None elsewhere."""
    bare = key.lstrip("+~")
    return next((bare[len(role):] for role in ROLES if bare.startswith(role)), None)


def speed_only(key: str) -> bool:
    rel = relative_to_role(key)
    return rel is not None and _listed(rel, SPEED_ONLY_ENGINE_KEYS)


def engine_own(key: str) -> str | None:
    """The engine family that alone declares this key of a role (ENGINE_OWN), else None."""
    rel = relative_to_role(key)
    if rel is None:
        return None
    return next((engine for engine, own in ENGINE_OWN.items() if _listed(rel, own)), None)


class Hold(NamedTuple):
    """A knob the search holds at the user's value, with the user's keys that hold it and why."""
    knob: str  # a Candidate field
    values: tuple  # the values the search may use
    keys: tuple[str, ...]
    why: str

    def describe(self) -> str:
        return f"{self.knob} held at {'/'.join(map(str, self.values))}: your job sets {', '.join(self.keys)} ({self.why})"


_SYSTEM_KEYS = frozenset(row.verl_key for row in TABLE if row.kind in ("knob", "derived"))


def holds(passthrough: dict, engine: str, lora_rank: int = 0, rollout_tp: int | None = None) -> tuple[Hold, ...]:
    """What the user's job holds: the engine family (an optimizer key or an engine-section key with no counterpart
    in the other engine, or LoRA, whose two engines build different adapters), and the rollout's tensor
    parallelism (a job that sets the rollout's data or expert parallel size, which verl ties to it)."""
    out = []
    optim = [k for k in passthrough if any(k.startswith(s) for s in OPTIM_SECTIONS)
             and k.split(".optim.", 1)[1].split(".")[0] not in SHARED_OPTIM_FIELDS]
    section = [k for k in passthrough if engine_own(k) == family(engine) and k not in _SYSTEM_KEYS
               and not speed_only(k)]
    why = []
    if optim:
        why.append("optimizer keys the other engine's optimizer config has no exact counterpart for: verl "
                   "workers/config/optimizer.py")
    if section:
        why.append("engine settings that change the training and that the other engine has no key for: verl "
                   "workers/config/engine.py")
    rank_key = f"{M}.lora.rank" if engine == "megatron" else f"{M}.lora_rank"
    lora = ([rank_key] + [k for k in passthrough if k.startswith(f"{M}.lora.")]) if lora_rank > 0 else []
    if lora:
        why.append("LoRA: verl's FSDP engine builds PEFT adapters from model.lora_rank (engine/fsdp/transformer_impl"
                   ".py:162, 368), its Megatron engine Megatron-Bridge adapters from model.lora.* (workers/config/"
                   "megatron_peft.py), with other module names, xavier-initialised A (hf_model.yaml lora."
                   "lora_A_init_method) and another default alpha")
    if why:
        out.append(Hold("actor_engine", ENGINE_FAMILIES[engine], tuple(dict.fromkeys(optim + section + lora)),
                        "; ".join(why) + "; switching engines would change how the model learns"))
    rollout = [k for k in (f"{R}.data_parallel_size", f"{R}.expert_parallel_size")
               if passthrough.get(k) not in (None, 1)]
    if rollout and rollout_tp is not None:
        out.append(Hold("rollout_tp", (rollout_tp,), tuple(rollout),
                        "verl requires rollout expert_parallel_size = tensor_model_parallel_size x "
                        "data_parallel_size (workers/config/rollout.py:294-297); autotune does not search the "
                        "rollout's data or expert parallel size"))
    sum_pi = f"{A}.calculate_sum_pi_squared"
    if passthrough.get(sum_pi) is True:
        out.append(Hold("use_fused_kernels", (False,), (sum_pi,),
                        "verl's fused log-prob does not compute sum(pi^2) and refuses the pair "
                        "(workers/engine/fsdp/transformer_impl.py:1343-1346)"))
    return tuple(out)


def engine_hold(passthrough: dict, engine: str, lora_rank: int = 0) -> Hold | None:
    """The engine hold alone (None: the job may move between FSDP and Megatron)."""
    return next((h for h in holds(passthrough, engine, lora_rank) if h.knob == "actor_engine"), None)
