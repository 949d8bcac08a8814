"""The study driver: ask -> candidate -> verl's rules -> (memory pre-screen) -> probe -> tell.

Every trial ends with a recorded state and reason. Rule violations and OOMs are COMPLETE trials with
a violated constraint (the sampler learns from them; records.py keeps them out of best/export).
Pruned probes are PRUNED; a probe that cannot run on this machine at all stops the study.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune import interrupt
from autotune.search import lease
from autotune.config import TuneConfig
from autotune.errors import ConfigError
from autotune.backends.base import ProbeRequest, ProbeRunner
from autotune.model.host_memory import HOST_HEADROOM, estimate_host_memory
from autotune.model.memory import estimate_memory
from autotune.search.prescreen import MemoryGate, inferred_oom, known_fit, memory_ratio
from autotune.search.sampler import make_pruner, make_sampler
from autotune.search import confirm, groups, learned, posterior, queue
from autotune.search.budget import budget_left, confirm_held, finished_count, spent, verify_held
from autotune.search.equivalence import config_key
from autotune.search.executor import Executor, Finished, InProcess, Launch, Report
from autotune.search.outcomes import (copy_outcome, fail_run_folder, keep_probe_log, record_inferred_oom, record_outcome,
                                      reject, reject_memory, tell_placeholder)
from autotune.search.node_prior import record_profile, start_profile
from autotune.search.warmstart import expert_parallel_start, rank_space
from autotune.spaces.candidate import Candidate
from autotune.verl.roles import separate_reference
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import SearchSpace, verl_default_candidate
from autotune.storage.records import set_constraints
from autotune.storage.node_profile import PROFILE_ATTR, phase_factors
from autotune.storage.settings import ATTR as SETTINGS_ATTR, search_settings
from autotune.storage.urls import hold_single_writer, open_storage
from autotune.workload import Workload

TrialCallback = Callable[[optuna.trial.FrozenTrial], None]


@dataclass(frozen=True, kw_only=True)
class StudyContext:
    cfg: TuneConfig
    space: SearchSpace
    runner: ProbeRunner
    on_step: Callable[[int, int, float], None] | None = None  # (trial, step, tokens/s/GPU), for progress


def study_identity(cfg: TuneConfig) -> dict:
    """What a study was created for; resuming with anything else is refused."""
    model_spec = {k: v for k, v in asdict(cfg.model).items() if k != "shapes_from"}  # exported model.path, shapes
    return {"model": cfg.model.name, "model_spec": model_spec, "gpus_per_node": cfg.gpus_per_node, "nodes": cfg.nodes, "gpu": cfg.gpu.name,
            "backend": cfg.backend, "workload": asdict(cfg.workload), "objective": cfg.search.objective,
            "passthrough": cfg.passthrough, "source": cfg.source,
            **({"env": cfg.env} if cfg.env else {})}  # absent when empty: studies stored before it still resume


# the storage each opened study was created on: the lease reads and fails other tuners' trials through its
# public BaseStorage API (a Study exposes its storage only privately). Optuna uses open_storage's storage as it
# is, so these writes pass the same cache and retry as the study's own.
_STORAGES: "weakref.WeakKeyDictionary[optuna.Study, optuna.storages.BaseStorage]" = weakref.WeakKeyDictionary()


def open_study(cfg: TuneConfig) -> optuna.Study:
    storage = open_storage(cfg.storage_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    directions = ["maximize", "minimize"] if cfg.search.multi_objective else ["maximize"]
    study = optuna.create_study(study_name=cfg.study_name, storage=storage, directions=directions,
                                sampler=make_sampler(cfg.seed), pruner=make_pruner(cfg.probe.warmup_steps),
                                load_if_exists=True)
    _STORAGES[study] = storage
    identity = study_identity(cfg)
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        study.set_user_attr(SETTINGS_ATTR, search_settings(cfg))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["tokens_per_s_per_gpu", "peak_mem_gib"][:len(directions)])
        study.set_user_attr("memory_margin_gib", cfg.search.memory_margin_gib)
    else:
        diff = identity_differences(stored, identity)
        if not diff:
            return study
        raise ConfigError(f"study {cfg.study_name!r} in this storage was created for a different job (differs in: "
                          f"{', '.join(diff)}); use another --study or --out")
    return study


def identity_differences(stored: dict, identity: dict) -> list[str]:
    """The parts of a study's identity that differ from the stored one. A workload field this autotune has and the
    stored study lacks (added by a later release: e.g. megatron_optimizer_offload_fraction) is no difference while
    it holds its default, which is what the study ran under; any other value is one."""
    defaults = asdict(Workload())
    stored_workload = stored.get("workload") or {}
    filled = {**stored, "workload": {**{k: v for k, v in defaults.items() if k not in stored_workload},
                                     **stored_workload}}
    return sorted(k for k in identity if filled.get(k) != identity[k])


def held_off_knobs(cfg: TuneConfig, runner: ProbeRunner) -> dict:
    """The runner's held-off knobs that the user did not pin or range themselves."""
    return {k: v for k, v in runner.held_off().items() if k not in cfg.fixed and k not in cfg.ranges}


