"""Spend no probe on a candidate whose fate is already known: memory pre-screen and OOM boundaries.

Memory pre-screen: the model's predicted peak over capacity (`ratio`) is compared with 1 + margin.
The margin starts from the model's calibration (its worst under-prediction on the H200 rows was 3.4%,
docs/model.md, so 4% of headroom) and adapts when a measured probe contradicts the model: an OOM at a
ratio the gate let through tightens it below that ratio; a fit above ratio 1 loosens it past that ratio.
A probe that fits but peaks above its prediction is a near miss the gate learns from as well: every ratio is
scaled by the largest measured/predicted peak of a fit in the study before it is compared (real verl on an
H100 peaked at 76.2 GiB where the model said 68.6, x1.11, with log-prob micro-batches of 32; on the H200 131.4
GiB for 114.6, x1.15, with 64: benchmarks/verl_h200/README.md), so that the next candidate the model puts at
95% is not launched into an OOM that costs a launch's start-up. A study on a kind of node that earlier studies ran on
starts from what their fits peaked above the model (the node profile's median of each study's largest ratio,
storage/node_profile.py), so its first launches are gated as its own near misses would gate them.

OOM boundaries: for a fixed parallel layout and fixed flags, memory grows monotonically with the
micro-batch sizes, token budgets, gpu_memory_utilization, max_num_seqs and max_num_batched_tokens. A
point that dominates a measured CUDA OOM is known to OOM; a point dominated by a measured fit is known
to fit. vLLM's "no room for the KV cache" runs the other way in gpu_memory_utilization (more share,
more room), so it has its own order over the rollout knobs. Inferred outcomes are recorded as inferred,
never as measurements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotune.model.memory import MemoryEstimate
from autotune.storage.node_profile import PROFILE_ATTR, profile_peak_under
from autotune.storage.records import MAX_UNDER, measured_under_prediction

# Memory is non-decreasing in each of these knobs, everything else fixed: knob -> the phases whose memory it drives.
MONOTONE_UP: dict[str, tuple[str, ...]] = {
    "ppo_micro_batch_size_per_gpu": ("update_actor",),
    "ppo_max_token_len_per_gpu": ("update_actor",),
    "log_prob_micro_batch_size_per_gpu": ("old_log_prob",),
    "ref_log_prob_micro_batch_size_per_gpu": ("ref",),
    "log_prob_max_token_len_per_gpu": ("old_log_prob", "ref"),
    "gpu_memory_utilization": ("rollout",),
    "max_num_seqs": ("rollout",),
    "max_num_batched_tokens": ("rollout",),
}
# vLLM's KV room shrinks with these up and grows with gpu_memory_utilization; it depends on nothing
# else but the rollout TP (the KV budget is share - weights/TP - activations - sampler).
KV_KEY = ("rollout_tp",)
KV_UP = ("max_num_seqs", "max_num_batched_tokens")
KV_DOWN = ("gpu_memory_utilization",)

INITIAL_MARGIN = -0.04
MARGIN_STEP = 0.01
MARGIN_ATTR = "prescreen_margin"


def memory_ratio(mem: MemoryEstimate) -> float:
    """Predicted need over capacity, folding a KV shortfall in as extra need."""
    kv_short = max(mem.kv_cache_needed_gib - mem.kv_cache_gib, 0.0)
    return max(mem.peak_gib / mem.capacity_gib, 1.0 + kv_short / mem.capacity_gib if kv_short else 0.0)


@dataclass
class MemoryGate:
    margin: float = INITIAL_MARGIN
    under: float = 1.0  # the largest measured/predicted peak of a probe that fitted in this study (1: none above)

    def need(self, ratio: float) -> float:
        """The predicted ratio scaled by the model's worst under-prediction measured in this study."""
        return ratio * self.under

    def admits(self, ratio: float) -> bool:
        return self.need(ratio) <= 1.0 + self.margin

    def learn(self, ratio: float, *, measured_oom: bool, measured_over_predicted: float | None = None) -> bool:
        """Update the gate from a measured outcome (`measured_over_predicted`: a fit's measured peak over its
        predicted one); True when it changed."""
        before = (self.margin, self.under)
        if not measured_oom and measured_over_predicted is not None and math.isfinite(measured_over_predicted):
            self.under = max(self.under, min(measured_over_predicted, MAX_UNDER))
        need = self.need(ratio)
        if measured_oom and need <= 1.0 + self.margin:
            self.margin = need - 1.0 - MARGIN_STEP
        elif not measured_oom and need > 1.0 + self.margin - MARGIN_STEP and need > 1.0:
            self.margin = max(self.margin, need - 1.0 + MARGIN_STEP)
        return (self.margin, self.under) != before

    def describe(self, ratio: float) -> str:
        """The comparison that gated `ratio`, for a rejection's reason."""
        scaled = f" x {self.under:.2f} measured under-prediction" if self.under > 1.0 else ""
        return f"ratio {ratio:.2f}{scaled} > {1 + self.margin:.2f}"

    @classmethod
    def of(cls, study: optuna.Study) -> "MemoryGate":
        attrs = study.user_attrs  # one read of the storage
        node = min(profile_peak_under(attrs.get(PROFILE_ATTR)), MAX_UNDER)
        return cls(margin=attrs.get(MARGIN_ATTR, INITIAL_MARGIN), under=max(measured_under_prediction(study), node))

    def save(self, study: optuna.Study) -> None:
        study.set_user_attr(MARGIN_ATTR, self.margin)


