#!/bin/bash
# A second 1-GPU GRPO job, not the one the node profile was learned on: issue 29's held-out job (16 prompts x 8
# samples, 1,024-token responses, dynamic batching 4096 / 8192 tokens per GPU, no KL loss, so no reference pass, vLLM
# share 0.6, vLLM with CUDA graphs: verl's default), the rest assumed (benchmarks/heldout_job_h200.py says what).
# verl 0.9.1, FSDP actor, vLLM async rollout, a random-weight Qwen2 with
# Qwen2.5-1.5B shapes and synthetic GSM8K (gpu/make_tiny_model.py, gpu/make_gsm8k_synth.py).
# Other system knobs as in run_tiny_grpo.sh (verl's defaults, gradient checkpointing), and what this machine
# forces: no flash-attn, so no remove-padding and SDPA attention.
# Run it as is, or tune it: autotune run --backend verl --from run_other_grpo.sh --model qwen2.5-1.5b --gpus 1
set -euo pipefail
MODEL=${MODEL:-/tmp/tiny-qwen2}
DATA=${DATA:-/tmp/data/gsm8k}
CKPT=${CKPT:-/tmp/ckpt}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=16 \
    data.max_prompt_length=256 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.model.use_remove_padding=False \
    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy=fsdp \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8192 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.ref.fsdp_config.param_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.max_model_len=1280 \
    actor_rollout_ref.rollout.agent.num_workers=2 \
    reward.num_workers=2 \
    trainer.critic_warmup=0 \
    'trainer.logger=["console"]' \
    trainer.project_name=tiny_grpo \
    trainer.experiment_name=autotune_h200_other \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.resume_mode=disable \
    trainer.default_local_dir=$CKPT \
    +ray_kwargs.ray_init.include_dashboard=False \
    '+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_USE_FLASHINFER_SAMPLER="0"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.TVM_FFI_DISABLE_TORCH_C_DLPACK="1"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.HF_HUB_OFFLINE="1"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_NO_USAGE_STATS="1"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_NVLS_ENABLE="0"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.TORCH_SYMM_MEM_DISABLE_MULTICAST="1"' \
    '+ray_kwargs.ray_init.runtime_env.env_vars.NVSHMEM_DISABLE_NVLS="1"' \
    "$@"
