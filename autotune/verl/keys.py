"""The one table of verl 0.9.1 keys autotune reads and writes: import (`--from`) and export (best.yaml, probes)
are both generated from it (autotune/verl/export.py, autotune/verl/job_import.py).

Each row: the verl key; the Workload or Candidate field it maps to (None: the user's value passes through
verbatim); its kind (workload: what the model learns, held at the user's value; knob: speed/memory,
searched unless pinned; derived: set by autotune from other fields so that verl sees a consistent job;
job: the job's shape); the engines it applies to; when it applies (a function of the job); the
conversion each way; and its source in the verl 0.9.1 wheel (file:line, checked by
tests/verl/test_keys.py against the installed wheel). Every other key of the user's job passes through
unchanged, except keys of the engine the candidate does not use (autotune/verl/engines.py ENGINE_OWN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from autotune.spaces.candidate import Candidate
from autotune.verl import roles
from autotune.verl.pipeline_split import derived_split
from autotune.workload import Workload

ARO = "actor_rollout_ref"
A, R, REF, M = f"{ARO}.actor", f"{ARO}.rollout", f"{ARO}.ref", f"{ARO}.model"
MEG, OTC = f"{A}.megatron", f"{A}.megatron.override_transformer_config"
# a dict verl hands to megatron-core's OptimizerConfig key by key: its keys are megatron-core's, not in verl's files
OVERRIDE_OPTIMIZER = "override_optimizer_config"
FSDP_ENGINES = frozenset({"fsdp", "fsdp2"})
MEGATRON = frozenset({"megatron"})
ALL_ENGINES = FSDP_ENGINES | MEGATRON
# The verl config lives in the wheel under this folder; `source` paths are relative to the package root.
CONFIG = "trainer/config"


class Job(NamedTuple):
    """What a row's `when` and `to_verl` see."""
    workload: Workload
    candidate: Candidate
    model_path: str  # model.path exactly as the user gave it
    gpus_per_node: int
    nodes: int
    num_layers: int = 0  # the model's, for the pipeline split (0: unknown, no split written)


def _always(job: Job) -> bool:
    return True


@dataclass(frozen=True)
class Key:
    verl_key: str
    field: str | None
    kind: str  # workload | knob | derived | job
    source: str  # verl 0.9.1 wheel path:line (relative to site-packages/verl)
    engines: frozenset = ALL_ENGINES
    when: Callable[[Job], bool] = _always
    to_verl: Callable[[Job], Any] | None = None  # None: getattr(field) on the workload or candidate
    from_verl: Callable[[Any, dict], Any] | None = None  # (value, other imported values) -> field value
    user_wins: bool = False  # export: the user's own value (passthrough) is kept when present
    note: str = ""
    # when the field is searched (defaults to `when`): the ref micro-batch key is written under LoRA, but from
    # the actor's log-prob micro-batch, so its own knob is not searched there
    field_when: Callable[[Job], bool] | None = None

    def applies(self, job: Job) -> bool:
        return job.candidate.actor_engine in self.engines and self.when(job)

    def value(self, job: Job):
        if self.to_verl is not None:
            return self.to_verl(job)
        owner = job.workload if self.field in WORKLOAD_FIELDS else job.candidate
        return getattr(owner, self.field)


WORKLOAD_FIELDS = frozenset(Workload.field_names())


def _static(job: Job) -> bool:
    return not job.candidate.use_dynamic_bsz


def _dynamic(job: Job) -> bool:
    return job.candidate.use_dynamic_bsz


def _ref(job: Job) -> bool:
    return roles.need_reference_policy(job.workload)


def _separate_ref(job: Job) -> bool:
    return roles.separate_reference(job.workload)


def _cpu_optimizer(job: Job) -> bool:
    w = job.workload
    return w.megatron_optimizer_cpu_offload or w.megatron_optimizer_offload_fraction != 0.0


def _lora(job: Job) -> bool:
    return job.workload.lora_rank > 0


def _vpp(value, _values) -> int:
    return 1 if value is None else value  # verl's null: no virtual pipeline (engine/megatron.yaml:23)


