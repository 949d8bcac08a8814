"""Which configurations share a verl launch with a proposed one (issue 28 items 2 and 4).

A launch costs minutes of start-up (Ray, workers, checkpoint, vLLM) before its first step; the knobs verl reads at
every step (autotune/verl/step_knobs.py) cost one step each to measure once the launch is up. So when the sampler
proposes a configuration, the launch that measures it also measures the most promising other settings of those
knobs under the same restart key: ranked by the model corrected by every probe so far (search/learned.py), by
expected improvement over what the lead is expected to measure, under that model as if the lead had been measured
(a kriging believer); untried ones only, and only those verl's rules and the memory gate accept.

A launch's GPU time is weighed too (item 4): members are ranked by expected improvement per GPU-second of their own
step, and one joins only while it buys improvement at least as fast as its lead's whole launch does (start-up,
warm-up and teardown as measured on this node in this study, else by its node profile, else a prior; plus the
lead's step): a step spent on a member the model is sure adds little goes to the next launch instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune.config import TuneConfig
from autotune.search.equivalence import config_key, tried_keys
from autotune.search.learned import Acquisition, CorrectedModel, Scored
from autotune.search.prescreen import MemoryGate
from autotune.spaces.candidate import Candidate
from autotune.spaces.space import SearchSpace
from autotune.storage.node_profile import PROFILE_ATTR
from autotune.storage.records import TrialRecord, is_result
from autotune.storage.tuning_cost import NOT_WORTH_ATTR, launch_overhead_s
from autotune.verl.roles import separate_reference
from autotune.verl.step_knobs import STEP_KNOBS, restart_key
from autotune.workload import Workload

GROUP_ATTR = "launch_group"  # user attr: the trial number whose launch a member joins
PLANNED_ATTR = "planned_candidate"  # user attr of a queued trial: the candidate it will be (a confirmation's)
MAX_COMBINATIONS = 4096  # per-step values tried for one group (5 knobs, a handful of values each)


def step_variants(space: SearchSpace, lead: Candidate, workload: Workload):
    """Every setting of the per-step knobs that apply to `lead` (its engine and batching mode), the rest held."""
    params = lead.as_params()
    partial = {"actor_engine": params["actor_engine"], "use_dynamic_bsz": params["use_dynamic_bsz"]}
    names = [n for n in space.active_knobs(partial, workload) if n in STEP_KNOBS and n not in space.fixed]
    values = [space.domains[name].values() for name in names]
    for combo in itertools.islice(itertools.product(*values), MAX_COMBINATIONS):
        changes = dict(zip(names, combo))
        if any(params[n] != v for n, v in changes.items()):
            yield lead.with_(**changes)


def members(study: optuna.Study, cfg: TuneConfig, space: SearchSpace, lead: Candidate, workload: Workload,
            count: int) -> tuple[list[Scored], int | None]:
    """Up to `count` untried configurations that share `lead`'s launch, most promising first; and how many untried
    ones were not worth their step (None: none weighed, the model cannot score the lead)."""
    if count <= 0:
        return [], None
    kl = separate_reference(workload)
    trials = study.get_trials(deepcopy=False)
    tried = tried_keys(trials, kl) | {config_key(t.params, kl) for t in trials if t.state == TrialState.WAITING}
    tried.add(config_key(lead.as_params(), kl))
    best = max((t.user_attrs["tokens_per_s_per_gpu"] for t in trials if is_result(t)), default=None)
    model, gate = CorrectedModel.from_study(study, cfg), MemoryGate.of(study)
    lead_scored = Acquisition(cfg, model, gate, study, incumbent=best)(lead, workload)
    if lead_scored is None:  # the lead passed the driver's checks; the model's own gate may still refuse it
        return [], None
    # a member is scored as if the lead had already measured what the corrected model expects of it (the "kriging
    # believer" of Ginsbourger, Le Riche and Carraro 2010, "Kriging is well-suited to parallelize optimization"): it
    # buys what it adds over the lead, not the improvement the lead buys anyway, and the uncertainty it shares with
    # the lead (the layout's, the flags') is no longer its own. Scored against the measured best alone, near-twins of a
    # promising lead each carried the lead's expected improvement, and before any measurement every member joined: on
    # the search benchmark's 7B machines at one GPU-hour budget a cap of 16 spent it in 1.3 launches of one layout
    # (34% regret against 5% with one configuration a launch; benchmarks/launch_size.py)
    believer = max(best or 0.0, lead_scored.median_tokens_per_s_per_gpu)
    acq = Acquisition(cfg, model.believing(lead, workload), gate, study, incumbent=believer)
    ranked = []
    for cand in step_variants(space, lead, workload):
        key = config_key(cand.as_params(), kl)
        if key in tried:
            continue
        tried.add(key)
        scored = acq(cand, workload)
        if scored is not None:
            ranked.append(scored)
    ranked.sort(key=improvement_per_step_s, reverse=True)
    # what a launch costs: this study's launches, else what earlier studies on this kind of node paid (its profile),
    # else the prior; before anything is measured, the lead's launch buys all it measures (its median)
    overhead_s = (launch_overhead_s([TrialRecord.of(t) for t in trials])
                  or (study.user_attrs.get(PROFILE_ATTR) or {}).get("launch_overhead_s") or LAUNCH_OVERHEAD_PRIOR_S)
    worth = worth_a_step(ranked, lead_scored, overhead_s, cfg.probe.timed_steps)
    return spread(worth, lead, count, key=improvement_per_step_s), len(ranked) - len(worth)


# a launch's start-up, warm-up and teardown before this study or node has measured one: what the 1.5B launches on one
# H100 and one H200 cost beyond their timed steps (260-374 s; benchmarks/results/h100-2026-12-07-shared-study,
# h200-2026-12-05-verl-shared), the sim's 232 s start-up and 2.1x warm-up step for the 7B; larger models start slower
LAUNCH_OVERHEAD_PRIOR_S = 300.0


def improvement_per_step_s(s: Scored) -> float:
    """Expected improvement (tokens/s/GPU) per second of the step that measures it; the GPU count is the launch's,
    the same for every member, so it drops out of every comparison."""
    return s.score / s.step_s if s.step_s else 0.0


def worth_a_step(ranked: list[Scored], lead: Scored | None, overhead_s: float | None,
                 timed_steps: int) -> list[Scored]:
    """The members whose expected improvement per GPU-second is at least the lead's launch's: its expected
    improvement over its start-up, warm-up and teardown (`overhead_s`) and its own timed steps. Without a measured
    launch or a scored lead, all of them."""
    if lead is None or overhead_s is None or not lead.step_s:
        return ranked
    launch_rate = lead.score / (overhead_s + timed_steps * lead.step_s)
    return [s for s in ranked if s.step_s and improvement_per_step_s(s) / timed_steps >= launch_rate]


# the knob of the update pass, the longest training phase: a launch tries several of its values before it tries
# several log-prob settings with one of them (the model ranks near-twins of its favourite first otherwise, and one
# launch would learn one knob's neighbourhood)
UPDATE_KNOBS = ("ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")


def spread(ranked: list[Scored], lead: Candidate, count: int, key: Callable[[Scored], float]) -> list[Scored]:
    """The best `count` by `key` (`ranked` is in its order), those with an update-pass setting neither the lead nor
    a better pick has first."""
    knob = UPDATE_KNOBS[1] if lead.use_dynamic_bsz else UPDATE_KNOBS[0]
    seen = {getattr(lead, knob)}
    first = []
    for s in ranked:
        value = getattr(s.candidate, knob)
        if value not in seen and len(first) < count:
            first.append(s)
            seen.add(value)
    rest = [s for s in ranked if s not in first]
    return sorted(first + rest[:count - len(first)], key=key, reverse=True)


def same_restart_key(lead: Candidate, waiting: list, count: int) -> list:
    """Up to `count` queued trials that will run `lead`'s restart key and belong to no launch yet (a confirmation's
    launch takes the other queued confirmations, search/confirm.py); their planned candidate says which."""
    key = restart_key(lead)
    out = []
    for t in waiting:
        cand = t.user_attrs.get(PLANNED_ATTR)
        if len(out) >= count:
            break
        if GROUP_ATTR not in t.user_attrs and cand is not None and restart_key(Candidate.from_params(cand)) == key:
            out.append(t)
    return out


def enqueue_members(study: optuna.Study, cfg: TuneConfig, space: SearchSpace, lead_trial: optuna.Trial,
                    lead: Candidate, workload: Workload, count: int) -> int:
    """Queue the members of `lead_trial`'s launch; returns how many. The driver takes them next (ask_group_member)."""
    picked, not_worth = members(study, cfg, space, lead, workload, count)
    if not_worth is not None:
        lead_trial.set_user_attr(NOT_WORTH_ATTR, not_worth)
    for s in picked:
        study.enqueue_trial(space.params_of(s.candidate, s.workload),
                            user_attrs={GROUP_ATTR: lead_trial.number,
                                        "predicted_tokens_per_s_per_gpu": s.median_tokens_per_s_per_gpu},
                            skip_if_exists=True)
    return len(picked)
