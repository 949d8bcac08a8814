"""Which verl keys are the user's workload and which are system knobs autotune may change.

One table, a source for each row. Workload knobs change what the model learns and are held at the
user's values (`--tune-workload KNOB` opts one in, and the export says so). System knobs change speed and
memory only; autotune searches them unless the user pins them. Every other key of the user's job (logger,
project names, reward function, data options) is passed through to the export unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

ARO = "actor_rollout_ref"


@dataclass(frozen=True)
class Knob:
    verl_key: str
    field: str | None  # Workload or Candidate field it maps to; None: workload held verbatim (no model use)
    source: str


# Workload: what the model learns (verl docs/perf/perf_tuning.rst: "algorithmic" sizes are global and
# change the optimisation; learning rate, KL, clipping and loss aggregation change the update itself).
WORKLOAD_KNOBS = (
    Knob("data.train_batch_size", "train_batch_size", "legacy_data.yaml:42; prompts per RL step"),
    Knob(f"{ARO}.actor.ppo_mini_batch_size", "ppo_mini_batch_size", "actor.yaml:18; prompts per optimizer step"),
    Knob(f"{ARO}.rollout.n", "rollout_n", "rollout.yaml:127; samples per prompt (GRPO group size)"),
    Knob("data.max_prompt_length", "max_prompt_length", "legacy_data.yaml:35"),
    Knob("data.max_response_length", "max_response_length", "legacy_data.yaml:39"),
    Knob(f"{ARO}.actor.ppo_epochs", "ppo_epochs", "actor.yaml:119"),
    Knob(f"{ARO}.actor.use_kl_loss", "use_kl_loss", "actor.yaml:103; also decides whether a reference model runs"),
    Knob(f"{ARO}.model.lora_rank", "lora_rank", "hf_model.yaml lora_rank"),
    Knob("data.train_files", "train_files", "legacy_data.yaml:11"),
    Knob("data.val_files", "val_files", "legacy_data.yaml:14"),
    Knob(f"{ARO}.model.path", None, "hf_model.yaml:10; the model itself"),
    Knob(f"{ARO}.actor.optim.lr", None, "optim/fsdp.yaml; learning rate"),
    Knob(f"{ARO}.actor.kl_loss_coef", None, "actor.yaml:113"),
    Knob(f"{ARO}.actor.kl_loss_type", None, "actor.yaml:116"),
    Knob(f"{ARO}.actor.clip_ratio", None, "actor.yaml clip_ratio"),
    Knob(f"{ARO}.actor.clip_ratio_low", None, "actor.yaml clip_ratio_low"),
    Knob(f"{ARO}.actor.clip_ratio_high", None, "actor.yaml clip_ratio_high"),
    Knob(f"{ARO}.actor.loss_agg_mode", None, "actor.yaml loss_agg_mode (token-mean, seq-mean-token-sum, ...)"),
    Knob(f"{ARO}.actor.entropy_coeff", None, "actor.yaml entropy_coeff"),
    Knob(f"{ARO}.model.lora_alpha", None, "hf_model.yaml lora_alpha"),
    Knob(f"{ARO}.model.target_modules", "lora_target_modules", "hf_model.yaml target_modules (LoRA)"),
    Knob("algorithm.adv_estimator", None, "ppo_trainer.yaml:78"),
    Knob("algorithm.use_kl_in_reward", "use_kl_in_reward", "ppo_trainer.yaml:102; also decides whether a reference model runs"),
    Knob("algorithm.norm_adv_by_std_in_grpo", None, "ppo_trainer.yaml (Dr.GRPO sets False)"),
    Knob(f"{ARO}.rollout.temperature", None, "rollout.yaml:17; sampling changes the data"),
)

# System: speed and memory only. verl key -> Candidate field (verl_default values where the key is absent).
SYSTEM_KNOBS = (
    Knob(f"{ARO}.actor.strategy", "actor_engine", "dp_actor.yaml:26 (fsdp | fsdp2); model_engine=megatron for Megatron"),
    Knob(f"{ARO}.actor.megatron.tensor_model_parallel_size", "actor_tp", "engine/megatron.yaml:11"),
    Knob(f"{ARO}.actor.megatron.pipeline_model_parallel_size", "actor_pp", "engine/megatron.yaml:20"),
    Knob(f"{ARO}.actor.megatron.virtual_pipeline_model_parallel_size", "actor_vpp", "engine/megatron.yaml:23"),
    Knob(f"{ARO}.actor.megatron.context_parallel_size", "actor_cp", "engine/megatron.yaml:26"),
    Knob(f"{ARO}.actor.megatron.expert_model_parallel_size", "actor_ep", "engine/megatron.yaml:14"),
    Knob(f"{ARO}.actor.megatron.expert_tensor_parallel_size", "actor_etp", "engine/megatron.yaml:17"),
    Knob(f"{ARO}.actor.megatron.param_offload", "param_offload", "engine/megatron.yaml:5"),
    Knob(f"{ARO}.actor.megatron.optimizer_offload", "optimizer_offload", "engine/megatron.yaml:8"),
    Knob(f"{ARO}.ref.megatron.param_offload", "ref_param_offload", "ref/megatron_ref.yaml:39"),
    Knob(f"{ARO}.actor.ulysses_sequence_parallel_size", "ulysses_sp", "dp_actor.yaml:34 (deprecated alias)"),
    Knob(f"{ARO}.actor.fsdp_config.ulysses_sequence_parallel_size", "ulysses_sp", "engine/fsdp.yaml:45"),
    Knob(f"{ARO}.rollout.tensor_model_parallel_size", "rollout_tp", "rollout.yaml:64"),
    Knob(f"{ARO}.rollout.gpu_memory_utilization", "gpu_memory_utilization", "rollout.yaml:46"),
    Knob(f"{ARO}.rollout.max_num_seqs", "max_num_seqs", "rollout.yaml:84"),
    Knob(f"{ARO}.rollout.max_num_batched_tokens", "max_num_batched_tokens", "rollout.yaml:78"),
    Knob(f"{ARO}.rollout.enable_chunked_prefill", "enable_chunked_prefill", "rollout.yaml:87"),
    Knob(f"{ARO}.actor.use_dynamic_bsz", "use_dynamic_bsz", "actor.yaml:28"),
    Knob(f"{ARO}.actor.ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size_per_gpu", "actor.yaml:24"),
    Knob(f"{ARO}.rollout.log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "rollout.yaml:109"),
    Knob(f"{ARO}.ref.log_prob_micro_batch_size_per_gpu", "ref_log_prob_micro_batch_size_per_gpu", "ref.yaml:16"),
    Knob(f"{ARO}.actor.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu", "actor.yaml:33"),
    Knob(f"{ARO}.rollout.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "rollout.yaml:117"),
    Knob(f"{ARO}.ref.log_prob_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "ref.yaml:24"),
    Knob(f"{ARO}.model.enable_gradient_checkpointing", "gradient_checkpointing", "hf_model.yaml:34"),
    Knob(f"{ARO}.model.enable_activation_offload", "activation_offload", "hf_model.yaml:37"),
    Knob(f"{ARO}.actor.fsdp_config.param_offload", "param_offload", "engine/fsdp.yaml:12"),
    Knob(f"{ARO}.actor.fsdp_config.optimizer_offload", "optimizer_offload", "engine/fsdp.yaml:16"),
    Knob(f"{ARO}.ref.fsdp_config.param_offload", "ref_param_offload", "engine/fsdp.yaml:12 (ref)"),
    Knob(f"{ARO}.model.use_remove_padding", "use_remove_padding", "hf_model.yaml:40"),
    Knob(f"{ARO}.actor.fsdp_config.use_torch_compile", "use_torch_compile", "engine/fsdp.yaml:54"),
    Knob(f"{ARO}.actor.use_torch_compile", "use_torch_compile", "actor.yaml:110"),
    Knob(f"{ARO}.model.use_liger", "use_liger",
         "hf_model.yaml:58; Liger RMSNorm/SwiGLU/RoPE kernels (engine/fsdp/transformer_impl.py:307-316)"),
    # derived by autotune from the knobs above; a user value is replaced by the consistent one
    Knob(f"{ARO}.rollout.log_prob_use_dynamic_bsz", None, "rollout.yaml:113 (must equal actor.use_dynamic_bsz)"),
    Knob(f"{ARO}.ref.log_prob_use_dynamic_bsz", None, "ref.yaml:20"),
    Knob("model_engine", None, "ppo_trainer.yaml defaults: dp | megatron"),
    Knob("ray_kwargs.ray_init.runtime_env.env_vars.CUDA_DEVICE_MAX_CONNECTIONS", "cuda_device_max_connections",
         "Megatron overlap; verl sets 1 itself (constants_ppo.py:122-124)"),
)

# Keys that decide the job's shape; read from the user's job, not searched.
JOB_KEYS = ("trainer.n_gpus_per_node", "trainer.nnodes")

WORKLOAD_BY_KEY = {k.verl_key: k for k in WORKLOAD_KNOBS}
SYSTEM_BY_KEY = {k.verl_key: k for k in SYSTEM_KNOBS}
# opt-in names for --tune-workload: the Workload fields autotune can search
TUNABLE = {"ppo_mini_batch_size": f"{ARO}.actor.ppo_mini_batch_size"}


def kind_of(verl_key: str) -> str:
    """workload | system | job | passthrough, for a dotted key (a leading + or ~ is ignored)."""
    key = verl_key.lstrip("+~")
    if key in WORKLOAD_BY_KEY:
        return "workload"
    if key in SYSTEM_BY_KEY:
        return "system"
    if key in JOB_KEYS:
        return "job"
    return "passthrough"
