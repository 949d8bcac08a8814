"""How verl starts its vLLM rollout engine, where that differs from vLLM's own defaults."""

from __future__ import annotations

from autotune.spaces.candidate import Candidate


def effective_batched_tokens(cand: Candidate, max_model_len: int = 0) -> int:
    """vLLM's max_num_batched_tokens as verl starts it: with chunked prefill off, verl raises it to max_model_len
    (verl/workers/rollout/vllm_rollout/vllm_async_server.py:1113-1119)."""
    if cand.enable_chunked_prefill:
        return cand.max_num_batched_tokens
    return max(cand.max_num_batched_tokens, max_model_len)