def _etp(value, values) -> int:
    # verl's null hands None to megatron-core, which then uses the tensor-parallel size for experts
    # (megatron/core/model_parallel_config.py: expert_tensor_parallel_size defaults to TP)
    if value is None:
        return values.get(f"{MEG}.tensor_model_parallel_size") or 1
    return value


# Megatron's fused projections and the HF projections each stands for (Megatron-Bridge's LoRA targets
# linear_qkv / linear_proj / linear_fc1 / linear_fc2: hf_model.yaml lora.target_modules), so that a Megatron LoRA
# job is priced by the same adapter model (model/memory.py lora_params)
_MEGATRON_LORA = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                  "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}


def _hf_lora_targets(value) -> str | list:
    names = [value] if isinstance(value, str) else list(value or ())
    if sorted(names) == sorted(_MEGATRON_LORA):
        return "all-linear"
    return [hf for name in names for hf in _MEGATRON_LORA.get(name, (name,))]


def _megatron_lora_targets(value) -> list:
    if value == "all-linear":
        return list(_MEGATRON_LORA)
    names = [value] if isinstance(value, str) else list(value)
    fused = [m for m, hf in _MEGATRON_LORA.items() if any(n in hf for n in names)]
    return fused + [n for n in names if not any(n in hf for hf in _MEGATRON_LORA.values())]


def _recompute(value, _values) -> bool:
    return value is not None  # "full" or "selective": recompute on; null (verl's default): off


def _ref_micro(job: Job) -> int:
    # with LoRA the reference pass runs on the actor (ray_trainer.py:356-360) with the actor's log-prob micro-batch;
    # validate_config still wants the ref key set (utils/config.py:168-174)
    c = job.candidate
    return c.ref_log_prob_micro_batch_size_per_gpu if _separate_ref(job) else c.log_prob_micro_batch_size_per_gpu


def _uneven(job: Job) -> bool:
    return job.num_layers > 0 and derived_split(job.num_layers, job.candidate.actor_pp) is not None \
        and job.candidate.actor_vpp == 1


def _recompute_value(on, off):
    return lambda job: on if job.candidate.gradient_checkpointing else off


