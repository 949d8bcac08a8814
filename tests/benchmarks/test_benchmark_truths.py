"""The search benchmark's truths keep the exact optimum exact, and the benchmark runs end to end (CI-sized)."""

import sys
from pathlib import Path

import math

import pytest

from autotune.spaces.candidate import Candidate
from autotune.spaces.space import SearchSpace
from autotune.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import search_efficiency as se  # noqa: E402
from optimum import _values, exact_optimum  # noqa: E402
from small_space import SMALL, each_point  # noqa: E402  (tests/benchmarks/small_space.py)
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

TINY = se.Job("tiny-7b-x8", "qwen2.5-7b", 8, 1, Workload(), SMALL["ranges"])


def _space() -> SearchSpace:
    return SearchSpace.build(se.get_model(TINY.model), TINY.workload, gpus_per_node=8, nodes=1,
                             fixed=SMALL["fixed"], ranges=SMALL["ranges"])


def _brute_force(machine: Machine, space: SearchSpace) -> float:
    best = 0.0
    names = list(space.domains)
    for values, active in each_point(space, TINY.workload, _values):
        neutral = {n: getattr(Candidate(), n) for n in names if n not in active}
        if values["actor_engine"] != "megatron":
            neutral["cuda_device_max_connections"] = 0
            neutral.update({n: 1 for n in ("actor_tp", "actor_pp", "actor_vpp", "actor_cp") if n in names})
        best = max(best, machine.truth(Candidate(**{**values, **neutral}), TINY.workload))
    return best


@pytest.mark.parametrize("truth", ["layout_sigma0.25", "quirk_sigma0.15", "preemption", "fragmentation", "tp_comm",
                                   "rollout_tp"])
def test_exact_optimum_under_each_truth_equals_brute_force(truth):
    machine = Machine(TINY, TRUTH_BY_NAME[truth], machine_seed=1, run_seed=0)
    space = _space()
    opt = exact_optimum(machine.model, machine.gpu, TINY.workload, space, gpus_per_node=8, nodes=1,
                        evaluator=machine.ev)
    assert opt is not None
    assert opt.tokens_per_s_per_gpu == pytest.approx(_brute_force(machine, space), rel=1e-9)


def test_structural_truths_change_what_the_model_predicts():
    cand = Candidate(actor_engine="megatron", actor_tp=4, rollout_tp=4, cuda_device_max_connections=1)
    steps = {name: Machine(TINY, TRUTH_BY_NAME[name], 0, 0).ev(cand)[2].phase_s
             for name in ("rescaled", "tp_comm", "fast_engine", "rollout_tp")}
    assert steps["tp_comm"]["update_actor"] == pytest.approx(steps["rescaled"]["update_actor"] * (1 + 0.05 * (8 - 1)))
    assert steps["fast_engine"]["update_actor"] == pytest.approx(steps["rescaled"]["update_actor"] / 1.2)
    assert steps["rollout_tp"]["gen"] == pytest.approx(steps["rescaled"]["gen"] * 4 ** 0.25)


def test_the_quirk_truth_gives_each_flag_that_is_on_its_own_factor():
    """Issue 34: per-flag quirks beside the layout's: turning a flag on moves the training phases by that machine's
    factor for the flag, the same for every layout."""
    base = Candidate(gradient_checkpointing=False, use_liger=False)
    machine = Machine(TINY, TRUTH_BY_NAME["quirk_sigma0.15"], machine_seed=3, run_seed=0)
    plain = Machine(TINY, TRUTH_BY_NAME["layout_sigma0.15"], machine_seed=3, run_seed=0)
    ratios = []
    for cand in (base, base.with_(actor_engine="fsdp2")):
        on = cand.with_(use_liger=True)
        quirk = machine.ev(on)[2].phase_s["update_actor"] / machine.ev(cand)[2].phase_s["update_actor"]
        layout = plain.ev(on)[2].phase_s["update_actor"] / plain.ev(cand)[2].phase_s["update_actor"]
        ratios.append(quirk / layout)
    assert ratios[0] == pytest.approx(ratios[1]) and abs(math.log(ratios[0])) > 1e-6


