"""kill -9 of the tuner in the middle of a probe, then the same run again (issue 7).

The tuner runs in a subprocess on the verl backend with the main_ppo TEST DOUBLE (tests/backends/verl/
verl_double) hanging in step 2; it is SIGKILLed (no finally block runs), and a new run on the same
storage must end the orphaned probe group, mark the trial failed with the reason, retry it once, and
keep every finished trial.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna

DOUBLE = Path(__file__).parents[1] / "backends" / "verl" / "verl_double"

TUNER = r"""
import os, sys
from pathlib import Path
from autotune.config import ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.verl.runner import ProbeLimits, VerlRunner
from autotune.search.driver import run_study
from autotune.workload import Workload
import autotune.search.groups as groups
groups.LAUNCH_OVERHEAD_PRIOR_S = 1e9  # every member worth its step: the test is of what a kill mid-launch leaves
out = Path(sys.argv[1]); trials = int(sys.argv[2]); per_launch = int(sys.argv[3])
cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="verl",
                 trials=trials, storage_url=f"sqlite:///{out / 'autotune.db'}", study_name="k", out_dir=out, seed=0,
                 workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget(configs_per_launch=per_launch),
                 search=SearchOptions(warm_start=1))
run_study(cfg, VerlRunner(limits=ProbeLimits(deadline_s=600, idle_timeout_s=600, kill_grace_s=2), env=dict(os.environ),
                          shared_entry="step_switch_double"))
"""


def _tuner(out: Path, trials: int, scenario: str, per_launch: int = 1) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AUTOTUNE_VERL_DOUBLE": scenario, "AUTOTUNE_VERL_DOUBLE_MARK": f"kill-test-{out.name}"}
    return subprocess.Popen([sys.executable, "-c", TUNER, str(out), str(trials), str(per_launch)], env=env)


def _group_alive(pgid: int) -> bool:
    from autotune.backends.process import group_alive  # zombies (nobody reaps them here) do not count

    return group_alive(pgid)


def _kill_9_mid_probe(out: Path, trials: int, per_launch: int) -> int:
    """One finished trial, then a tuner whose probe hangs in step 2 with grandchildren, SIGKILLed: the probe group."""
    first = _tuner(out, trials=1, scenario="ok")
    assert first.wait(timeout=120) == 0
    second = _tuner(out, trials=trials, scenario="spawn", per_launch=per_launch)
    deadline = time.monotonic() + 60
    pgid_files = []
    while time.monotonic() < deadline and not pgid_files:
        pgid_files = list((out / "runs").glob("*/probe.pgid"))
        time.sleep(0.2)
    assert pgid_files, "the probe never started"
    time.sleep(1.0)
    pgid = json.loads(pgid_files[0].read_text())["pgid"]
    os.kill(second.pid, signal.SIGKILL)
    second.wait(timeout=10)
    return pgid


def test_kill_9_mid_probe_then_resume(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    pgid = _kill_9_mid_probe(out, trials=3, per_launch=1)
    assert _group_alive(pgid), "SIGKILL runs no clean-up: the probe group is orphaned until the next run"

    third = _tuner(out, trials=3, scenario="ok")
    assert third.wait(timeout=180) == 0
    assert not _group_alive(pgid), "the new run ended the orphaned probe group"
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{out / 'autotune.db'}")
    states = [t.state for t in study.trials]
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE, "the finished trial survived"
    dead = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(dead) == 1 and "tuner process died mid-trial" in dead[0].user_attrs["reason"]
    assert "was ended" in dead[0].user_attrs["reason"]
    retries = [t for t in study.trials if t.user_attrs.get("retry_of") == dead[0].number]
    assert len(retries) == 1 and retries[0].params == dead[0].params
    assert retries[0].state == optuna.trial.TrialState.COMPLETE
    assert optuna.trial.TrialState.RUNNING not in states


def test_kill_9_mid_shared_launch_then_resume(tmp_path):
    """The same with shared launches (issue 28): the tuner dies while one verl launch measures three configurations
    (the step-switch TEST DOUBLE hangs in step 2). The next run ends the launch's process group, fails every member
    with the reason, retries each, and leaves nothing RUNNING."""
    out = tmp_path / "o"
    out.mkdir()
    pgid = _kill_9_mid_probe(out, trials=4, per_launch=3)
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{out / 'autotune.db'}")
    in_launch = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(in_launch) == 3, "one launch held three configurations"

    third = _tuner(out, trials=7, scenario="ok", per_launch=1)
    assert third.wait(timeout=240) == 0
    assert not _group_alive(pgid), "the new run ended the orphaned launch"
    study = optuna.load_study(study_name="k", storage=f"sqlite:///{out / 'autotune.db'}")
    dead = [t for t in study.trials if t.number in {d.number for d in in_launch}]
    assert all(t.state == optuna.trial.TrialState.FAIL and "tuner process died mid-trial" in t.user_attrs["reason"]
               for t in dead)
    assert any("was ended" in t.user_attrs["reason"] for t in dead), "the launch's own process group was ended"
    for t in dead:
        retries = [r for r in study.trials if r.user_attrs.get("retry_of") == t.number]
        assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE, "the finished trial survived"
    assert optuna.trial.TrialState.RUNNING not in [t.state for t in study.trials]