def fit_to_runner(cfg: TuneConfig, runner: ProbeRunner) -> TuneConfig:
    """The search space this runner can measure: held-off knobs pinned, and knobs of which it measures only some
    values (torch: FSDP engines) narrowed to those, so no trial is spent on a candidate it must reject. A
    user's range is intersected; a user's pin outside what the backend measures is an error."""
    fixed = {**cfg.fixed, **held_off_knobs(cfg, runner)}
    ranges = dict(cfg.ranges)
    for knob, choices in runner.measurable_choices().items():
        if knob in fixed:
            if fixed[knob] not in choices:
                raise ConfigError(f"the {cfg.backend} backend cannot measure {knob}={fixed[knob]!r} (it measures "
                                  f"{', '.join(map(str, choices))}); unpin it or use another --backend")
            continue
        wanted = ranges.get(knob)
        if isinstance(wanted, list):
            kept = [v for v in wanted if v in choices]
            if not kept:
                raise ConfigError(f"tune.yaml ranges.{knob}: the {cfg.backend} backend measures none of {wanted} "
                                  f"(it measures {', '.join(map(str, choices))})")
            ranges[knob] = kept
        elif wanted is None:
            ranges[knob] = list(choices)
    if fixed == cfg.fixed and ranges == cfg.ranges:
        return cfg
    return replace(cfg, fixed=fixed, ranges=ranges)


def build_space(cfg: TuneConfig) -> SearchSpace:
    space = SearchSpace.build(cfg.model, cfg.workload, gpus_per_node=cfg.gpus_per_node, nodes=cfg.nodes,
                              fixed=cfg.fixed, ranges=cfg.ranges, tune_workload=cfg.tune_workload,
                              holds=holds_of(cfg))
    if cfg.baseline is not None:
        widen_to_baseline(space, cfg)
    return space


def holds_of(cfg: TuneConfig) -> tuple:
    """What the user's own job (--from) holds at its values: its engine family, its rollout TP
    (autotune/verl/engines.py holds)."""
    from autotune.verl.engines import holds

    if cfg.baseline is None:
        return ()
    return holds(cfg.passthrough, cfg.baseline.actor_engine, cfg.workload.lora_rank, cfg.baseline.rollout_tp)


def widen_to_baseline(space: SearchSpace, cfg: TuneConfig) -> list[str]:
    """The user's own job (--from) is always trial 0: every domain widens to hold its values (a LoRA script's
    gpu_memory_utilization=0.2 lies below the searched 0.3..0.9). Done when the space is built, so a resumed
    run sees the same space. Returns the knobs widened."""
    base = replace(cfg.baseline, **{k: v for k, v in cfg.fixed.items()})
    widened = []
    for name, value in space.params_of(base, cfg.workload).items():
        dom = space.domains.get(name)
        if dom is None or dom.contains(value):
            continue
        if dom.choices:
            space.domains[name] = type(dom)(choices=tuple(dom.choices) + (value,))
        else:  # a float range: the new bound is the user's value, so it lies on the step grid
            space.domains[name] = type(dom)(low=min(dom.low, value), high=max(dom.high, value), step=dom.step)
        widened.append(name)
    return widened