TABLE: tuple[Key, ...] = (
    # ---- workload: what the model learns (held fixed; docs/perf/perf_tuning.rst) ----
    Key("algorithm.adv_estimator", None, "workload", f"{CONFIG}/ppo_trainer.yaml:78", to_verl=lambda j: "grpo",
        user_wins=True),
    Key("data.train_files", "train_files", "workload", f"{CONFIG}/data/legacy_data.yaml:11"),
    Key("data.val_files", "val_files", "workload", f"{CONFIG}/data/legacy_data.yaml:14"),
    Key("data.train_batch_size", "train_batch_size", "workload", f"{CONFIG}/data/legacy_data.yaml:42"),
    Key("data.max_prompt_length", "max_prompt_length", "workload", f"{CONFIG}/data/legacy_data.yaml:35"),
    Key("data.max_response_length", "max_response_length", "workload", f"{CONFIG}/data/legacy_data.yaml:39"),
    Key(f"{M}.path", None, "workload", f"{CONFIG}/model/hf_model.yaml:10", to_verl=lambda j: j.model_path,
        user_wins=True),
    Key(f"{A}.ppo_mini_batch_size", "ppo_mini_batch_size", "workload", f"{CONFIG}/actor/actor.yaml:18"),
    Key(f"{A}.ppo_epochs", "ppo_epochs", "workload", f"{CONFIG}/actor/actor.yaml:119"),
    Key(f"{A}.use_kl_loss", "use_kl_loss", "workload", f"{CONFIG}/actor/actor.yaml:103",
        note="with use_kl_in_reward, decides the reference (roles.py)"),
    Key("algorithm.use_kl_in_reward", "use_kl_in_reward", "workload", f"{CONFIG}/ppo_trainer.yaml:102"),
    Key(f"{R}.name", None, "workload", f"{CONFIG}/rollout/rollout.yaml:4", to_verl=lambda j: "vllm", user_wins=True),
    Key(f"{R}.n", "rollout_n", "workload", f"{CONFIG}/rollout/rollout.yaml:127"),
    # LoRA: the FSDP engine reads model.lora_rank / target_modules (PEFT), the Megatron engine model.lora.*
    # (Megatron-Bridge; verl/engines.py holds a LoRA job on its engine family)
    Key(f"{M}.lora_rank", "lora_rank", "workload", f"{CONFIG}/model/hf_model.yaml:43", engines=FSDP_ENGINES,
        when=_lora),
    Key(f"{M}.target_modules", "lora_target_modules", "workload", f"{CONFIG}/model/hf_model.yaml:49",
        engines=FSDP_ENGINES, when=_lora),
    Key(f"{M}.lora.rank", "lora_rank", "workload", f"{CONFIG}/model/hf_model.yaml:109", engines=MEGATRON,
        when=_lora),
    Key(f"{M}.lora.target_modules", "lora_target_modules", "workload", f"{CONFIG}/model/hf_model.yaml:131",
        engines=MEGATRON, when=_lora, to_verl=lambda j: _megatron_lora_targets(j.workload.lora_target_modules),
        from_verl=lambda v, _: _hf_lora_targets(v)),
    # Megatron's CPU optimizer: megatron-core OptimizerConfig fields that verl copies from override_optimizer_config
    # (utils/megatron/optimizer.py:210-213); written back as the user set it; the memory model keeps that share of
    # the optimizer off the GPU
    Key(f"{A}.optim.{OVERRIDE_OPTIMIZER}.optimizer_cpu_offload", "megatron_optimizer_cpu_offload", "workload",
        "utils/megatron/optimizer.py:210", engines=MEGATRON, when=_cpu_optimizer),
    Key(f"{A}.optim.{OVERRIDE_OPTIMIZER}.optimizer_offload_fraction", "megatron_optimizer_offload_fraction",
        "workload", "utils/megatron/optimizer.py:210", engines=MEGATRON, when=_cpu_optimizer),
    # held verbatim (no model use): passed through with the user's value
    Key(f"{A}.optim.lr", None, "workload", f"{CONFIG}/actor/actor.yaml:151"),
    Key(f"{A}.kl_loss_coef", None, "workload", f"{CONFIG}/actor/actor.yaml:113"),
    Key(f"{A}.kl_loss_type", None, "workload", f"{CONFIG}/actor/actor.yaml:116"),
    Key(f"{A}.clip_ratio", None, "workload", f"{CONFIG}/actor/actor.yaml:36"),
    Key(f"{A}.clip_ratio_low", None, "workload", f"{CONFIG}/actor/actor.yaml:39"),
    Key(f"{A}.clip_ratio_high", None, "workload", f"{CONFIG}/actor/actor.yaml:42"),
    Key(f"{A}.loss_agg_mode", None, "workload", f"{CONFIG}/actor/actor.yaml:88"),
    Key(f"{A}.entropy_coeff", None, "workload", f"{CONFIG}/actor/actor.yaml:93"),
    Key(f"{M}.lora_alpha", None, "workload", f"{CONFIG}/model/hf_model.yaml:46"),
    Key("algorithm.norm_adv_by_std_in_grpo", None, "workload", f"{CONFIG}/ppo_trainer.yaml:81"),
    Key(f"{R}.temperature", None, "workload", f"{CONFIG}/rollout/rollout.yaml:17"),
    # ---- job shape ----
    Key("trainer.n_gpus_per_node", None, "job", f"{CONFIG}/ppo_trainer.yaml:171",
        to_verl=lambda j: j.gpus_per_node),
    Key("trainer.nnodes", None, "job", f"{CONFIG}/ppo_trainer.yaml:168", to_verl=lambda j: j.nodes),
    # ---- rollout (vLLM) knobs ----
    Key(f"{R}.tensor_model_parallel_size", "rollout_tp", "knob", f"{CONFIG}/rollout/rollout.yaml:64"),
    Key(f"{R}.gpu_memory_utilization", "gpu_memory_utilization", "knob", f"{CONFIG}/rollout/rollout.yaml:46",
        to_verl=lambda j: round(j.candidate.gpu_memory_utilization, 4)),
    Key(f"{R}.max_num_seqs", "max_num_seqs", "knob", f"{CONFIG}/rollout/rollout.yaml:84"),
    Key(f"{R}.max_num_batched_tokens", "max_num_batched_tokens", "knob", f"{CONFIG}/rollout/rollout.yaml:78"),
    Key(f"{R}.enable_chunked_prefill", "enable_chunked_prefill", "knob", f"{CONFIG}/rollout/rollout.yaml:87"),
    # null makes verl use the model's max_position_embeddings (workers/rollout/vllm_rollout/vllm_async_server.py:
    # 1101-1119): vLLM then needs KV room for one full-context sequence and, chunked prefill off, verl raises
    # max_num_batched_tokens to it. autotune sizes both for prompt + response, so it says so.
    Key(f"{R}.max_model_len", "max_model_len", "derived", "workers/rollout/vllm_rollout/vllm_async_server.py:1104",
        to_verl=lambda j: j.workload.rollout_max_model_len),
    # ---- batching knobs ----
    Key(f"{A}.use_dynamic_bsz", "use_dynamic_bsz", "knob", f"{CONFIG}/actor/actor.yaml:28"),
    Key(f"{R}.log_prob_use_dynamic_bsz", None, "derived", "workers/engine_workers.py:616",
        to_verl=lambda j: j.candidate.use_dynamic_bsz, note="must equal actor.use_dynamic_bsz (bare assert)"),
    Key(f"{REF}.log_prob_use_dynamic_bsz", None, "derived", f"{CONFIG}/ref/ref.yaml:20", when=_ref,
        to_verl=lambda j: j.candidate.use_dynamic_bsz),
    Key(f"{A}.ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu", "knob", f"{CONFIG}/actor/actor.yaml:24",
        when=_static),
    Key(f"{R}.log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "knob",
        f"{CONFIG}/rollout/rollout.yaml:109", when=_static),
    Key(f"{REF}.log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu", "knob",
        f"{CONFIG}/ref/ref.yaml:16", when=lambda j: _static(j) and _ref(j), to_verl=_ref_micro,
        field_when=lambda j: _static(j) and _separate_ref(j)),
    Key(f"{A}.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu", "knob", f"{CONFIG}/actor/actor.yaml:33",
        when=_dynamic),
    Key(f"{R}.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "knob",
        f"{CONFIG}/rollout/rollout.yaml:117", when=_dynamic),
    Key(f"{REF}.log_prob_max_token_len_per_gpu", None, "derived", f"{CONFIG}/ref/ref.yaml:24",
        when=lambda j: _dynamic(j) and _ref(j), to_verl=lambda j: j.candidate.log_prob_max_token_len_per_gpu),
    Key(f"{M}.use_remove_padding", "use_remove_padding", "knob", f"{CONFIG}/model/hf_model.yaml:40"),
    # ---- FSDP engine ----
    Key(f"{A}.strategy", "actor_engine", "knob", f"{CONFIG}/actor/dp_actor.yaml:26", engines=FSDP_ENGINES),
    Key(f"{A}.fsdp_config.param_offload", "param_offload", "knob", f"{CONFIG}/engine/fsdp.yaml:12",
        engines=FSDP_ENGINES),
    Key(f"{A}.fsdp_config.optimizer_offload", "optimizer_offload", "knob", f"{CONFIG}/engine/fsdp.yaml:16",
        engines=FSDP_ENGINES),
    Key(f"{REF}.fsdp_config.param_offload", "ref_param_offload", "knob", f"{CONFIG}/engine/fsdp.yaml:12",
        engines=FSDP_ENGINES, when=_separate_ref),
    Key(f"{A}.fsdp_config.ulysses_sequence_parallel_size", "ulysses_sp", "knob", f"{CONFIG}/engine/fsdp.yaml:45",
        engines=FSDP_ENGINES),
    # the deprecated alias feeds ref.ulysses_sequence_parallel_size through oc.select (dp_ref.yaml:39)
    Key(f"{A}.ulysses_sequence_parallel_size", "ulysses_sp", "knob", f"{CONFIG}/actor/dp_actor.yaml:34",
        engines=FSDP_ENGINES),
    Key(f"{REF}.ulysses_sequence_parallel_size", None, "derived", f"{CONFIG}/ref/dp_ref.yaml:39",
        engines=FSDP_ENGINES, when=_separate_ref, to_verl=lambda j: j.candidate.ulysses_sp),
    # the reference's strategy follows the actor's (ref/ref.yaml:5); a job that set it gets the candidate's
    Key(f"{REF}.strategy", None, "derived", f"{CONFIG}/ref/ref.yaml:5", engines=FSDP_ENGINES,
        to_verl=lambda j: j.candidate.actor_engine),
    # the FSDP engine reads fsdp_config.use_torch_compile (engine/fsdp/transformer_impl.py:183-187);
    # actor.use_torch_compile feeds ref.use_torch_compile (ref.yaml:9). The Megatron engine reads neither.
    Key(f"{A}.fsdp_config.use_torch_compile", "use_torch_compile", "knob", f"{CONFIG}/engine/fsdp.yaml:54",
        engines=FSDP_ENGINES),
    Key(f"{A}.use_torch_compile", "use_torch_compile", "knob", f"{CONFIG}/actor/actor.yaml:110",
        engines=FSDP_ENGINES),
    Key(f"{M}.enable_gradient_checkpointing", "gradient_checkpointing", "knob", f"{CONFIG}/model/hf_model.yaml:34",
        engines=FSDP_ENGINES),
    Key(f"{M}.enable_activation_offload", "activation_offload", "knob", f"{CONFIG}/model/hf_model.yaml:37",
        engines=FSDP_ENGINES),
    Key(f"{M}.use_liger", "use_liger", "knob", f"{CONFIG}/model/hf_model.yaml:58", engines=FSDP_ENGINES,
        note="read by the FSDP engine only (engine/fsdp/transformer_impl.py:307-316)"),
    # actor.use_fused_kernels follows it (actor/actor.yaml:167, oc.select); the reference runs the same model config.
    # Searched for the FSDP engines only: the Megatron engine's fused path takes impl_backend triton alone
    # (model/hf_model.yaml:64-67) and was never measured here; a Megatron job's own value passes through.
    Key(f"{M}.use_fused_kernels", "use_fused_kernels", "knob", f"{CONFIG}/model/hf_model.yaml:61",
        engines=FSDP_ENGINES,
        note="FSDP engine: engine/fsdp/transformer_impl.py:323-329 (monkey patch), 1362 (log-probs from the model)"),
    # ---- Megatron engine ----
    Key("model_engine", None, "derived", f"{CONFIG}/ppo_trainer.yaml:9", engines=MEGATRON,
        note="a Hydra group choice, written as `model_engine=megatron` / `override model_engine`"),
    Key(f"{MEG}.tensor_model_parallel_size", "actor_tp", "knob", f"{CONFIG}/engine/megatron.yaml:11", engines=MEGATRON),
    Key(f"{MEG}.pipeline_model_parallel_size", "actor_pp", "knob", f"{CONFIG}/engine/megatron.yaml:20",
        engines=MEGATRON),
    Key(f"{MEG}.virtual_pipeline_model_parallel_size", "actor_vpp", "knob", f"{CONFIG}/engine/megatron.yaml:23",
        engines=MEGATRON, to_verl=lambda j: j.candidate.actor_vpp if j.candidate.actor_vpp > 1 else None,
        from_verl=_vpp),
    Key(f"{MEG}.context_parallel_size", "actor_cp", "knob", f"{CONFIG}/engine/megatron.yaml:26", engines=MEGATRON),
    Key(f"{MEG}.expert_model_parallel_size", "actor_ep", "knob", f"{CONFIG}/engine/megatron.yaml:14",
        engines=MEGATRON),
    Key(f"{MEG}.expert_tensor_parallel_size", "actor_etp", "knob", f"{CONFIG}/engine/megatron.yaml:17",
        engines=MEGATRON, from_verl=_etp),
    Key(f"{MEG}.param_offload", "param_offload", "knob", f"{CONFIG}/engine/megatron.yaml:5", engines=MEGATRON),
    Key(f"{MEG}.optimizer_offload", "optimizer_offload", "knob", f"{CONFIG}/engine/megatron.yaml:8",
        engines=MEGATRON),
    Key(f"{REF}.megatron.param_offload", "ref_param_offload", "knob", f"{CONFIG}/ref/megatron_ref.yaml:39",
        engines=MEGATRON, when=_separate_ref),
    # the reference runs in the actor's processes, whose Megatron parallel state the first engine initialises and
    # the second reuses (engine/megatron/transformer_impl.py:244-256 `if mpu.is_initialized(): return`): its layout
    # is the actor's. verl's default follows the actor's keys; a job that set the ref's own gets the candidate's.
    *(Key(f"{REF}.megatron.{leaf}", None, "derived", f"{CONFIG}/ref/megatron_ref.yaml:{line}", engines=MEGATRON,
          when=_separate_ref, to_verl=fn)
      for leaf, line, fn in (
          ("tensor_model_parallel_size", 29, lambda j: j.candidate.actor_tp),
          ("pipeline_model_parallel_size", 30, lambda j: j.candidate.actor_pp),
          ("virtual_pipeline_model_parallel_size", 31, lambda j: j.candidate.actor_vpp if j.candidate.actor_vpp > 1
           else None),
          ("context_parallel_size", 32, lambda j: j.candidate.actor_cp),
          ("expert_model_parallel_size", 37, lambda j: j.candidate.actor_ep),
          ("expert_tensor_parallel_size", 38, lambda j: j.candidate.actor_etp))),
    # Megatron's checkpointing switch (hf_model.enable_gradient_checkpointing is FSDP-only); a user's own
    # recompute settings are kept while checkpointing stays on (export.py)
    Key(f"{OTC}.recompute_granularity", "gradient_checkpointing", "knob", f"{CONFIG}/engine/megatron.yaml:75",
        engines=MEGATRON, to_verl=_recompute_value("full", None), from_verl=_recompute),
    Key(f"{OTC}.recompute_method", None, "derived", f"{CONFIG}/engine/megatron.yaml:84", engines=MEGATRON,
        to_verl=_recompute_value("uniform", None)),
    Key(f"{OTC}.recompute_num_layers", None, "derived", f"{CONFIG}/engine/megatron.yaml:87", engines=MEGATRON,
        to_verl=_recompute_value(1, None)),
    # layers per pipeline stage where they do not divide by PP (verl/pipeline_split.py); a user's own valid split is
    # kept instead (export.py). Added with "+": Megatron's TransformerConfig fields, not verl's schema.
    Key(f"{OTC}.num_layers_in_first_pipeline_stage", None, "derived", "utils/megatron/router_replay_utils.py:84",
        engines=MEGATRON, when=_uneven, to_verl=lambda j: derived_split(j.num_layers, j.candidate.actor_pp).first),
    Key(f"{OTC}.num_layers_in_last_pipeline_stage", None, "derived", "utils/megatron/router_replay_utils.py:84",
        engines=MEGATRON, when=_uneven, to_verl=lambda j: derived_split(j.num_layers, j.candidate.actor_pp).last),
    # an uneven split cannot be mixed with these (router_replay_utils.py:85-88): off where autotune's split applies
    *(Key(f"{OTC}.account_for_{part}_in_pipeline_split", None, "derived", "utils/megatron/router_replay_utils.py:85",
          engines=MEGATRON, when=_uneven, to_verl=lambda j: False) for part in ("embedding", "loss")),
    # not in verl's schema: added with "+" (verl sets 1 itself on Ampere/Hopper: trainer/constants_ppo.py:122-124)
    Key("ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS", "cuda_device_max_connections",
        "knob", "trainer/constants_ppo.py:122", engines=MEGATRON,
        when=lambda j: bool(j.candidate.cuda_device_max_connections),
        to_verl=lambda j: str(j.candidate.cuda_device_max_connections), from_verl=lambda v, _: int(v)),
)

