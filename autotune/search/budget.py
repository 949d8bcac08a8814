"""What a study has spent and what it may still spend: finished trials, launched probes and their GPU time, the
budget's limits, and the share kept back for confirming the leaders (search/confirm.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotune.backends.base import ProbeRunner
from autotune.config import TuneConfig


def finished_count(study: optuna.Study) -> int:
    """Finished trials, not counting those that stepped aside for another tuner's identical one."""
    return sum(t.user_attrs.get("state") != "skipped" for t in
               study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)))


@dataclass(frozen=True)
class Spent:
    probes: int
    gpu_hours: float


def spent(study: optuna.Study, world_size: int) -> Spent:
    """Launched probes and their GPU time (rejected and inferred candidates cost nothing)."""
    launched = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("launched")]
    wall_s = sum(t.user_attrs.get("probe_wall_s") or 0.0 for t in launched)
    return Spent(probes=len(launched), gpu_hours=wall_s * world_size / 3600)


def budget_left(cfg: TuneConfig, study: optuna.Study, started_s: float, held: int = 0) -> str | None:
    """None while the budget lasts, else which limit ended the search. `held` probes are kept back (the
    confirmation's, search/confirm.py): their share of a GPU-hour or wall-time budget is what a probe has cost so
    far."""
    b = cfg.budget
    used = spent(study, cfg.world_size)
    per_probe = used.gpu_hours / used.probes if used.probes else 0.0
    elapsed_s = time.monotonic() - started_s
    if b.probes is not None and used.probes >= b.probes - held:
        return f"probe budget reached ({used.probes} probes)"
    if b.gpu_hours is not None and used.gpu_hours >= b.gpu_hours - held * per_probe:
        return f"GPU-hour budget reached ({used.gpu_hours:.2f} GPU-hours)"
    if b.wall_time_s is not None and elapsed_s >= b.wall_time_s - (held * elapsed_s / used.probes if used.probes
                                                                   else 0.0):
        return f"wall-time budget reached ({b.wall_time_s:g} s)"
    return None


def confirm_held(cfg: TuneConfig, runner: ProbeRunner) -> int:
    """How many trials and probes the search keeps back for confirmation: search.confirm where the backend's probe
    is noisy and the study is large enough to spare them (5 trials, and 5 probes of a probe budget, per one)."""
    held = 0 if runner.deterministic else cfg.search.confirm
    if cfg.trials < 5 * held or (cfg.budget.probes is not None and cfg.budget.probes < 5 * held):
        return 0
    return held


def verify_held(cfg: TuneConfig, runner: ProbeRunner) -> int:
    """The trial and probe kept back, after the confirmations, to measure the chosen export once more
    (search/confirm.verify): one where search.verify is on and there is a confirmation."""
    return int(cfg.search.verify and confirm_held(cfg, runner) > 0)