def fail_dead_local_trials(study: optuna.Study) -> int:
    """RUNNING trials whose tuner is gone (its pid on this host, or its heartbeat anywhere): end the probe it
    left behind, mark the trial FAIL with the reason, and retry it (search/lease.py)."""
    return len(lease.reap(study, _STORAGES[study]))


def enqueue_baseline(study: optuna.Study, cfg: TuneConfig, space: SearchSpace) -> bool:
    """verl's default configuration as the first trial, so every report shows the gain over it; queued again
    while no baseline trial has an outcome (one interrupted by Ctrl-C or a dead tuner has none)."""
    tried = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) or not t.user_attrs.get("interrupted")
           for t in tried):
        return False
    base = cfg.baseline or verl_default_candidate(cfg.model, cfg.workload, gpus_per_node=cfg.gpus_per_node,
                                                  nodes=cfg.nodes)
    base = replace(base, **{k: v for k, v in cfg.fixed.items()})
    params = space.params_of(base, cfg.workload)
    if not space.contains(params):
        # verl's default outside a user's narrowed ranges; the user's own job never is (widen_to_baseline)
        return False
    label = "your job" if cfg.baseline is not None else "verl default"
    retry = {"retry_of": tried[-1].number} if tried else {}
    study.enqueue_trial(params, user_attrs={"baseline": True, "label": label, **retry})
    if cfg.baseline is not None and not tried:  # verl's default too, when it differs from the user's job
        default = replace(verl_default_candidate(cfg.model, cfg.workload, gpus_per_node=cfg.gpus_per_node,
                                                 nodes=cfg.nodes), **{k: v for k, v in cfg.fixed.items()})
        default_params = space.params_of(default, cfg.workload)
        if default_params != params and space.contains(default_params):
            study.enqueue_trial(default_params, user_attrs={"verl_default": True, "label": "verl default"})
    return True


def enqueue_warm_start(study: optuna.Study, cfg: TuneConfig, space: SearchSpace) -> int:
    """The cost model's best predictions, right after verl's default (once per study)."""
    if not cfg.search.warm_start or study.user_attrs.get("warm_started"):
        return 0
    gate = MemoryGate.of(study)
    factors = phase_factors(study.user_attrs.get(PROFILE_ATTR))  # the node's profile, when one matched
    ranked = rank_space(cfg, space, gate, keep=cfg.search.warm_start, seed=cfg.seed, factors=factors)
    labels = [None] * len(ranked)
    widest = expert_parallel_start(cfg, space, gate, seed=cfg.seed, factors=factors)
    if widest is not None and all(r.candidate.actor_ep < widest.candidate.actor_ep for r in ranked):
        ranked.append(widest)
        labels.append(f"EP {widest.candidate.actor_ep}, as verl's MoE recipes")
    for rank, (r, label) in enumerate(zip(ranked, labels)):
        study.enqueue_trial(space.params_of(r.candidate, r.workload),
                            user_attrs={"warm_start": rank, "predicted_tokens_per_s_per_gpu":
                                        r.predicted_tokens_per_s_per_gpu, **({"label": label} if label else {})})
    study.set_user_attr("warm_started", True)
    return len(ranked)


def propose_from_model(study: optuna.Study, cfg: TuneConfig, space: SearchSpace) -> bool:
    """Enqueue the next pick of the model corrected by every probe's phases (search/learned.py), unless this
    slot is TPE's. Returns True when something was enqueued."""
    if not cfg.search.learn:
        return False
    return learned.propose(study, cfg, space)


def start_study(cfg: TuneConfig) -> tuple[SearchSpace, optuna.Study]:
    """Open (or resume) the study: fail trials of a dead tuner, then queue the baseline and the warm start."""
    space = build_space(cfg)
    hold_single_writer(cfg.storage_url)
    study = open_study(cfg)
    fail_dead_local_trials(study)
    start_profile(study, cfg)  # before the warm start, which ranks with it
    enqueue_baseline(study, cfg, space)
    enqueue_warm_start(study, cfg, space)
    return space, study


