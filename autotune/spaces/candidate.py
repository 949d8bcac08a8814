"""One point of the search space: every speed/memory knob autotune sets on a verl GRPO job.

Field names are the Optuna parameter names. `to_verl_overrides` lives in verl/export.py (one
mapping for probes and exports).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, kw_only=True)
class Candidate:
    # actor engine and its parallel layout
    actor_engine: str = "fsdp"  # fsdp | fsdp2 | megatron
    actor_tp: int = 1  # megatron only
    actor_pp: int = 1  # megatron only
    actor_vpp: int = 1  # megatron only; 1 means no virtual pipeline (verl: null)
    actor_cp: int = 1  # megatron only
    actor_ep: int = 1  # megatron, MoE only
    actor_etp: int = 1  # megatron, MoE only (expert tensor parallel)
    ulysses_sp: int = 1  # fsdp only (Ulysses sequence parallel)
    # rollout engine (vLLM)
    rollout_tp: int = 2  # verl default 2 (rollout.yaml:64)
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    # micro-batching
    use_dynamic_bsz: bool = False
    ppo_micro_batch_size_per_gpu: int = 4
    log_prob_micro_batch_size_per_gpu: int = 8  # rollout (old log-prob) pass
    ref_log_prob_micro_batch_size_per_gpu: int = 8
    ppo_max_token_len_per_gpu: int = 16384
    log_prob_max_token_len_per_gpu: int = 16384  # rollout and ref forward-only passes
    # memory savers and kernels
    gradient_checkpointing: bool = True
    activation_offload: bool = False  # fsdp only
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    use_remove_padding: bool = True
    use_torch_compile: bool = True
    use_liger: bool = False  # fsdp only; Liger's RMSNorm, SwiGLU and RoPE kernels (needs liger-kernel)
    # fsdp only; model.use_fused_kernels: log-probs and entropy from the LM head's input, 512 tokens at a time, the
    # logits never whole (verl models/transformers/dense_common.py, utils/experimental/torch_functional.py)
    use_fused_kernels: bool = False
    cuda_device_max_connections: int = 0  # 0: unset; megatron with TP/SP overlap wants 1

    @property
    def is_megatron(self) -> bool:
        return self.actor_engine == "megatron"

    def as_params(self) -> dict:
        # every field is a scalar: no need for asdict's recursive deepcopy (the search calls this ~10^5 times)
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def with_(self, **changes) -> "Candidate":
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_params(cls, params: dict) -> "Candidate":
        """Build from stored Optuna params; unknown keys are an error, missing keys take defaults."""
        known = set(cls.field_names())
        unknown = sorted(set(params) - known)
        if unknown:
            raise KeyError(f"unknown candidate fields {unknown}")
        return cls(**params)


_FIELD_NAMES = tuple(f.name for f in fields(Candidate))
