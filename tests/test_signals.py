"""SIGTERM (a scheduler) and Ctrl-C stop a study cleanly: exit 130, one line, finished trials kept, none left RUNNING."""

import os
import signal
import subprocess
import sys
import time

import optuna
import pytest


def _trial_count(db) -> int:
    """Read-only peek: opening an Optuna storage here would race the tuner creating its tables."""
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT count(*) FROM trials").fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_study_cleanly(tmp_path, sig):
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8",
                             "--backend", "sim", "--trials", "100000", "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    db = out / "autotune.db"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _trial_count(db) >= 5:
            break
        time.sleep(0.3)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == [
        "autotune: interrupted; finished trials are stored, run the same command to resume"]
    study = optuna.load_study(study_name="qwen2.5-7b-1x8-sim", storage=f"sqlite:///{db}")
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.RUNNING not in states
    assert sum(s == optuna.trial.TrialState.COMPLETE for s in states) >= 4
    interrupted = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs["reason"] == "interrupted by the user" for t in interrupted)