def run_study(cfg: TuneConfig, runner: ProbeRunner, *, executor: Executor | None = None,
              on_trial: TrialCallback | None = None, on_step: Callable[[int, int, float], None] | None = None,
              on_start: Callable[[optuna.Study], None] | None = None) -> optuna.Study:
    """Run trials until the study holds `cfg.trials` finished ones or the budget ends (a second run resumes).

    The one study loop: `runner` answers the pre-launch checks, `executor` runs the probes (in this process by
    default; search/ray_executor.py runs several at once). `on_start` sees the opened study first (a resumed
    study's finished trials, for the progress panel)."""
    cfg = fit_to_runner(cfg, runner)
    executor = executor or InProcess(runner)
    space, study = start_study(cfg)
    study.set_user_attr(learned.NOISY_ATTR, not runner.deterministic)  # the search's noise term and the export's rank
    if on_start:
        on_start(study)
    ctx = StudyContext(cfg=cfg, space=space, runner=runner, on_step=on_step)
    with interrupt.deferred():  # a signal stops the loop at its next check, never inside a library (interrupt.py)
        _run_trials(ctx, study, executor, on_trial)
    record_profile(study, cfg)  # what this study measured, for the next study on this kind of node
    return study


def _run_trials(ctx: StudyContext, study: optuna.Study, executor: Executor, on_trial: TrialCallback | None) -> None:
    cfg, space = ctx.cfg, ctx.space
    started_s = time.monotonic()
    running: dict[int, tuple[optuna.Trial, lease.Heartbeat]] = {}  # asked by this loop, outcome not yet stored

    # the trials and probes kept for confirming the leaders, then for verifying the export (search/confirm.py), until
    # the search has spent the rest
    stage = confirm.Stage(study, confirm_held(cfg, ctx.runner), verify_held(cfg, ctx.runner))

    def trials_left() -> int:
        """Trials (and probes, under a probe budget) the study has still to start."""
        left = cfg.trials - finished_count(study) - executor.in_flight()
        if cfg.budget.probes is not None:
            left = min(left, cfg.budget.probes - spent(study, cfg.world_size).probes)
        return left

    def held() -> int:
        return stage.held(trials_left())

    def target() -> int:
        return cfg.trials - held()

    def wants_more() -> bool:
        # a queued baseline runs whatever --trials says: a report needs it (a retry after an interrupted trial 0)
        return (finished_count(study) + executor.in_flight() < target()
                or queue.baseline_waiting(study) is not None)

    try:
        while True:
            interrupt.check()
            stop = budget_left(cfg, study, started_s, held())
            while stop is None and executor.in_flight() < executor.capacity() and wants_more():
                interrupt.check()
                if fail_dead_local_trials(study):
                    enqueue_baseline(study, cfg, space)
                if not cfg.tune_workload:
                    propose_from_model(study, cfg, space)
                with interrupt.critical():  # a signal here would leave a RUNNING trial nobody claims
                    trial = queue.ask_queued_first(study, _STORAGES[study])
                    lease.take(trial)
                    running[trial.number] = (trial, lease.Heartbeat(trial).start())
                prepared = _unless_taken_over(study, trial, lambda: prepare_trial(ctx, study, trial))
                if prepared is None:  # decided without a probe (or taken over by another tuner)
                    _end_trial(study, trial, running, on_trial)
                else:
                    launches = [Launch(trial, *prepared)]
                    if ctx.runner.can_share(launches[0].request):
                        stage.saw_launch(group_size(cfg, ctx.runner, executor))
                    launches += _group_members(ctx, study, executor, launches[0], running, on_trial, held())
                    executor.submit_group(launches, [_reporter(ctx, study, la.trial) for la in launches])
                stop = budget_left(cfg, study, started_s, held())
            if not executor.in_flight():
                if not stage.confirmed():  # the search has spent its share: probe the leaders again, then go on
                    stage.start(trials_left())
                    continue
                if not stage.verified():  # the confirmations are in: choose the export, then measure it once more
                    confirm.verify(study)
                    continue
                if stop and finished_count(study) < cfg.trials:
                    study.set_user_attr("stopped_by", stop)
                break
            # a launch's held-out probes are stored last, the export chosen before the first of them
            for done in sorted(executor.wait(), key=lambda d: confirm.HOLDS_OUT in d.launch.trial.user_attrs):
                if confirm.HOLDS_OUT in done.launch.trial.user_attrs:
                    _unless_taken_over(study, done.launch.trial, lambda: confirm.seal_holdout(study, done.launch.trial))
                _store_outcome(study, done)
                posterior.store(study, cfg)  # before the trial's end is reported: the summary ranks by it
                _end_trial(study, done.launch.trial, running, on_trial)
    except BaseException as exc:
        try:
            if isinstance(exc, KeyboardInterrupt):  # a stopped tuner leaves nothing RUNNING: first, before a
                with interrupt.critical():          # second signal can land
                    for trial, _beat in running.values():
                        _fail_interrupted(study, trial)
        finally:
            for launch in executor.cancel():
                keep_probe_log(launch.trial, Path(launch.request.run_dir))
            for _trial, beat in running.values():
                beat.stop()
        raise


