"""Equivalent configurations are one configuration: the key under which a candidate is "already tried".

A knob that does not reach verl for this candidate (Megatron sizes under FSDP and the reverse, token budgets
with dynamic batching off, static micro-batch sizes with it on, the reference's knobs without a KL loss)
takes its neutral value, and float knobs are rounded to the search space's step, so a re-probe of the same
verl configuration never looks new (issue 19). space.SearchSpace.active_knobs decides what applies.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

from autotune.spaces.candidate import Candidate
from autotune.spaces.space import DYNAMIC_ONLY, FSDP_ONLY, MEGATRON_ONLY, REF_ONLY, STATIC_ONLY

_NEUTRAL = Candidate().as_params()
_FLOAT_DIGITS = 6  # space.py draws floats on a 0.05 grid; TPE and enqueue round-trip them with float noise


def canonical_params(params: Mapping, ref_knobs: bool) -> dict:
    """The candidate's params with every knob that does not reach verl at its neutral value (`ref_knobs`: the job
    runs a reference model of its own, autotune/verl/roles.py separate_reference)."""
    out = {**_NEUTRAL, **params}
    megatron = out["actor_engine"] == "megatron"
    inactive = list(FSDP_ONLY if megatron else MEGATRON_ONLY)
    inactive += DYNAMIC_ONLY if not out["use_dynamic_bsz"] else STATIC_ONLY
    if not ref_knobs:
        inactive += REF_ONLY
    for name in inactive:
        out[name] = _NEUTRAL[name]
    if not megatron:
        out["cuda_device_max_connections"] = 0  # space.suggest: FSDP runs leave it unset
    return {k: round(v, _FLOAT_DIGITS) if isinstance(v, float) else v for k, v in out.items()}


def tried_keys(trials, ref_knobs: bool) -> set:
    """The configuration keys of every trial that holds a candidate (measured, rejected, running or failed)."""
    return {config_key(t.user_attrs["candidate"], ref_knobs, t.user_attrs.get("workload_tuned"))
            for t in trials if "candidate" in t.user_attrs}


def config_key(params: Mapping, ref_knobs: bool, workload_tuned: Mapping | None = None) -> tuple:
    """Hashable identity of the verl configuration a trial runs."""
    key = tuple(sorted(canonical_params(params, ref_knobs).items()))
    return key + tuple(sorted((workload_tuned or {}).items()))


# The two parts of a configuration that the step's phases depend on (search/learned.py learns each part's
# correction from the probes that share it): the actor layout (training phases) and vLLM's batching
# setting (generation; gpu_memory_utilization and the token budget only fine-tune it).
LAYOUT = ("actor_engine", "actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp", "ulysses_sp")
ROLLOUT_SETTING = ("rollout_tp", "max_num_seqs", "enable_chunked_prefill")
ROLLOUT_FINE_TUNE = ("gpu_memory_utilization", "max_num_batched_tokens")


def near_twins(a: Mapping, b: Mapping) -> bool:
    """Two configurations that differ in nothing but vLLM's fine-tuning knobs: a probe of one says almost all a
    probe of the other would (issue 34: the warm start spent its third pick on such a twin of its second)."""
    return all(a[k] == b[k] for k in a if k not in ROLLOUT_FINE_TUNE)
layout_key = operator.itemgetter(*LAYOUT)
rollout_key = operator.itemgetter(*ROLLOUT_SETTING)