def _key(params: Mapping, names: Iterable[str] | None = None, exclude: Iterable[str] = ()) -> tuple:
    if names is not None:
        return tuple((n, params.get(n)) for n in names)
    skip = set(exclude)
    return tuple(sorted((k, v) for k, v in params.items() if k not in skip))


def _ge(a: Mapping, b: Mapping, names: Iterable[str]) -> bool:
    return all(a.get(n) is None or b.get(n) is None or a[n] >= b[n] for n in names)


def dominates_oom(candidate: Mapping, oom: Mapping, kind: str) -> bool:
    """True when `candidate` needs at least as much memory as a point that ran out of it."""
    if kind == "kv_cache_too_small":
        return (_key(candidate, KV_KEY) == _key(oom, KV_KEY) and _ge(candidate, oom, KV_UP)
                and _ge(oom, candidate, KV_DOWN))
    return _key(candidate, exclude=MONOTONE_UP) == _key(oom, exclude=MONOTONE_UP) and _ge(candidate, oom, MONOTONE_UP)


def dominated_by_fit(candidate: Mapping, fit: Mapping) -> bool:
    """True when `candidate` needs no more memory than a point that fitted, in every phase and the KV check."""
    same = _key(candidate, exclude=MONOTONE_UP) == _key(fit, exclude=MONOTONE_UP)
    return same and _ge(fit, candidate, MONOTONE_UP) and _ge(fit, candidate, KV_UP) and _ge(candidate, fit, KV_DOWN)


def measured_outcomes(study: optuna.Study) -> tuple[list[optuna.trial.FrozenTrial], list[optuna.trial.FrozenTrial]]:
    """(measured OOM trials, measured fits): launched probes only, never inferred or rejected ones."""
    ooms, fits = [], []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        state = t.user_attrs.get("state")
        if state == "oom" and "candidate" in t.user_attrs:
            ooms.append(t)
        elif state in ("measured", "simulated", "pruned") and "candidate" in t.user_attrs:
            fits.append(t)
    return ooms, fits


def inferred_oom(candidate: Mapping, study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    ooms, _ = measured_outcomes(study)
    for t in ooms:
        if dominates_oom(candidate, t.user_attrs["candidate"], t.user_attrs.get("oom_kind", "cuda_oom")):
            return t
    return None


def known_fit(candidate: Mapping, study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    _, fits = measured_outcomes(study)
    for t in fits:
        if dominated_by_fit(candidate, t.user_attrs["candidate"]):
            return t
    return None