def group_size(cfg: TuneConfig, runner: ProbeRunner, executor: Executor) -> int:
    """Configurations per launch: tune.yaml's probe.configs_per_launch, else the backend's own default; one where
    the executor runs probes apart (Ray tasks) or the tuned workload changes between members."""
    if not executor.shares_launches() or cfg.tune_workload:
        return 1
    wanted = cfg.probe.configs_per_launch
    return wanted if wanted is not None else runner.default_configs_per_launch


def _group_members(ctx: StudyContext, study: optuna.Study, executor: Executor, lead: Launch,
                   running: dict[int, tuple[optuna.Trial, lease.Heartbeat]],
                   on_trial: TrialCallback | None, held: int = 0) -> list[Launch]:
    """The other configurations `lead`'s launch measures: queued by search/groups.py, then asked, checked and
    prepared like any trial (a member decided without a probe, a duplicate or a rule, just ends). `held`: the trials
    and probes kept for the confirmations and the verifying probe, which members must not take."""
    cfg = ctx.cfg
    room = min(group_size(cfg, ctx.runner, executor) - 1,
               cfg.trials - finished_count(study) - executor.in_flight() - 1 - held)
    if cfg.budget.probes is not None:  # the lead is already spent: launch_request marked it launched
        room = min(room, cfg.budget.probes - spent(study, cfg.world_size).probes - held)
    if room <= 0 or not ctx.runner.can_share(lead.request):
        return []
    req = lead.request
    if "verifies" in lead.trial.user_attrs:  # the export's verifying probe is measured alone
        return []
    if "confirms" in lead.trial.user_attrs:  # a confirmation's launch measures the other queued confirmations
        storage = _STORAGES[study]
        study_id = storage.get_study_id_from_name(study.study_name)
        others = [t for t in queue.repeats_waiting(study) if t.number != lead.trial.number]
        for t in groups.same_restart_key(req.candidate, others, room):
            storage.set_trial_user_attr(storage.get_trial_id_from_study_id_trial_number(study_id, t.number),
                                        groups.GROUP_ATTR, lead.trial.number)
    else:
        groups.enqueue_members(study, cfg, ctx.space, lead.trial, req.candidate, req.workload, room)
    out = []
    for waiting in queue.group_members_waiting(study, lead.trial.number):
        interrupt.check()
        with interrupt.critical():
            trial = queue.claim_waiting(study, _STORAGES[study], waiting)
            if trial is None:
                continue
            lease.take(trial)
            running[trial.number] = (trial, lease.Heartbeat(trial).start())
        prepared = _unless_taken_over(study, trial, lambda: prepare_trial(ctx, study, trial))
        if prepared is None:
            _end_trial(study, trial, running, on_trial)
        else:
            out.append(Launch(trial, *prepared))
    return out


def _unless_taken_over(study: optuna.Study, trial: optuna.Trial, step: Callable[[], object]) -> object | None:
    """`step()`, or None when another tuner failed this trial while our storage was unreachable (no heartbeat for
    GRACE_S) and queued a retry: our outcome cannot be stored on it (Optuna's tell says so with a ValueError)."""
    try:
        return step()
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
        if not study.get_trials(deepcopy=False)[trial.number].user_attrs.get("interrupted"):
            raise
        return None


def _store_outcome(study: optuna.Study, done: Finished) -> None:
    """A finished probe: keep its log, then store its outcome on the trial (a lost run folder stops the study)."""
    trial, run_dir = done.launch.trial, Path(done.launch.request.run_dir)
    keep_probe_log(trial, run_dir)

    def store() -> None:
        if isinstance(done.error, OSError):
            fail_run_folder(study, trial, run_dir, done.error)
        record_outcome(study, trial, done.launch.ratio, result=done.result, error=done.error)

    _unless_taken_over(study, trial, store)


