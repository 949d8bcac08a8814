"""What a study cost and when it pays back (autotune/storage/tuning_cost.py), and the sim's probe cost against the
real H200 probes it is taken from."""

from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.storage.tuning_cost import describe, launch_overhead_s, payback, planned_steps, tuning_cost

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def _rec(launched=True, wall_s=300.0, step_s=50.0, timed=2, number=0, launch=None):
    return SimpleNamespace(number=number, user_attrs={"launched": launched, "probe_wall_s": wall_s, "step_s": step_s,
                                                      "series": {"perf/throughput": [1.0] * timed},
                                                      **({"launch": launch} if launch else {})})


def test_cost_counts_launched_probes_and_the_timed_steps_share():
    cost = tuning_cost([_rec(), _rec(wall_s=500.0, number=1), _rec(launched=False, number=2)], 8, simulated=False)
    assert cost["probes"] == 2 and cost["launches"] == 2 and cost["gpu_hours"] == pytest.approx(800 * 8 / 3600)
    assert cost["probe_efficiency"] == pytest.approx(200 / 800)


def test_a_shared_launch_is_one_launch_and_its_wall_time_is_counted_once():
    launch = {"run_dir": "/r/trial0003", "trials": [3, 4, 5]}
    recs = [_rec(wall_s=200.0, timed=1, number=n, launch=launch) for n in (3, 4, 5)] + [_rec(number=6)]
    cost = tuning_cost(recs, 1, simulated=False)
    assert cost["probes"] == 4 and cost["launches"] == 2
    assert cost["gpu_hours"] == pytest.approx(900 / 3600) and cost["probe_efficiency"] == pytest.approx(250 / 900)
    assert "over 4 probe(s) in 2 launch(es)" in describe(cost, None)


def test_a_launchs_overhead_is_its_wall_time_less_its_timed_steps_median_over_launches():
    shared = {"run_dir": "/r/trial0003", "trials": [3, 4, 5]}
    recs = ([_rec(wall_s=200.0, timed=1, number=n, launch=shared) for n in (3, 4, 5)]  # 600 s, 150 s timed
            + [_rec(wall_s=400.0, number=6), _rec(wall_s=380.0, number=7)]  # alone: 300 and 280 s of overhead
            + [_rec(wall_s=90.0, timed=0, number=8)])  # failed at start-up: says what a failure costs, left out
    assert launch_overhead_s(recs) == pytest.approx(300.0)  # median of 450, 300, 280
    assert launch_overhead_s([_rec(wall_s=90.0, timed=0)]) is None
    # a wall time shorter than the steps it timed (two clocks that disagree) is no cost: left out
    assert launch_overhead_s([_rec(wall_s=0.3, step_s=3.2, timed=1)]) is None
    assert launch_overhead_s([_rec(wall_s=0.3, step_s=3.2, timed=1, number=1), _rec(wall_s=400.0)]) == 300.0


def test_payback_in_hours_of_the_tuned_run():
    cost = {"gpu_hours": 8.0, "probes": 10, "probe_efficiency": 0.5, "simulated": False}  # 1 hour of an 8-GPU job
    back = payback(cost, world_size=8, speedup=1.25, best_step_s=36.0, planned_steps=4000)
    assert back["pays_back_after_hours"] == pytest.approx(4.0)  # each tuned hour saves a quarter hour
    assert back["planned_run_hours"] == pytest.approx(40.0) and back["saved_hours"] == pytest.approx(10.0 - 1.0)
    line = describe(cost, back)
    assert "pays back after 4.0 hours of training (your run: 4000 steps, 40.0 hours)" in line
    assert "does not pay back" in describe(cost, payback(cost, world_size=8, speedup=0.9, best_step_s=36.0,
                                                         planned_steps=None))
    assert planned_steps({"trainer.total_training_steps": 4000}) == 4000 and planned_steps({}) is None


def test_the_sims_probe_cost_is_the_h200_probes():
    from autotune.backends.sim import SIMULATED_STARTUP_S, SIMULATED_WARMUP_FACTOR
    from autotune.verl.stages import stages_from_log

    complete = [s for s in (stages_from_log(p) for p in sorted(RESULTS.glob("h200-2026-12-03-verl*/trial*-probe.log")))
                if "step2" in s]
    ready = statistics.median(s["ready_to_fit"] for s in complete)
    warmup = statistics.median(s["step1"] - s["ready_to_fit"] for s in complete)
    timed = statistics.median(s["step2"] - s["step1"] for s in complete)
    # plus the 21 s between one probe's last step and the next one's first stamp (benchmarks/probe_stages.py)
    assert SIMULATED_STARTUP_S == pytest.approx(ready + 20.6, abs=1.0)
    assert SIMULATED_WARMUP_FACTOR == pytest.approx(warmup / timed, abs=0.05)


def test_the_largest_repeat_spread_of_a_launch_is_the_noise_the_summary_names():
    first = {"run_dir": "/r/trial0000", "trials": [0, 1], "repeat_spread": 0.05}
    second = {"run_dir": "/r/trial0002", "trials": [2, 3], "repeat_spread": 0.184}
    recs = [_rec(number=0, launch=first), _rec(number=1, launch={**first, "repeat_spread": None}),
            _rec(number=2, launch=second), _rec(number=3, launch={k: v for k, v in second.items() if k != "repeat_spread"})]
    cost = tuning_cost(recs, 1, simulated=False)
    assert cost["repeat_spread"] == 0.184
    assert "moved 18% (speedups below that are within one step's noise)" in describe(cost, None)
    assert tuning_cost([_rec()], 1, simulated=False)["repeat_spread"] is None
    assert "moved" not in describe(tuning_cost([_rec()], 1, simulated=False), None)


def test_the_h200_shared_launch_study_as_stored():
    """The real verl study of 2026-12-05 (benchmarks/verl_h200/README.md, fourth study): 18 configurations in two
    launches; the job's step moved 18.4% between the first launch's start and end."""
    import optuna

    from autotune.storage.records import records

    db = RESULTS / "h200-2026-12-05-verl-shared" / "autotune.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    (summary,) = optuna.get_all_study_summaries(storage)
    cost = tuning_cost(records(optuna.load_study(study_name=summary.study_name, storage=storage)), 1, simulated=False)
    assert (cost["probes"], cost["launches"]) == (18, 2)
    assert cost["probe_efficiency"] == pytest.approx(0.54, abs=0.01) and cost["repeat_spread"] == pytest.approx(0.184, abs=0.001)


def test_the_h100_holdout_study_says_what_its_launches_left_out(tmp_path):
    """The real verl study of 2026-12-07 (benchmarks/results/h100-2026-12-07-holdout-study): its probe efficiency of 30%
    is what the GPU-time member rule chose; 23 untried settings of launch 2's layout were left out as not worth a step,
    and the summary says so."""
    import shutil

    import optuna

    from autotune.storage.records import records

    db = tmp_path / "autotune.db"
    shutil.copy(RESULTS / "h100-2026-12-07-holdout-study" / "autotune.db", db)
    study = optuna.load_study(study_name="qwen2.5-1.5b-1x1-verl", storage=f"sqlite:///{db}")
    cost = tuning_cost(records(study), 1, simulated=False)
    assert (cost["probes"], cost["launches"], cost["settings_left_out"]) == (12, 3, 23)
    assert cost["probe_efficiency"] == pytest.approx(0.30, abs=0.01)
    assert "23 untried setting(s) of launched layouts' per-step knobs were left out as not worth their step" in \
        describe(cost, None)
    assert "left out" not in describe(tuning_cost([_rec()], 1, simulated=False), None)
