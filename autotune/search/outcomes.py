"""How a trial's outcome is stored: a measurement, an OOM (graded, taught to the memory gate), a rule or memory
rejection, a prune, a failure, a copy of an equivalent trial's outcome. Rejections and OOMs are COMPLETE trials with a
violated constraint and a placeholder value (records.py keeps them out of best and export)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.backends.base import ProbePruned, ProbeResult
from autotune.errors import ProbeEnvironmentError, ProbeOOM, ProbeRejected, RunFolderError
from autotune.search.prescreen import MemoryGate
from autotune.storage.records import peak_over_predicted, set_constraints
from autotune.verl.rules import Violation


def record_inferred_oom(study: optuna.Study, trial: optuna.Trial, source: optuna.trial.FrozenTrial) -> None:
    violation = (source.constraints or {}).get("memory", 1.0) or 1.0
    set_constraints(trial, memory=violation)
    trial.set_user_attr("state", "inferred_oom")
    trial.set_user_attr("oom_kind", source.user_attrs.get("oom_kind", "cuda_oom"))
    trial.set_user_attr("reason", f"inferred, not measured: needs at least the memory of trial {source.number}, which "
                                  f"ran out ({source.user_attrs.get('oom_phase') or 'unknown phase'})")
    trial.set_user_attr("inferred_from", source.number)
    tell_placeholder(study, trial)


def tell_placeholder(study: optuna.Study, trial: optuna.Trial) -> None:
    """COMPLETE with a placeholder the constraint marks infeasible; it never reaches best/report/export."""
    study.tell(trial, [0.0, 0.0] if len(study.directions) == 2 else 0.0)


def fail_run_folder(study: optuna.Study, trial: optuna.Trial, run_dir: Path, exc: OSError) -> None:
    """A probe cannot run without its folder: record the trial as failed and stop the study with the cause."""
    reason = f"cannot write the run folder {run_dir}: {exc.strerror or exc}"
    trial.set_user_attr("state", "failed")
    trial.set_user_attr("reason", reason)
    study.tell(trial, state=TrialState.FAIL)
    raise RunFolderError(f"{reason}; finished trials are stored, free the disk and run the same command")


def record_outcome(study: optuna.Study, trial: optuna.Trial, ratio: float, *, result: ProbeResult | None = None,
                   error: Exception | None = None) -> None:
    """Store a probe's outcome on its trial and tell the study; an environment error is re-raised after."""
    multi = len(study.directions) == 2
    gate = MemoryGate.of(study)
    if getattr(error, "probe_wall_s", None) is not None:  # a failed probe's GPU time counts against the budget
        trial.set_user_attr("probe_wall_s", error.probe_wall_s)
    if isinstance(error, ProbeOOM):
        set_constraints(trial, memory=error.over_gib if error.over_gib and error.over_gib > 0 else 1.0)
        trial.set_user_attr("state", "oom")
        trial.set_user_attr("reason", str(error)[:500])
        trial.set_user_attr("oom_phase", error.phase)
        trial.set_user_attr("oom_kind", error.kind)
        if error.peak_mem_gib is not None:
            trial.set_user_attr("peak_mem_gib", error.peak_mem_gib)
        if gate.learn(ratio, measured_oom=True):
            gate.save(study)
        tell_placeholder(study, trial)
    elif isinstance(error, ProbeRejected):
        set_constraints(trial, rules=1.0)
        trial.set_user_attr("state", "rejected")
        trial.set_user_attr("reason", f"verl refused it at start-up: {error}"[:500])
        tell_placeholder(study, trial)
    elif isinstance(error, ProbePruned):
        set_constraints(trial)
        trial.set_user_attr("state", "pruned")
        trial.set_user_attr("reason", str(error))
        study.tell(trial, state=TrialState.PRUNED)
    elif isinstance(error, ProbeEnvironmentError):
        trial.set_user_attr("state", "failed")
        trial.set_user_attr("reason", f"environment: {error}")
        study.tell(trial, state=TrialState.FAIL)
        raise error
    elif error is not None:
        trial.set_user_attr("state", "failed")
        trial.set_user_attr("reason", f"{type(error).__name__}: {error}"[:500])
        study.tell(trial, state=TrialState.FAIL)
    else:
        record_result(trial, result)
        # a simulator that ran the user's job past its own OOM prediction (backends/sim.py) measured nothing: the
        # gate learns from real fits only, such as a measured job that the model called OOM, or one that fitted
        # above its predicted peak
        over = peak_over_predicted(result.peak_mem_gib, trial.user_attrs.get("predicted_peak_gib"))
        if "predicted_oom" not in result.extra and gate.learn(ratio, measured_oom=False, measured_over_predicted=over):
            gate.save(study)
            if trial.user_attrs.get("predicted_oom"):
                trial.set_user_attr("gate_learned", f"it ran: the memory gate now admits ratio up to "
                                                    f"{1 + gate.margin:.2f}")
        study.tell(trial, [result.tokens_per_s_per_gpu, result.peak_mem_gib] if multi else result.tokens_per_s_per_gpu)