# Keys not in verl's schema, added on purpose ("+" on the command line)
ADDED_KEYS = ("ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS",)
# verl's deprecated global micro-batch keys: per GPU = global / (GPUs / ulysses_sequence_parallel_size), as the
# workers that read them divided (verl <= 0.8 workers/fsdp_workers.py: `ppo_micro_batch_size //=
# (device_mesh.size() // ulysses_sequence_parallel_size)`); 0.9.1 only checks global * sp >= GPUs
# (workers/config/actor.py:238-241) and its workers need the per-GPU key (engine_workers.py:631-633), which the
# export writes.
DEPRECATED_GLOBAL_MICRO = {
    f"{A}.ppo_micro_batch_size": "ppo_micro_batch_size_per_gpu",
    f"{R}.log_prob_micro_batch_size": "log_prob_micro_batch_size_per_gpu",
    f"{REF}.log_prob_micro_batch_size": "ref_log_prob_micro_batch_size_per_gpu",
}

# Keys older verl scripts set that verl 0.9.1's config does not have: Hydra refuses them ("Could not override"),
# so `--from` drops them and says so.
NOT_IN_VERL = {
    f"{MEG}.grad_offload": "removed in verl 0.9.1; param_offload also releases the gradient buffers "
                           f"({CONFIG}/engine/megatron.yaml:4-5)",
    f"{REF}.megatron.grad_offload": "removed in verl 0.9.1",
    f"{A}.model_engine": f"not a verl key; the engine is the top-level group model_engine ({CONFIG}/ppo_trainer.yaml:9)",
}