def _end_trial(study: optuna.Study, trial: optuna.Trial, running: dict[int, tuple[optuna.Trial, lease.Heartbeat]],
               on_trial: TrialCallback | None) -> None:
    """The trial's outcome is stored (or another tuner's): stop its heartbeat and tell the caller."""
    _trial, beat = running.pop(trial.number)
    beat.stop()
    if on_trial:
        frozen = study.get_trials(deepcopy=False)[trial.number]  # study.trials deep-copies every trial
        if "interrupted" not in frozen.user_attrs:
            on_trial(frozen)


def _reporter(ctx: StudyContext, study: optuna.Study, trial: optuna.Trial) -> Report:
    """The per-step callback of a probe: progress, a stop request, and Optuna's pruner (single objective)."""
    multi = len(study.directions) == 2

    def report(step: int, tokens_per_s_per_gpu: float) -> bool:
        interrupt.check()
        if ctx.on_step:
            ctx.on_step(trial.number, step, tokens_per_s_per_gpu)
        if multi:  # Optuna prunes single-objective studies only
            return False
        trial.report(tokens_per_s_per_gpu, step)
        # the corrected model's picks run to the end: their phase times are what it learns from
        return trial.should_prune() and not trial.user_attrs.get("model_proposal")

    return report


def _fail_interrupted(study: optuna.Study, trial: optuna.Trial) -> None:
    try:
        trial.set_user_attr("state", "failed")
        trial.set_user_attr("reason", "interrupted by the user")
        trial.set_user_attr("interrupted", True)
        study.tell(trial, state=TrialState.FAIL)
    except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
        pass  # it was recorded before the signal came (tell raises ValueError for a finished trial)


def _find_duplicate(study: optuna.Study, trial: optuna.Trial, kl: bool) -> optuna.trial.FrozenTrial | None:
    """Probes are costly and nearly deterministic: reuse a finished trial of the same verl configuration (Optuna
    FAQ); knobs that do not reach verl for this candidate do not make it new (search/equivalence.py)."""
    mine = trial.user_attrs.get("candidate")
    if mine is None:
        return None
    key = config_key(mine, kl, trial.user_attrs.get("workload_tuned"))
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.number == trial.number or "duplicate_of" in t.user_attrs or "candidate" not in t.user_attrs:
            continue
        if config_key(t.user_attrs["candidate"], kl, t.user_attrs.get("workload_tuned")) == key:
            return t
    return None


