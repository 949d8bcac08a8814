"""What autotune stores on each Optuna trial, and how it reads it back.

Every finished trial carries a `state` user attribute (measured, simulated, rejected, oom, pruned,
failed) and a one-line `reason`. Rejected and OOM trials are COMPLETE with a placeholder value of 0
and a violated constraint ("rules" or "memory"), so the sampler learns from them; the placeholder
never reaches a best trial, a report or an export because those read only feasible trials.
`feasible` is mirrored in user attributes because optuna-dashboard 0.21 does not read Optuna 5
constraints (reference/optuna-ray.md, section 0).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.verl.metrics import LAUNCH_ROLLOUT_KEY, THROUGHPUT_KEY

CONSTRAINT_KEYS = ("rules", "memory")
# study attribute: {trial number: posterior tokens/s/GPU} of each measured configuration where probes are noisy
POSTERIOR_ATTR = "posterior_tokens_per_s_per_gpu"
MEASURED_STATES = ("measured", "simulated")
# study attribute: the export's trial number, fixed before the probe that scores it (search/confirm.verify; None: none)
EXPORT_CHOSEN_ATTR = "export_chosen"


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    number: int
    optuna_state: str
    state: str  # autotune's outcome
    reason: str
    params: dict
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_mem_gib: float | None
    baseline: bool
    phase_s: dict
    feasible: bool = True  # user attr `feasible` (False: a violated constraint, whatever the state says)
    # every user attribute (the candidate, launched, simulated, ...): readers need not look the trial up again
    user_attrs: dict = field(default_factory=dict, repr=False)

    @property
    def feasible_measurement(self) -> bool:
        return self.feasible and self.state in MEASURED_STATES and self.tokens_per_s_per_gpu is not None

    @classmethod
    def of(cls, t: FrozenTrial) -> "TrialRecord":
        ua = t.user_attrs
        state = ua.get("state") or {TrialState.RUNNING: "running", TrialState.WAITING: "waiting",
                                    TrialState.FAIL: "failed", TrialState.PRUNED: "pruned"}.get(t.state, "unknown")
        return cls(number=t.number, optuna_state=t.state.name, state=state, reason=ua.get("reason", ""),
                   params=dict(t.params), tokens_per_s_per_gpu=ua.get("tokens_per_s_per_gpu"), mfu=ua.get("mfu"),
                   peak_mem_gib=ua.get("peak_mem_gib"), baseline=bool(ua.get("baseline")),
                   phase_s=ua.get("phase_s") or {}, feasible=ua.get("feasible") is not False, user_attrs=dict(ua))


def set_constraints(trial: optuna.Trial, *, rules: float = 0.0, memory: float = 0.0) -> None:
    """Always both keys, so every trial has the same constraint vector (GPSampler requires it)."""
    trial.set_constraint("rules", float(rules))
    trial.set_constraint("memory", float(memory))
    trial.set_user_attr("feasible", rules <= 0 and memory <= 0)


def records(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]


def is_result(t: FrozenTrial) -> bool:
    """A real measurement or simulation of a feasible configuration: never a rejected/OOM placeholder."""
    if t.state != TrialState.COMPLETE or t.user_attrs.get("feasible") is False:
        return False
    if any(v > 0 for v in (t.constraints or {}).values()):
        return False
    return TrialRecord.of(t).feasible_measurement


def feasible_measured(study: optuna.Study) -> list[TrialRecord]:
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False) if is_result(t)]


def pareto_front(study: optuna.Study) -> list[TrialRecord]:
    """A multi-objective study's results that no other beats in both tokens/s (higher) and peak memory (lower),
    fastest first: Optuna's `study.best_trials` (feasible trials only, by their constraints)."""
    front = [TrialRecord.of(t) for t in study.best_trials if is_result(t)]
    return sorted(front, key=lambda r: r.tokens_per_s_per_gpu, reverse=True)


def best_records(study: optuna.Study, k: int = 5) -> list[TrialRecord]:
    """Feasible measured trials, fastest first (never a placeholder value).

    In a multi-objective study (tokens/s against peak memory) the candidates are the Pareto front,
    restricted to trials that leave the study's `memory_margin_gib` of headroom on the GPU.
    """
    measured = pooled(feasible_measured(study))
    if len(study.directions) == 2:
        identity = study.user_attrs.get("identity") or {}
        from autotune.hardware import get_gpu
        capacity = get_gpu(identity["gpu"]).mem_gib if identity.get("gpu") else float("inf")
        margin = study.user_attrs.get("memory_margin_gib", 0.0)
        front = {r.number for r in pareto_front(study)}
        measured = [r for r in measured if (r.number in front or r.user_attrs.get("repeats"))
                    and (r.peak_mem_gib or 0.0) <= capacity - margin]
    base = baseline_record(study)
    return rank(measured, (base.user_attrs.get("candidate") or base.params) if base else {},
                study.user_attrs.get(POSTERIOR_ATTR), study.user_attrs.get(EXPORT_CHOSEN_ATTR))[:k]


