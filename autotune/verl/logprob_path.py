"""Which log-prob path verl's FSDP engine takes on the node: one vectorised cross-entropy, or a Python loop per token.

verl 0.9.1 `utils/torch_functional.py` computes every log-prob pass's per-token log-probabilities (old_log_prob,
ref and the update's forward) with `logprobs_from_logits`. It uses flash-attn's Triton cross-entropy when
`flash_attn.ops.triton.cross_entropy` imports and `VERL_DISABLE_FLASH_ATTN_CE` is not "1" (lines 34-39, 95); else
`logprobs_from_logits_v2`, which loops in Python over the rows of the (tokens, vocab) logits, one log_softmax per
token (lines 180-206). The FSDP engine calls it from both padding paths (workers/engine/fsdp/transformer_impl.py:1428,
1522) unless `model.use_fused_kernels` replaces the LM head's logits by a fused log-prob (:1362). On one H200 the
loop costs 32 us per token forward and 89 us forward + backward on bf16 logits by itself
(benchmarks/results/h200-2026-12-06-fused/logprob_loop.txt); in verl's worker it is the time the model prices
(autotune/model/calibration.py SystemConstants.logprob_loop_*).
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

DISABLE_FLASH_CE_ENV = "VERL_DISABLE_FLASH_ATTN_CE"


def flash_ce_installed() -> bool:
    """Whether flash-attn's Triton cross-entropy module is installed here, read from the files (importing
    flash_attn loads torch and its CUDA library: too slow and too fragile for a check)."""
    spec = find_spec("flash_attn")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(folder) / "ops" / "triton" / "cross_entropy.py").is_file()
               for folder in spec.submodule_search_locations)


def logprob_loop_reason(backend: str, job_env: dict, *, probes_here: bool) -> str | None:
    """Why verl computes log-probs with its per-token loop where this study's probes run, or None where it does not.

    The job's own `VERL_DISABLE_FLASH_ATTN_CE=1` forces the loop anywhere. Otherwise only a verl backend whose
    probes run on this machine can look: the torch backend computes log-probs its own (vectorised) way, and the
    sim, or probes on other machines, assume verl's documented install (flash-attn present)."""
    env = {**os.environ, **{str(k): str(v) for k, v in (job_env or {}).items()}}
    if env.get(DISABLE_FLASH_CE_ENV, "0") == "1" and backend in ("verl", "sim"):
        return f"{DISABLE_FLASH_CE_ENV}=1"
    if backend == "verl" and probes_here and not flash_ce_installed():
        return "flash-attn's Triton cross-entropy is not installed here"
    return None


def takes_logprob_loop(backend: str, job_env: dict, *, probes_here: bool) -> bool:
    return logprob_loop_reason(backend, job_env, probes_here=probes_here) is not None