def prepare_trial(ctx: StudyContext, study: optuna.Study,
                  trial: optuna.Trial) -> tuple[ProbeRequest, float] | None:
    """Everything before a launch: suggest, rules, inferred OOMs, the memory gate. Returns the probe to run
    (and the predicted memory ratio) or None when the trial was decided without one."""
    cfg = ctx.cfg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            candidate, workload = ctx.space.suggest(trial, cfg.workload)
        except ValueError as exc:
            if "dynamic value space" not in str(exc):
                raise
            # Optuna keeps one set of choices per parameter and study; this run's space (another backend, other
            # ranges) offers different ones
            study.tell(trial, state=TrialState.FAIL)
            raise ConfigError(f"study {cfg.study_name!r} was started with other choices for a knob than this run "
                              "offers (another backend or other ranges); resume it with the same ones, or use "
                              "another --study") from None
    holder = lease.claim(study, trial)
    if holder is not None:
        trial.set_user_attr("state", "skipped")
        trial.set_user_attr("reason", f"trial {holder.number} is probing the same configuration")
        trial.set_user_attr("claimed_by", holder.number)
        study.tell(trial, state=TrialState.FAIL)
        return None
    trial.set_user_attr("backend", cfg.backend)
    trial.set_user_attr("candidate", candidate.as_params())
    if cfg.tune_workload:  # opted-in workload knobs: recorded even when equal to the user's value
        trial.set_user_attr("workload_tuned", {k: getattr(workload, k) for k in cfg.tune_workload})

    duplicate = (None if queue.repeats_a_trial(trial)  # a confirmation probes a measured configuration again
                 else _find_duplicate(study, trial, separate_reference(workload)))
    if duplicate is not None:
        copy_outcome(study, trial, duplicate)
        return None
    layout = ParallelLayout.of(candidate, workload, gpus_per_node=cfg.gpus_per_node, nodes=cfg.nodes)
    violations = check(cfg.model, workload, candidate, layout)
    if violations:
        reject(study, trial, violations)
        return None
    unsupported = ctx.runner.unsupported(candidate, workload)
    if unsupported:
        set_constraints(trial, rules=1.0)
        trial.set_user_attr("state", "rejected")
        trial.set_user_attr("reason", f"not measurable by the {cfg.backend} backend: {unsupported}")
        tell_placeholder(study, trial)
        return None
    params = candidate.as_params()
    if cfg.search.boundaries:
        source = inferred_oom(params, study)
        if source is not None:
            record_inferred_oom(study, trial, source)
            return None
    mem = estimate_memory(cfg.model, cfg.gpu, workload, candidate, layout)
    ratio = memory_ratio(mem)
    trial.set_user_attr("predicted_peak_gib", mem.peak_gib)
    trial.set_user_attr("predicted_memory_ratio", ratio)
    gate = MemoryGate.of(study)
    # the user's own job is evidence: it runs where they run it, so a predicted OOM is recorded and shown, and the
    # job is launched anyway (its measurement corrects the gate: record_outcome)
    users_job = cfg.baseline is not None and bool(trial.user_attrs.get("baseline"))
    predicted_oom = []
    if cfg.search.prescreen and not gate.admits(ratio):
        fit = known_fit(params, study) if cfg.search.boundaries else None
        reason = (f"predicted OOM before launch: {mem.peak_gib:.1f} GiB in {mem.worst_phase} of "
                  f"{mem.capacity_gib:.1f} GiB" + ("" if mem.kv_cache_fits else " (no room for the KV cache)")
                  + f" (gate: {gate.describe(ratio)})")
        if fit is None and not users_job:
            reject_memory(study, trial, max(mem.over_gib, (ratio - 1 - gate.margin) * mem.capacity_gib), reason)
            return None
        if fit is not None:
            trial.set_user_attr("known_fit_from", fit.number)
        else:
            predicted_oom.append(reason)
    host = estimate_host_memory(cfg.model, workload, candidate, layout, gpus_per_node=cfg.gpus_per_node,
                                capacity_gib=cfg.host_mem_gib)
    trial.set_user_attr("predicted_host_gib", host.node_gib)
    if cfg.search.prescreen and not host.fits:
        reason = (f"predicted host OOM before launch: {host.describe()} of {cfg.host_mem_gib:.1f} GiB "
                  f"(plans for {HOST_HEADROOM:.0%})")
        if not users_job:
            reject_memory(study, trial, host.over_gib, reason)
            return None
        predicted_oom.append(reason)
    if predicted_oom:
        trial.set_user_attr("predicted_oom", "; ".join(predicted_oom) + "; launched anyway: it is your job")
    return launch_request(ctx, study, trial, candidate, workload, users_job=users_job), ratio


def launch_request(ctx: StudyContext, study: optuna.Study, trial: optuna.Trial, candidate: Candidate,
                   workload: Workload, *, users_job: bool = False) -> ProbeRequest:
    cfg = ctx.cfg
    run_dir = (Path(cfg.out_dir) / "runs" / f"{cfg.study_name}-trial{trial.number:04d}").resolve()
    if not ctx.runner.simulated:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail_run_folder(study, trial, run_dir, exc)
    trial.set_user_attr("run_dir", str(run_dir))
    trial.set_user_attr("launched", True)
    return ProbeRequest(model=cfg.model, gpu=cfg.gpu, n_gpus=cfg.gpus_per_node, nodes=cfg.nodes,
                        passthrough=cfg.passthrough, workload=workload, candidate=candidate, run_dir=run_dir,
                        trial_number=trial.number, warmup_steps=cfg.probe.warmup_steps,
                        timed_steps=cfg.probe.timed_steps, users_job=users_job, env=dict(cfg.env),
                        logprob_loop=cfg.logprob_loop)