def rank(measured: list[TrialRecord], base_params: dict, posterior: dict | None = None,
         chosen: int | None = None) -> list[TrialRecord]:
    """Results fastest first, the export first among those tied with the fastest (tie_break). Where the study's
    probes are noisy and every result has a posterior throughput (search/posterior.py), by that instead of its
    measured score. Where the export was chosen before its verifying probe (`chosen`, search/confirm.verify), it
    stays first: the probe that scores it must not also choose it."""
    if posterior and all(str(r.number) in posterior for r in measured):
        measured = [replace(r, user_attrs={**r.user_attrs, POSTERIOR_ATTR: posterior[str(r.number)]})
                    for r in measured]
    ranked = sorted(measured, key=ranking_score, reverse=True)
    if ranked:
        pick = still_chosen(ranked, chosen) or tie_break(tied_with_fastest(ranked), base_params)
        ranked = [pick] + [r for r in ranked if r is not pick]
    return ranked


def still_chosen(measured: list[TrialRecord], chosen: int | None) -> TrialRecord | None:
    """The export fixed before its verifying probe, once that probe is in and while the search measured nothing
    after it (a resumed study that searched on chooses again; another leader's held-out probe, measured in the same
    launch, search/confirm.seal_holdout, is no search)."""
    fixed = next((r for r in measured if r.number == chosen), None) if chosen is not None else None
    verified_at = max((p["trial"] for p in (fixed.user_attrs.get("repeats") or ()) if p.get("role") == "verify"),
                      default=None) if fixed else None
    if verified_at is None:
        return None
    later = any(n > verified_at for r in measured if r is not fixed
                for n, role in [(r.number, probe_role(r.user_attrs)),
                                *((p["trial"], p.get("role")) for p in r.user_attrs.get("repeats") or ())]
                if role == "search")
    return None if later else fixed


def ranking_score(rec: TrialRecord) -> float:
    """What the export ranks by: the posterior throughput where the study has one, else the measured score."""
    return rec.user_attrs.get(POSTERIOR_ATTR) or rec.tokens_per_s_per_gpu


def configuration_key(rec: TrialRecord) -> str:
    """What makes two trials the same configuration: the candidate verl ran and any opted-in workload knob."""
    return json.dumps([rec.user_attrs.get("candidate") or rec.params, rec.user_attrs.get("workload_tuned") or {}],
                      sort_keys=True, default=str)


def timed_values(rec: TrialRecord) -> list[float]:
    """A measured trial's timed steps, tokens/s (the warm-up is never in its series), as it was scored: a shared
    launch's member at the launch's rollout (autotune/verl/metrics.py LAUNCH_ROLLOUT_KEY), else verl's own."""
    series = rec.user_attrs.get("series") or {}
    values = series.get(LAUNCH_ROLLOUT_KEY) or series.get(THROUGHPUT_KEY) or ()
    return [v for v in values if v and v > 0]