def keep_probe_log(trial: optuna.Trial, run_dir: Path) -> None:
    """Store the probe's log as an Optuna artifact (the dashboard shows it next to the trial)."""
    log_path = run_dir / "probe.log"
    if not log_path.is_file():
        return
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    store_dir = run_dir.parent.parent / "artifacts"
    try:
        store_dir.mkdir(parents=True, exist_ok=True)
        artifact_id = upload_artifact(artifact_store=FileSystemArtifactStore(str(store_dir)),
                                      file_path=str(log_path), study_or_trial=trial)
    except OSError as exc:  # the log stays in the run folder; a full disk must not lose the measurement
        trial.set_user_attr("log_artifact_error", f"{exc.strerror or exc}")
        return
    trial.set_user_attr("log_artifact_id", artifact_id)


def record_result(trial: optuna.Trial, result: ProbeResult) -> None:
    set_constraints(trial)
    trial.set_user_attr("state", "simulated" if result.simulated else "measured")
    trial.set_user_attr("reason", "simulated by the calibrated model" if result.simulated else "probe finished")
    trial.set_user_attr("simulated", result.simulated)
    trial.set_user_attr("tokens_per_s_per_gpu", result.tokens_per_s_per_gpu)
    trial.set_user_attr("mfu", result.mfu)
    trial.set_user_attr("peak_mem_gib", result.peak_mem_gib)
    trial.set_user_attr("step_s", result.step_s)
    trial.set_user_attr("phase_s", result.phase_s)
    trial.set_user_attr("series", result.series)
    for key, value in result.extra.items():
        trial.set_user_attr(key, value)


def reject(study: optuna.Study, trial: optuna.Trial, violations: list[Violation]) -> None:
    set_constraints(trial, rules=float(len(violations)))
    trial.set_user_attr("state", "rejected")
    trial.set_user_attr("reason", str(violations[0])[:500])
    trial.set_user_attr("violations", [{"rule": v.rule, "message": v.message, "enforced_by": v.enforced_by,
                                        "source": v.source} for v in violations])
    tell_placeholder(study, trial)


def reject_memory(study: optuna.Study, trial: optuna.Trial, over_gib: float, reason: str) -> None:
    set_constraints(trial, memory=max(over_gib, 0.01))
    trial.set_user_attr("state", "rejected")
    trial.set_user_attr("reason", reason)
    tell_placeholder(study, trial)


def copy_outcome(study: optuna.Study, trial: optuna.Trial, source: optuna.trial.FrozenTrial) -> None:
    constraints = source.constraints or {}
    set_constraints(trial, rules=constraints.get("rules", 0.0), memory=constraints.get("memory", 0.0))
    for key, value in source.user_attrs.items():
        if key not in ("host", "pid", "baseline", "verl_default", "label", "feasible", "warm_start", "launched",
                       "probe_wall_s", "heartbeat", "retry_of", "model_proposal", "config_key", "interrupted"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", source.number)
    trial.set_user_attr("launched", False)
    study.tell(trial, source.values if len(study.directions) == 2 else source.value)
