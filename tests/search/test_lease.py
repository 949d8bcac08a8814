"""Trials of dead tuners, claims between workers, the baseline's retry (issue 20 items 1-3)."""

import socket
import time
from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import get_runner
from autotune.search import lease
from autotune.search.driver import _STORAGES, enqueue_baseline, open_study, run_study
from autotune.storage.records import baseline_record
from autotune.storage.results import summary
from autotune.workload import Workload


def _cfg(tmp_path: Path, trials=6, url=None) -> TuneConfig:
    return TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                      trials=trials, storage_url=url or f"sqlite:///{tmp_path / 'a.db'}", study_name="s",
                      out_dir=tmp_path, seed=3, workload=Workload(), fixed={}, ranges={}, tune_workload=(),
                      probe=ProbeBudget(), search=SearchOptions(warm_start=1))


@pytest.fixture(params=["sqlite", "journal"])
def url(request, tmp_path):
    return f"sqlite:///{tmp_path / 'a.db'}" if request.param == "sqlite" else f"journal:///{tmp_path / 'a.log'}"


def test_a_trial_taken_but_never_labelled_is_failed_after_the_grace_and_retried(tmp_path, url):
    """The window issue 20 found: the tuner died after ask() but before recording pid and host."""
    study = open_study(_cfg(tmp_path, url=url))
    never = study.ask()  # no pid, no host, no heartbeat, no parameters: killed inside ask()
    orphan = study.ask()
    orphan.suggest_categorical("ppo_micro_batch_size_per_gpu", [2, 4, 8])  # killed after suggesting, before take()
    assert lease.reap(study, _STORAGES[study], grace_s=60.0) == [], "still inside the grace period"
    assert lease.reap(study, _STORAGES[study], grace_s=0.0) == [never.number, orphan.number]
    assert not [x for x in study.trials if x.user_attrs.get("retry_of") == never.number], "nothing to repeat"
    t = study.trials[orphan.number]
    assert t.state == TrialState.FAIL and "no heartbeat" in t.user_attrs["reason"] and t.user_attrs["interrupted"]
    retry = [x for x in study.trials if x.user_attrs.get("retry_of") == orphan.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert lease.reap(study, _STORAGES[study], grace_s=0.0) == [], "a FAIL trial is not reaped twice"
    again = study.ask()
    assert again.number == retry[0].number and again.suggest_categorical("ppo_micro_batch_size_per_gpu", [2, 4, 8]) \
        == t.params["ppo_micro_batch_size_per_gpu"]


def test_a_live_heartbeat_keeps_a_trial_and_a_silent_one_loses_it(tmp_path):
    study = open_study(_cfg(tmp_path))
    trial = study.ask()
    lease.take(trial)
    trial.set_user_attr("pid", 1)  # alive (init) on this host: only the heartbeat decides
    beat = lease.Heartbeat(trial, interval_s=0.05).start()
    try:
        time.sleep(0.3)
        assert lease.reap(study, _STORAGES[study], grace_s=0.2) == []
    finally:
        beat.stop()
    time.sleep(0.4)
    assert lease.reap(study, _STORAGES[study], grace_s=0.2) == [trial.number]


def test_dead_reason_by_pid_on_this_host_and_by_silence_elsewhere():
    now = time.time()
    host = socket.gethostname()

    def frozen(**attrs):
        return optuna.trial.FrozenTrial(number=0, state=TrialState.RUNNING, value=None, datetime_start=datetime.now(),
                                        datetime_complete=None, params={}, distributions={}, user_attrs=attrs,
                                        system_attrs={}, intermediate_values={}, trial_id=0)

    assert "died" in lease.dead_reason(frozen(host=host, pid=2**22 + 7, heartbeat=now), host=host, now_s=now)
    assert lease.dead_reason(frozen(host="elsewhere", pid=2**22 + 7, heartbeat=now), host=host, now_s=now) is None
    assert "no heartbeat for 61 s" in lease.dead_reason(frozen(host="elsewhere", pid=1, heartbeat=now - 61),
                                                        host=host, now_s=now, grace_s=60)
    old = frozen()
    old.datetime_start = datetime.now() - timedelta(seconds=120)
    assert "no heartbeat" in lease.dead_reason(old, host=host, now_s=now, grace_s=60)


def test_two_trials_of_one_configuration_in_flight_probe_it_once(tmp_path, url):
    study = open_study(_cfg(tmp_path, url=url))
    params = {"ppo_micro_batch_size_per_gpu": 4}
    study.enqueue_trial(params)
    study.enqueue_trial(params)
    first, second = study.ask(), study.ask()
    for t in (first, second):
        t.suggest_categorical("ppo_micro_batch_size_per_gpu", [2, 4, 8])
    # both record their key before either looks: the second sees the first (and vice versa)
    first.set_user_attr("config_key", lease.config_key(first.params))
    assert lease.claim(study, second).number == first.number
    assert lease.claim(study, first).number == second.number, "symmetric: a race leaves at most one prober"


def test_a_baseline_never_steps_aside(tmp_path):
    study = open_study(_cfg(tmp_path))
    study.enqueue_trial({"ppo_micro_batch_size_per_gpu": 4})
    study.enqueue_trial({"ppo_micro_batch_size_per_gpu": 4}, user_attrs={"baseline": True})
    other, base = study.ask(), study.ask()
    for t in (other, base):
        t.suggest_categorical("ppo_micro_batch_size_per_gpu", [2, 4, 8])
    assert lease.claim(study, other) is None
    assert lease.claim(study, base) is None and base.user_attrs["config_key"] == other.user_attrs["config_key"]


def _default_params(cfg):
    from autotune.search.driver import build_space
    from autotune.spaces.space import verl_default_candidate

    space = build_space(cfg)
    return space, space.params_of(verl_default_candidate(cfg.model, cfg.workload, gpus_per_node=8, nodes=1),
                                  cfg.workload)


def test_a_worker_that_finds_its_configuration_in_flight_records_a_skip_and_moves_on(tmp_path, url):
    cfg = _cfg(tmp_path, trials=4, url=url)
    study = open_study(cfg)
    space, params = _default_params(cfg)
    study.enqueue_trial(params)
    study.enqueue_trial(params)
    held = study.ask()  # another tuner, alive (this pid, fresh heartbeat), probes this configuration now
    space.suggest(held, cfg.workload)
    lease.take(held)
    assert lease.claim(study, held) is None
    study = run_study(cfg, get_runner("sim"))  # takes the second copy first
    skipped = [t for t in study.trials if t.user_attrs.get("state") == "skipped"]
    assert len(skipped) == 1 and skipped[0].user_attrs["claimed_by"] == held.number
    assert skipped[0].state == TrialState.FAIL and not skipped[0].user_attrs.get("launched")
    assert skipped[0].params == held.params
    counted = [t for t in study.trials if t.state.is_finished() and t.user_attrs.get("state") != "skipped"]
    assert len(counted) == 4, "a skip is not a finished trial"


def test_the_baseline_is_queued_again_after_an_interrupted_first_trial_and_the_report_takes_the_retry(tmp_path):
    cfg = _cfg(tmp_path, trials=3)
    study = open_study(cfg)
    from autotune.search.driver import build_space

    space = build_space(cfg)
    assert enqueue_baseline(study, cfg, space)
    first = study.ask()
    first.set_user_attr("state", "failed")
    first.set_user_attr("reason", "interrupted by the user")
    first.set_user_attr("interrupted", True)
    study.tell(first, state=TrialState.FAIL)  # Ctrl-C during trial 0
    study = run_study(cfg, get_runner("sim"))
    bases = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert [t.state for t in bases] == [TrialState.FAIL, TrialState.COMPLETE]
    assert bases[1].user_attrs["retry_of"] == bases[0].number
    assert baseline_record(study).number == bases[1].number
    doc = summary(study, cfg.storage_url)
    assert doc["baseline"] is not None and doc["speedup_vs_baseline"] is not None
    assert not enqueue_baseline(study, cfg, space), "a baseline with a result is not queued again"


def test_a_baseline_retry_after_kill_9_is_the_one_the_report_uses(tmp_path):
    cfg = _cfg(tmp_path, trials=3)
    study = open_study(cfg)
    space, _ = _default_params(cfg)
    enqueue_baseline(study, cfg, space)
    dead = study.ask()
    space.suggest(dead, cfg.workload)
    lease.take(dead)
    dead.set_user_attr("pid", 2**22 + 99)  # gone
    study = run_study(cfg, get_runner("sim"))
    bases = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert bases[0].state == TrialState.FAIL and "died" in bases[0].user_attrs["reason"]
    assert bases[1].params == bases[0].params and bases[1].user_attrs["retry_of"] == bases[0].number
    assert baseline_record(study).number != bases[0].number
    assert summary(study, cfg.storage_url)["baseline"]["trial"] == baseline_record(study).number


@pytest.mark.parametrize("how,trials", [("kill -9", 1), ("Ctrl-C", 3)])
def test_a_baseline_retry_runs_first_on_resume_whatever_trials_says(tmp_path, how, trials):
    """Trial 0 interrupted after the first run queued the warm start: the resumed run measures the baseline's
    retry before the warm start, even when --trials is already reached (the interrupted trial counts)."""
    from dataclasses import replace

    from autotune.search.driver import start_study

    cfg = replace(_cfg(tmp_path), search=SearchOptions(warm_start=4))
    space, study = start_study(cfg)
    first = study.ask()
    assert first.user_attrs.get("baseline")
    space.suggest(first, cfg.workload)
    lease.take(first)
    if how == "kill -9":
        first.set_user_attr("pid", 2**22 + 99)  # gone
    else:
        first.set_user_attr("interrupted", True)
        study.tell(first, state=TrialState.FAIL)
    study = run_study(replace(cfg, trials=trials), get_runner("sim"))
    bases = [t for t in study.trials if t.user_attrs.get("baseline")]
    assert [t.state for t in bases] == [TrialState.FAIL, TrialState.COMPLETE]
    assert bases[1].user_attrs["retry_of"] == 0
    warm = [t for t in study.trials if "warm_start" in t.user_attrs]
    assert len(warm) == 4 and all(t.number < bases[1].number for t in warm), "the warm start was queued first"
    assert all(t.state == TrialState.WAITING or t.datetime_start > bases[1].datetime_start for t in warm)
    assert summary(study, cfg.storage_url)["baseline"]["trial"] == bases[1].number


def test_a_second_writer_on_one_sqlite_file_is_one_line_naming_the_alternatives(tmp_path):
    import subprocess
    import sys

    from autotune.storage.urls import hold_single_writer

    url = f"sqlite:///{tmp_path / 'a.db'}"
    hold_single_writer(url)
    hold_single_writer(url)  # the same process again: fine
    code = ("from autotune.storage.urls import hold_single_writer; from autotune.errors import ConfigError\n"
            f"try:\n    hold_single_writer({url!r})\nexcept ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "in use by another autotune process" in out and "PostgreSQL" in out and "journal" in out
    assert len(out.strip().splitlines()) == 1


def test_the_sqlite_writer_lock_is_the_files_not_the_paths(tmp_path):
    """A hard link (or a bind mount) is another path to the same file: it ran two writers (issue 33)."""
    import os
    import subprocess
    import sys

    from autotune.storage.urls import hold_single_writer

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    db = tmp_path / "one" / "a.db"
    hold_single_writer(f"sqlite:///{db}")
    os.link(db, tmp_path / "two" / "b.db")
    other = f"sqlite:///{tmp_path / 'two' / 'b.db'}"
    code = ("from autotune.storage.urls import hold_single_writer; from autotune.errors import ConfigError\n"
            f"try:\n    hold_single_writer({other!r})\n    print('held')\nexcept ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "in use by another autotune process" in out and "held" not in out, out
    (tmp_path / "two" / "c.db").write_bytes(b"")  # another file in the same folder is free
    fresh = code.replace(repr(other), repr(f"sqlite:///{tmp_path / 'two' / 'c.db'}"))
    assert subprocess.run([sys.executable, "-c", fresh], capture_output=True, text=True, timeout=60).stdout == "held\n"


def test_a_tuner_whose_trial_was_failed_by_another_goes_on_with_the_next(tmp_path):
    """A worker that lost its database for longer than the grace finds its trial failed (and retried) by
    another tuner: it cannot store its result there, and carries on instead of crashing."""
    from autotune.backends.sim import SimRunner

    cfg = _cfg(tmp_path, trials=4)

    class ReapedMidProbe(SimRunner):
        done = False

        def probe(self, request, report):
            result = super().probe(request, report)
            if not self.done:
                self.done = True
                study = optuna.load_study(study_name="s", storage=cfg.storage_url)
                assert lease.reap(study, study._storage, grace_s=0.0) == [request.trial_number]  # test-only access
            return result

    study = run_study(cfg, ReapedMidProbe())
    reaped = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert len(reaped) == 1 and reaped[0].state == TrialState.FAIL
    assert [t for t in study.trials if t.user_attrs.get("retry_of") == reaped[0].number]
    assert not [t for t in study.trials if t.state == TrialState.RUNNING]