def pooled(measured: list[TrialRecord]) -> list[TrialRecord]:
    """One record per configuration. A configuration measured by more than one probe (a confirmation, issue 34) is
    scored by the geometric mean of its confirmation probes weighted by their timed steps, with its highest peak; the
    record is its first trial's, and `repeats` lists every probe (`scored`: whether it is in the score). The first
    probe is left out of a confirmed score because it is what chose the configuration for confirmation: of many noisy
    probes the search confirms the highest, so that one is high by luck (winner's curse; on the search benchmark's
    noisy machines the export's pooled score overstated its true one by x1.06 on median, benchmarks/export_regret.py),
    while a probe taken after the choice is not. The export's verifying probe (search/confirm.verify), taken after the
    confirmations chose it, is its score alone, for the same reason. A trial that copied another's outcome without a
    probe (`duplicate_of`) is no measurement of its own."""
    groups: dict[str, list[TrialRecord]] = {}
    for r in measured:
        groups.setdefault(configuration_key(r), []).append(r)
    out = []
    for recs in groups.values():
        probes = [r for r in recs if "duplicate_of" not in r.user_attrs] or recs
        if len(probes) == 1:
            out.extend(recs)
            continue
        scored = ([r for r in probes if "verifies" in r.user_attrs] or [r for r in probes if "confirms" in r.user_attrs]
                  or probes)
        steps = {r.number: max(len(timed_values(r)), 1) for r in probes}
        score = math.exp(sum(steps[r.number] * math.log(r.tokens_per_s_per_gpu) for r in scored)
                         / sum(steps[r.number] for r in scored))
        peaks = [r.peak_mem_gib for r in probes if r.peak_mem_gib is not None]
        first = min(probes, key=lambda r: r.number)
        out.append(replace(first, tokens_per_s_per_gpu=score, peak_mem_gib=max(peaks) if peaks else None,
                           user_attrs={**first.user_attrs, "repeats": [
                               {"trial": r.number, "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                                "steps": steps[r.number], "scored": r in scored, "role": probe_role(r.user_attrs)}
                               for r in sorted(probes, key=lambda p: p.number)]}))
    return out


def probe_role(user_attrs: dict) -> str:
    """Why a trial probed its configuration, from its user attributes: "verify" (the export's probe after it was
    chosen, search/confirm.verify), "confirm" (a leader's probe again), "holdout" (a leader's held-out probe whose
    outcome is not stored yet: search/confirm.seal_holdout makes it one of the two) or "search"."""
    if "verifies" in user_attrs:
        return "verify"
    return "confirm" if "confirms" in user_attrs else "holdout" if "holds_out" in user_attrs else "search"


# Scores this close to the fastest are one result (issue 32 item 5): a difference no run's wall time shows, below a
# single step's noise on real hardware (the same configuration moved 18% inside one H200 launch, 2026-12-05), and
# what made the same command export a different best.yaml each run while its top 5 were within about 1%.
TIE_FRACTION = 0.01


def tied_with_fastest(ranked: list[TrialRecord]) -> list[TrialRecord]:
    """The results, fastest first (by ranking_score), within TIE_FRACTION of the fastest."""
    floor = ranking_score(ranked[0]) * (1 - TIE_FRACTION)
    return [r for r in ranked if ranking_score(r) >= floor]


def tie_break(tied: list[TrialRecord], base_params: dict) -> TrialRecord:
    """Among tied results: the most memory headroom (lowest peak), then the fewest knobs changed against the
    baseline, then the faster, then the earlier trial."""
    from autotune.storage.changes import knob_changes

    def key(r: TrialRecord):
        changed = len(knob_changes(base_params, r.user_attrs.get("candidate") or r.params)) if base_params else 0
        return (r.peak_mem_gib if r.peak_mem_gib is not None else float("inf"), changed, -ranking_score(r),
                r.number)

    return min(tied, key=key)


def baseline_record(study: optuna.Study) -> TrialRecord | None:
    """The baseline's measured trial when one exists (a retry after an interrupted one), else its first
    finished one."""
    finished = [r for r in records(study) if r.baseline and r.optuna_state not in ("RUNNING", "WAITING")]
    measured = [r for r in finished if r.feasible_measurement]
    return (measured or finished or [None])[0]


def baseline_label(study: optuna.Study) -> str:
    """What trial 0 is: "your job" for a study started --from a user's job, else "verl default"."""
    identity = study.user_attrs.get("identity") or {}
    return "your job" if identity.get("source") else "verl default"


def verl_default_record(study: optuna.Study) -> TrialRecord | None:
    """verl's default configuration, measured beside the user's job (--from) when it differs from it."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("verl_default") and t.state.is_finished():
            return TrialRecord.of(t)
    return None


# one reading no larger correction comes from: a peak sampled over more than the probe's own steps (a shared launch's
# whole span, fixed in backends/verl/shared_launch.sample_spans) read 2.2x; beyond this an OOM teaches the margin
MAX_UNDER = 1.25


def peak_over_predicted(peak_gib: float | None, predicted_gib: float | None) -> float | None:
    """A probe's measured peak over the memory model's predicted one; None without both."""
    return peak_gib / predicted_gib if peak_gib and predicted_gib else None


def measured_under_prediction(study: optuna.Study) -> float:
    """The largest measured/predicted peak of a probe that fitted in the study, at most MAX_UNDER; 1 when none
    peaked above its prediction. Read from the stored trials, so a study resumed from before this rule learns too."""
    worst = 1.0
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        ua = t.user_attrs
        over = peak_over_predicted(ua.get("peak_mem_gib"), ua.get("predicted_peak_gib"))
        if ua.get("state") in ("measured", "simulated", "pruned") and over and "predicted_oom" not in ua:
            worst = max(worst, min(over, MAX_UNDER))
    return worst