def test_benchmark_smoke_every_method_spends_its_budget(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the benchmark's studies live in memory: nothing may land in the current folder
    monkeypatch.setitem(se.JOB_BY_NAME, TINY.name, TINY)
    monkeypatch.setattr(se, "space_of", lambda job: _space())
    rows = se.run_unit((TINY.name, "layout_sigma0.15", 0, (0,), 4, se.METHODS))
    assert {r["method"] for r in rows} == set(se.METHODS)
    for r in rows:
        assert len(r["best_true"]) <= 4 and all(0 <= v <= r["optimum"] * (1 + 1e-9) for v in r["best_true"])
    summary = se.summarise(rows, 4)
    assert {s["method"] for s in summary} == set(se.METHODS)
    assert list(tmp_path.iterdir()) == []  # once: unused.db.lock, SQLite's single-writer lock for a relative URL


def test_a_constant_added_to_the_model_leaves_every_machines_other_constants_as_they_were(monkeypatch):
    # a shared draw sequence re-drew every machine when fused_chunk_bytes joined the activation constants
    # (2026-12-06): the same machine numbers were other machines before and after
    from dataclasses import asdict, dataclass, replace

    import truths
    from autotune.model.calibration import DEFAULT_CONSTANTS, ActivationConstants

    @dataclass(frozen=True, kw_only=True)
    class WithOneMore(ActivationConstants):
        a_new_bytes: float = 1.0

    before = [truths.perturbed(seed) for seed in (0, 90, 91)]
    grown = replace(DEFAULT_CONSTANTS, activations=WithOneMore(**asdict(DEFAULT_CONSTANTS.activations)))
    monkeypatch.setattr(truths, "DEFAULT_CONSTANTS", grown)
    after = [truths.perturbed(seed) for seed in (0, 90, 91)]
    for old, new in zip(before, after):
        assert asdict(new.activations) | asdict(old.activations) == asdict(new.activations)  # old fields unchanged
        for group in ("throughput", "rollout", "system"):
            assert getattr(new, group) == getattr(old, group)
        assert new.activations.a_new_bytes != 1.0  # the new one is perturbed too
    assert before[1] != before[2]  # machines still differ


def test_a_truth_machines_shared_launch_has_one_start_up_and_one_noise_draw_for_its_members():
    """benchmarks/launch_size.py: with `share` on, a launch of several configurations costs one start-up and warm-up
    and one launch-level noise factor (what the node and its processes add), not one per member."""
    from dataclasses import replace

    from autotune.backends.base import ProbeRequest
    from autotune.backends.sim import SIMULATED_STARTUP_S, SIMULATED_WARMUP_FACTOR
    from autotune.hardware import get_gpu

    machine = Machine(TINY, TRUTH_BY_NAME["layout_sigma0.15"], 3, run_seed=3, probe_sigma=0.3)
    runner = machine.runner
    assert not runner.can_share(None), "off unless a benchmark asks for shared launches"
    runner.share = True
    base = ProbeRequest(model=se.get_model(TINY.model), gpu=get_gpu("H200"), n_gpus=8, nodes=1, workload=TINY.workload,
                        candidate=Candidate(ppo_micro_batch_size_per_gpu=2), run_dir=Path("/nonexistent"),
                        warmup_steps=1, timed_steps=1)
    requests = [base, replace(base, candidate=Candidate(ppo_micro_batch_size_per_gpu=4))]
    separate = [machine.truth(r.candidate, TINY.workload) for r in requests]
    outcomes = runner.probe_group(requests, [lambda step, tps: False] * 2)
    ratios = [o.tokens_per_s_per_gpu / s for o, s in zip(outcomes, separate)]
    assert abs(math.log(ratios[0] / ratios[1])) < 0.15, "one launch factor (sigma 0.3) on both, 3% step noise apart"
    wall_s = sum(o.extra["probe_wall_s"] for o in outcomes)
    steps_s = [o.step_s for o in outcomes]
    one_launch_s = SIMULATED_STARTUP_S + SIMULATED_WARMUP_FACTOR * steps_s[0] + sum(steps_s)
    assert wall_s == pytest.approx(one_launch_s, rel=0.02), "one start-up and one warm-up for the launch"