BY_KEY = {k.verl_key: k for k in TABLE}
WORKLOAD_BY_KEY = {k.verl_key: k for k in TABLE if k.kind == "workload"}
SYSTEM_BY_KEY = {k.verl_key: k for k in TABLE if k.kind in ("knob", "derived")}
JOB_KEYS = tuple(k.verl_key for k in TABLE if k.kind == "job")
# opt-in names for --tune-workload: the Workload fields autotune can search
TUNABLE = {"ppo_mini_batch_size": f"{A}.ppo_mini_batch_size"}


def kind_of(verl_key: str) -> str:
    """workload | system | job | passthrough, for a dotted key (a leading + or ~ is ignored)."""
    key = verl_key.lstrip("+~")
    row = BY_KEY.get(key)
    if row is None:
        return "passthrough"
    return {"knob": "system", "derived": "system"}.get(row.kind, row.kind)


def active_knobs_for(workload: Workload, engine: str, dynamic: bool | None = None) -> frozenset[str]:
    """Candidate fields some row of this engine would export from for this workload (the search space's active
    knobs come from the same rows): e.g. no ref.* knob without a separate reference, no use_torch_compile
    under Megatron. `dynamic` None: either batching mode."""
    out = set()
    for mode in ((False, True) if dynamic is None else (dynamic,)):
        job = Job(workload, Candidate(actor_engine=engine, use_dynamic_bsz=mode, cuda_device_max_connections=1),
                  "", 1, 1)
        out |= {k.field for k in TABLE if k.field and k.field not in WORKLOAD_FIELDS
                and job.candidate.actor_engine in k.engines and (k.field_when or k.when)(job)}
    return frozenset(out)


# Boolean knobs whose True needs an optional package where verl runs: verl imports it once the knob is on
# (workers/engine/fsdp/transformer_impl.py:310 for liger_kernel). Probes hold such a knob off where the package is
# missing (backends/select.py); the export names the package (export.export_header).
KNOB_PACKAGES = {"use_liger": "liger_kernel"}
