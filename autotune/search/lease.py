"""Who runs a trial, whether they are still alive, and which configuration they hold.

Several tuners (`autotune run` plus `autotune worker`s) share one study. Three things keep them honest:

- A lease: the tuner records host and pid on the trial it takes, and a heartbeat thread refreshes
  `user_attrs["heartbeat"]` every HEARTBEAT_S while the trial runs. Any tuner finds a RUNNING trial
  whose heartbeat (or, before the first one, whose start) is older than GRACE_S, or whose pid is gone
  on its own host, fails it with the reason and retries it (the baseline until it has a result).
  This is Optuna's heartbeat design (`heartbeat_interval`, `grace_period`, `RetryFailedTrialCallback`),
  kept in user attributes because Optuna's own works only inside `study.optimize()` on RDB storage,
  does not exist for journal storage (optuna#6615), and sees nothing before the first beat
  (reference/optuna-ray.md section 5). A trial's start time is written in the same call that creates
  it, so no window is left uncovered.
- A claim: each trial records `config_key` (its parameters) before any probe, then looks for another
  RUNNING trial with the same key. If it finds one it does not probe; it is recorded as skipped
  (FAIL, not counted as a finished trial) and the tuner asks again. Both trials write before they
  read, so of two trials racing for one configuration at least one sees the other. The baseline
  never steps aside (reports need it).
- The storage objects: set through its public BaseStorage API (trial ids looked up by number).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune.storage.records import probe_role

# How often a running trial's tuner says it is alive, and how long a silence means it is gone. The grace
# covers the storage back-off (storage/urls.py, about 31 s), so a tuner riding out a database restart is
# not taken for dead. AUTOTUNE_HEARTBEAT_S shortens both for fault-injection runs (benchmarks/faults.py).
HEARTBEAT_S = float(os.environ.get("AUTOTUNE_HEARTBEAT_S", "10"))
GRACE_S = 6 * HEARTBEAT_S

# carried onto a retry: what the trial was queued as
_CARRIED = ("baseline", "verl_default", "label", "warm_start", "model_proposal", "predicted_tokens_per_s_per_gpu")


def config_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=str)


class Heartbeat:
    """Refreshes the trial's heartbeat from a daemon thread until stopped (or the trial is finished)."""

    def __init__(self, trial: optuna.Trial, interval_s: float = HEARTBEAT_S) -> None:
        self._trial = trial
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial.number}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._trial.set_user_attr("heartbeat", time.time())
            except UpdateFinishedTrialError:
                return  # finished here, or failed by another tuner that found it silent
            except KeyboardInterrupt:
                return  # a stop was requested (the storage's retry loop checks for it): the main thread ends the run
            except Exception:  # noqa: BLE001 - the storage is away: the main thread reports it; keep beating
                continue


def take(trial: optuna.Trial) -> None:
    """Record who runs the trial (pid before host: a tuner on this host fails a trial whose pid is gone)."""
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("heartbeat", time.time())


def claim(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial | None:
    """Record the trial's configuration; return another RUNNING trial that holds the same one, if any. The baseline
    and a probe that repeats a configuration on purpose (a confirmation, a held-out probe that runs in the same launch
    as its leader's confirmation: search/confirm.py) hold none."""
    key = config_key(trial.params)
    trial.set_user_attr("config_key", key)
    if trial.user_attrs.get("baseline") or probe_role(trial.user_attrs) != "search":
        return None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number != trial.number and t.user_attrs.get("config_key") == key:
            return t
    return None


def dead_reason(t: FrozenTrial, *, host: str, now_s: float, grace_s: float = GRACE_S) -> str | None:
    """Why the RUNNING trial `t` has no live tuner, or None while it may have one."""
    pid = t.user_attrs.get("pid")
    if t.user_attrs.get("host") == host and isinstance(pid, int) and pid != os.getpid() and not _pid_alive(pid):
        return "the tuner process died mid-trial"
    beat = t.user_attrs.get("heartbeat")
    if not isinstance(beat, (int, float)):
        start = t.datetime_start or datetime.now()
        beat = start.timestamp()  # naive local time, as Optuna records it
    silent_s = now_s - beat
    if silent_s > grace_s:
        who = f" ({t.user_attrs['host']}:{pid})" if "host" in t.user_attrs else ""
        return f"its tuner{who} sent no heartbeat for {silent_s:.0f} s"
    return None


def reap(study: optuna.Study, storage: optuna.storages.BaseStorage, *, grace_s: float = GRACE_S) -> list[int]:
    """Fail the RUNNING trials that have no live tuner, end their probes on this host, retry them.

    Returns the numbers of the trials failed here. Two tuners may find the same dead trial; the storage
    lets only one of them finish it, and only that one queues the retry.
    """
    from autotune.backends.process import end_recorded_probe

    host = socket.gethostname()
    now_s = time.time()
    reaped = []
    study_id = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = dead_reason(t, host=host, now_s=now_s, grace_s=grace_s)
        if why is None:
            continue
        ended = False
        if t.user_attrs.get("host") == host and t.user_attrs.get("run_dir"):
            ended = end_recorded_probe(Path(t.user_attrs["run_dir"]) / "probe.pgid")
        reason = f"interrupted: {why}" + ("; its probe was still running and was ended" if ended else "")
        if study_id is None:
            study_id = storage.get_study_id_from_name(study.study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        try:
            storage.set_trial_user_attr(trial_id, "state", "failed")
            storage.set_trial_user_attr(trial_id, "reason", reason)
            storage.set_trial_user_attr(trial_id, "interrupted", True)
            if not storage.set_trial_state_values(trial_id, TrialState.FAIL):
                continue
        except UpdateFinishedTrialError:
            continue  # it finished after all, or another tuner failed it first
        reaped.append(t.number)
        if t.params and ("retry_of" not in t.user_attrs or t.user_attrs.get("baseline")):
            attrs = {k: t.user_attrs[k] for k in _CARRIED if k in t.user_attrs}
            study.enqueue_trial(t.params, user_attrs={**attrs, "retry_of": t.number})
    return reaped


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
