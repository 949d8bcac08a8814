"""How verl starts its vLLM rollout engine, where that differs from vLLM's own defaults."""

from __future__ import annotations

from autotune.spaces.candidate import Candidate


def effective_batched_tokens(cand: Candidate, max_model_len: int = 0) -> int:
    """vLLM's max_num_batched_tokens as verl starts it: with chunked prefill off, verl raises it to max_model_len
    (verl/workers/rollout/vllm_rollout/vllm_async_server.py:1113-1119)."""
    if cand.enable_chunked_prefill:
        return cand.max_num_batched_tokens
    return max(cand.max_num_batched_tokens, max_model_len)


ENFORCE_EAGER_KEY = "actor_rollout_ref.rollout.enforce_eager"


def vllm_eager(passthrough: dict) -> bool:
    """Whether the user's job runs vLLM without CUDA graphs: its rollout.enforce_eager (verl's default False,
    trainer/config/rollout/rollout.yaml:52), kept as the job sets it: CUDA graphs' memory lies outside
    gpu_memory_utilization and is not modelled, so autotune does not turn them on for the job."""
    return str(passthrough.get(ENFORCE_EAGER_KEY)).lower() == "true"
