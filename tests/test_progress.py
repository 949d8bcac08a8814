"""The live progress display: plain lines off a terminal, a rich panel on one; never an infeasible 'best'."""

import io

import optuna
import pytest
from optuna.trial import TrialState
from rich.console import Console

from autotune.progress import RunProgress

DIST = {"rollout_tp": optuna.distributions.CategoricalDistribution([1, 2, 4])}


def _trial(number, state, *, tps=None, baseline=False, feasible=True, optuna_state=TrialState.COMPLETE,
           reason="r"):
    attrs = {"state": state, "reason": reason, "feasible": feasible, "baseline": baseline,
             "candidate": {}, "peak_mem_gib": 50.0, "mfu": 0.3}
    if tps is not None:
        attrs["tokens_per_s_per_gpu"] = tps
    value = (tps or 0.0) if optuna_state == TrialState.COMPLETE else None
    t = optuna.trial.create_trial(state=optuna_state, value=value, params={"rollout_tp": 2}, distributions=DIST,
                                  user_attrs=attrs)
    t.number = number
    return t


TRIALS = [
    _trial(0, "simulated", tps=1000.0, baseline=True),
    _trial(1, "rejected", reason="megatron_vpp_layout: needs pp > 1", feasible=False),
    _trial(2, "oom", tps=99999.0, feasible=False, reason="CUDA out of memory"),  # placeholder must never win
    _trial(3, "simulated", tps=1500.0),
    _trial(4, "pruned", optuna_state=TrialState.PRUNED, reason="pruned at step 2"),
    _trial(5, "failed", optuna_state=TrialState.FAIL, reason="ProbeCrashed: segfault"),
]


def _plain_console():
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=100), buf


def test_plain_lines_off_a_terminal():
    console, buf = _plain_console()
    with RunProgress(10, study_name="s1", simulated=True, warmup_steps=1, console=console) as progress:
        assert not progress.live_mode
        for t in TRIALS[:3]:
            progress.on_trial(t)
        progress.on_step(3, 1, 1200.0)
        progress.on_step(3, 2, 1400.0)  # within step_interval_s of the previous step line: not printed
        for t in TRIALS[3:]:
            progress.on_trial(t)
    lines = buf.getvalue().splitlines()
    assert "\x1b[" not in buf.getvalue()
    assert lines[0].startswith("[1/10] trial   0 (baseline) simulated")
    assert lines[1].startswith("[2/10] trial   1 rejected  megatron_vpp_layout")
    assert lines[3] == "  trial 3 warm-up step 1: 1200 tok/s/GPU"
    assert sum("step" in line and line.startswith("  trial") for line in lines) == 1
    assert lines[-1] == ("s1: 6/10 trials done SIMULATED; best 1500 tok/s/GPU (trial 3), x1.50 vs verl default; "
                         "failures: rejected 1, oom 1, inferred_oom 0, pruned 1, failed 1")


def test_step_lines_are_rate_limited_not_dropped():
    console, buf = _plain_console()
    with RunProgress(5, console=console, step_interval_s=0.0) as progress:
        progress.on_step(7, 1, 800.0, phase="update_actor")
        progress.on_step(7, 2, 900.0)
    out = buf.getvalue().splitlines()
    assert out[:2] == ["  trial 7 update_actor step 1: 800 tok/s/GPU", "  trial 7 step 2: 900 tok/s/GPU"]


def test_quiet_prints_no_trial_lines():
    console, buf = _plain_console()
    with RunProgress(6, console=console, quiet=True) as progress:
        for t in TRIALS:
            progress.on_trial(t)
        progress.on_step(9, 3, 1.0)
    assert buf.getvalue() == ""
    assert progress.done == 6 and progress.best.number == 3


def test_live_panel_on_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140, color_system=None)
    with RunProgress(8, study_name="live-study", simulated=True, warmup_steps=1, console=console) as progress:
        assert progress.live_mode
        progress.on_trial(TRIALS[0])
        progress.on_step(1, 2, 1234.0)
        snapshot = Console(file=io.StringIO(), width=140, record=True)
        snapshot.print(progress)
        panel = snapshot.export_text()
        for t in TRIALS[1:4]:
            progress.on_trial(t)
    assert "live-study (SIMULATED" in panel
    assert "1/8" in panel and "current probe" in panel and "trial 1, timed step 2: 1234 tok/s/GPU" in panel
    final = buf.getvalue()
    assert "[4/8] trial   3" in final and "4/8" in final
    assert "1500 tok/s/GPU (trial 3), x1.50 vs verl default" in final
    assert "rejected 1, oom 1, inferred_oom 0, pruned 0, failed 0" in final


def test_preload_counts_a_resumed_study_silently():
    console, buf = _plain_console()
    progress = RunProgress(12, console=console, quiet=False)
    progress.preload(TRIALS)
    assert buf.getvalue() == ""
    assert progress.done == 6
    assert progress.best.number == 3 and progress.baseline.number == 0
    assert dict(progress.failures) == {"rejected": 1, "oom": 1, "pruned": 1, "failed": 1}


def test_total_must_be_positive():
    with pytest.raises(ValueError, match="total_trials=0"):
        RunProgress(0)
