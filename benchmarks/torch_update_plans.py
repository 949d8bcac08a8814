"""The update-phase plans that benchmarks/profile_torch_update.py measures (no torch here, so that
benchmarks/sim_vs_torch_probe.py can put the sim's predictions next to the measurements anywhere)."""

from __future__ import annotations

from dataclasses import replace

from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

WORKLOAD = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=512,
                    max_response_length=128)
BEST_2026_12_02 = Candidate(actor_engine="fsdp2", rollout_tp=1, gpu_memory_utilization=0.3, use_torch_compile=False,
                            gradient_checkpointing=False, ppo_micro_batch_size_per_gpu=64,
                            log_prob_micro_batch_size_per_gpu=128, ref_log_prob_micro_batch_size_per_gpu=128)


def update_plans() -> list[tuple[str, Workload, Candidate, bool]]:
    """(name, workload, candidate, profiled?) of every plan."""
    return [
        ("best of 2026-12-02 (micro 64)", WORKLOAD, BEST_2026_12_02, True),
        ("micro 16", WORKLOAD, BEST_2026_12_02.with_(ppo_micro_batch_size_per_gpu=16), False),
        ("token budget 32k", WORKLOAD, BEST_2026_12_02.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=32768,
                                                            log_prob_max_token_len_per_gpu=65536), False),
        ("micro 16, remove_padding off", WORKLOAD, BEST_2026_12_02.with_(use_remove_padding=False,
                                                                         ppo_micro_batch_size_per_gpu=16), False),
        ("mini-batch 32 prompts, micro 128", replace(WORKLOAD, train_batch_size=64, ppo_mini_batch_size=32),
         BEST_2026_12_02.with_(ppo_micro_batch_size_per_gpu=128), False),
        ("mini-batch 64 prompts, token budget 64k", replace(WORKLOAD, train_batch_size=64, ppo_mini_batch_size=64),
         BEST_2026_12_02.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=65536,
                               log_prob_max_token_len_per_gpu=65536), False),
        ("micro 64, gradient checkpointing", WORKLOAD, BEST_2026_12_02.with_(gradient_checkpointing=True), False),
        ("micro 64, liger", WORKLOAD, BEST_2026_12_02.with_(use_liger=True), False),
        ("mini-batch 32 prompts, micro 128, liger", replace(WORKLOAD, train_batch_size=64, ppo_mini_batch_size=32),
         BEST_2026_12_02.with_(ppo_micro_batch_size_per_gpu=128, use_liger=True), False),
        ("micro 64, gradient checkpointing, liger", WORKLOAD,
         BEST_2026_12_02.with_(gradient_checkpointing=True, use_liger=True), False),
    ]
