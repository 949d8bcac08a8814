"""benchmarks/verl_h200/dry_run.py: a planned GPU study run on CPU through `autotune run --backend verl`, its
launches by the verl TEST DOUBLE. The H100 recipe's plan (profile_then_launch.sh step 5) resumed from the committed
seed study: launches of at most 16 configurations, the study's 23 trials, the confirmations last in a launch of their
own. How many members each launch takes depends on what the double measures (not verl's numbers)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED_DB = ROOT / "benchmarks" / "results" / "h100-2026-12-07-verl-profile" / "seed_node" / "autotune.db"


def test_the_h100_plan_dry_runs_on_the_seed_study(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_PROFILE_DIR": str(tmp_path / "profiles")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "verl_h200" / "dry_run.py"), "--resume", str(SEED_DB),
         "--out", str(out), "--", "--from", "benchmarks/verl_h200/run_tiny_grpo.sh",  # as the study stored it
         "--model", "qwen2.5-1.5b", "--gpus", "1", "--config",
         "benchmarks/verl_h200/tune_shared_h100.yaml", "--seed", "7", "--trials", "23"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dry run: rc 0;" in proc.stdout
    schedules = [json.loads(p.read_text()) for p in (out / "runs").glob("*/step_schedule.json")]
    assert schedules and all(len(set(s["steps"].values())) <= 16 for s in schedules)
    result = json.loads((out / "result.json").read_text())
    assert result["trials_total"] == 23 and result["tuning_cost"]["launches"] >= 3
    import optuna

    study = optuna.load_study(study_name=result["study"], storage=f"sqlite:///{out / 'autotune.db'}")
    assert [t for t in study.trials if "confirms" in t.user_attrs], "the leaders were probed again"
