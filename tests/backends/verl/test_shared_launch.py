"""Shared launches (issue 28 item 2) end to end against a TEST DOUBLE of autotune's step-switch entry point
(tests/backends/verl/verl_double/step_switch_double.py): VerlRunner writes the schedule and launches; the double
does what autotune/verl/step_switch.py does in verl's trainer (record each switch, announce it) and logs steps."""

import json
import os
from pathlib import Path

import pytest

from autotune.backends.base import ProbeRequest, ProbeResult
from autotune.backends.verl.runner import ProbeLimits, VerlRunner
from autotune.backends.verl.shared_launch import plan_steps, read_switches
from autotune.errors import ProbeCrashed, ProbeOOM, ProbeRejected
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.verl.step_knobs import restart_key
from autotune.workload import Workload

DOUBLE = Path(__file__).parent / "verl_double"


def _request(tmp_path, n, micro, **changes) -> ProbeRequest:
    return ProbeRequest(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), n_gpus=8, nodes=1, workload=Workload(),
                        candidate=Candidate(ppo_micro_batch_size_per_gpu=micro, **changes),
                        run_dir=tmp_path / f"trial{n}", trial_number=n, warmup_steps=1, timed_steps=1)


def _runner(**env) -> VerlRunner:
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env}
    return VerlRunner(limits=ProbeLimits(deadline_s=60, idle_timeout_s=30, kill_grace_s=2), env=env,
                      shared_entry="step_switch_double")


def _launches(tmp_path):
    return [json.loads(line) for line in (tmp_path / "launches.jsonl").read_text().splitlines()]


def test_one_launch_measures_every_configuration_on_its_own_steps(tmp_path):
    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 4), (5, 8))]
    reported = []
    reports = [lambda step, tps, n=r.trial_number: reported.append((n, step, tps)) or True for r in requests]
    outcomes = _runner().probe_group(requests, reports)
    assert len(_launches(tmp_path)) == 1
    assert all(isinstance(o, ProbeResult) for o in outcomes)
    # step 1 is the first configuration's warm-up, then one timed step each, then the first one's again (its
    # spread measures a step's noise within the launch); throughput follows the micro-batch
    assert [o.tokens_per_s_per_gpu for o in outcomes] == [1020.0, 1040.0, 1080.0]
    assert [o.extra["launch"]["steps"] for o in outcomes] == [[2, 5], [3], [4]]
    assert outcomes[0].extra["launch"]["repeat_spread"] == 0.0
    assert sorted(reported) == [(3, 2, 1020.0), (3, 5, 1020.0), (4, 3, 1040.0), (5, 4, 1080.0)]  # never pruned
    # each configuration's memory is its own steps' (the first one's includes the warm-up it ran)
    assert [o.extra["verl_max_allocated_gib"] for o in outcomes] == [12.0, 14.0, 18.0]
    walls = [o.extra["probe_wall_s"] for o in outcomes]
    assert walls[0] == walls[1] == walls[2] and sum(walls) == pytest.approx(outcomes[0].extra["launch"]["wall_s"], abs=0.05)
    schedule = json.loads((tmp_path / "trial3" / "step_schedule.json").read_text())
    assert schedule["steps"] == {"1": 0, "2": 0, "3": 1, "4": 2, "5": 0} and schedule["trials"] == [3, 4, 5]
    assert schedule["configs"][2]["actor"]["micro_batch_size_per_gpu"] == 8
    argv = _launches(tmp_path)[0]["argv"]
    assert "trainer.v1.trainer_mode=autotune_step_switch" in argv and "trainer.total_training_steps=5" in argv
    assert read_switches(tmp_path / "trial3" / "step_schedule.json.switches.jsonl") == {1: 0, 2: 0, 3: 1, 4: 2, 5: 0}


def test_members_are_scored_at_the_launchs_rollout_and_keep_verls_own_figures(tmp_path):
    """verl times gen on a 2-s poll grid (autotune/verl/metrics.py REPLAY_POLL_S): the member whose step drew a 4.1 s
    rollout would rank below a slower one that drew 2.1 s. Scored at the launch's median rollout, the ranking follows
    the switched micro-batch; verl's per-step figures stay in the series and the raw score in the launch record."""
    from autotune.verl.metrics import LAUNCH_ROLLOUT_KEY

    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 8), (5, 4))]
    reports = [lambda step, tps: True for _ in requests]
    outcomes = _runner(AUTOTUNE_DOUBLE_GEN="6.1,2.1,4.1,2.1,4.1").probe_group(requests, reports)
    raw = [o.extra["launch"]["measured_tokens_per_s_per_gpu"] for o in outcomes]
    scored = [o.tokens_per_s_per_gpu for o in outcomes]
    assert raw[1] < raw[0]  # micro 8 drew the slow poll and measured below micro 2
    assert scored[0] < scored[2] < scored[1]  # at one rollout: micro 2 < 4 < 8
    train = {micro: 8.0 / (1 + micro / 100) for micro in (2, 4, 8)}
    assert scored[1] == pytest.approx(8000 / (3.1 + train[8]))  # the median of the timed steps' gen: 3.1 s
    assert all(o.extra["launch"]["rollout_gen_s"] == 3.1 for o in outcomes)
    assert outcomes[1].series["perf/throughput"] == [pytest.approx(8000 / (4.1 + train[8]))]
    assert outcomes[1].series[LAUNCH_ROLLOUT_KEY] == [pytest.approx(scored[1])]
    # the repeat of the first at the launch's end drew another rollout: its spread is the poll grid's alone
    assert outcomes[0].extra["launch"]["repeat_spread"] > 0.1
    assert outcomes[0].extra["launch"]["repeat_spread_at_launch_rollout"] == 0.0


def test_an_oom_in_the_middle_marks_that_configuration_and_a_new_launch_measures_the_rest(tmp_path):
    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 16), (5, 8))]
    outcomes = _runner(AUTOTUNE_DOUBLE_OOM_MICRO="16").probe_group(requests, [lambda *_: False] * 3)
    assert isinstance(outcomes[0], ProbeResult) and outcomes[0].tokens_per_s_per_gpu == 1020.0
    assert isinstance(outcomes[1], ProbeOOM)
    assert isinstance(outcomes[2], ProbeResult) and outcomes[2].tokens_per_s_per_gpu == 1080.0
    launches = _launches(tmp_path)
    assert [Path(la["run_dir"]).name for la in launches] == ["trial3", "trial5"]  # the relaunch starts at trial 5
    # the second launch warms up again: its configuration's result is its timed step, not the cold one
    assert outcomes[2].extra["launch"]["steps"] == [2]
    # GPU time: the first launch's is shared by the two it decided, the second's is trial 5's alone
    assert outcomes[1].probe_wall_s == outcomes[0].extra["probe_wall_s"] > 0


def test_a_step_the_workers_did_not_switch_for_is_never_credited(tmp_path):
    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 4))]
    outcomes = _runner(AUTOTUNE_DOUBLE_NO_SWITCH="1").probe_group(requests, [lambda *_: False] * 2)
    assert all(isinstance(o, ProbeCrashed) and "step switch" in str(o) for o in outcomes)


def test_configurations_of_different_restart_keys_never_share_a_launch(tmp_path):
    a, b = _request(tmp_path, 1, 2), _request(tmp_path, 2, 2, gradient_checkpointing=False)
    assert restart_key(a.candidate) != restart_key(b.candidate)
    with pytest.raises(ValueError, match="restart key"):
        _runner().probe_group([a, b], [lambda *_: False] * 2)


def test_the_plan_warms_up_once_then_times_each_configuration():
    requests = [ProbeRequest(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), n_gpus=8, nodes=1,
                             workload=Workload(), candidate=Candidate(), run_dir=Path("."), warmup_steps=2,
                             timed_steps=t) for t in (1, 2, 1)]
    assert plan_steps(requests) == [0, 0, 0, 1, 1, 2, 0]  # the first one again at the end
    assert plan_steps(requests[:2]) == [0, 0, 0, 1, 1]


def test_a_job_on_another_trainer_is_probed_launch_by_launch():
    runner = VerlRunner()
    req = lambda passthrough: ProbeRequest(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), n_gpus=8, nodes=1,
                                           workload=Workload(), candidate=Candidate(), run_dir=Path("."),
                                           passthrough=passthrough)
    assert runner.can_share(req({}))
    assert not runner.can_share(req({"trainer.use_v1": False}))
    assert not runner.can_share(req({"trainer.v1.trainer_mode": "separate_async"}))


def test_a_crash_in_the_middle_ends_the_group_without_another_launch(tmp_path):
    """Only an OOM is one configuration's alone; a crash would likely end the next launch too."""
    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 16), (5, 8))]
    outcomes = _runner(AUTOTUNE_DOUBLE_OOM_MICRO="16", AUTOTUNE_DOUBLE_FAIL="nccl").probe_group(
        requests, [lambda *_: False] * 3)
    assert isinstance(outcomes[0], ProbeResult)
    assert isinstance(outcomes[1], ProbeCrashed) and outcomes[2] is outcomes[1]
    assert len(_launches(tmp_path)) == 1


@pytest.mark.parametrize("kind, error, relaunched", [("kv_cache_too_small", ProbeOOM, False),
                                                     ("config_rejected", ProbeRejected, True)])
def test_a_start_up_failure_is_every_members_unless_verl_refused_the_launchs_own_config(tmp_path, kind, error,
                                                                                         relaunched):
    requests = [_request(tmp_path, n, micro) for n, micro in ((3, 2), (4, 4))]
    outcomes = _runner(AUTOTUNE_DOUBLE_STARTUP_FAIL=kind).probe_group(requests, [lambda *_: False] * 2)
    assert isinstance(outcomes[0], error)
    assert isinstance(outcomes[1], error)  # the relaunch, if any, fails the same way in this double
    assert len(_launches(tmp_path)) == (2 if relaunched else 1)


def test_each_configuration_reads_the_gpu_peak_of_its_own_steps_only(tmp_path):
    """The first configuration runs first and again last; the GPU samples between are the members'. A 2026-12-05
    H200 launch stored the job's peak as 131.4 GiB, a member's; over its own steps the job held 90.0."""
    from autotune.backends.gpu_monitor import GpuSample
    from autotune.backends.verl.runner import StepStream, result_of
    from autotune.backends.verl.shared_launch import _result
    from autotune.verl.metrics import StepMetrics

    stream = StepStream(tmp_path / "metrics.jsonl", warmup_steps=1, report=lambda *_: False)
    stream.started_s = 0.0
    plan = [0, 0, 1, 0]  # warm-up, the first's timed step, the member, the first's repeat
    for step, (arrived, switched) in enumerate(((100, 5), (140, 101), (180, 141), (220, 181)), start=1):
        stream.steps[step] = StepMetrics(step, {"perf/throughput": 1000.0, "timing_s/step": 40.0,
                                                "perf/total_num_tokens": 40000})
        stream.arrived_s[step], stream.switched[step] = arrived, (plan[step - 1], switched)
    memory = {range(0, 141): 90.0, range(141, 181): 131.4, range(181, 221): 89.9}
    samples = [GpuSample(t, 0, 100.0, next(m for r, m in memory.items() if t in r)) for t in range(0, 221)]
    requests = [_request(tmp_path, n, micro) for n, micro in ((0, 4), (1, 64))]
    first, member = (_result(i, own, plan, 1, stream, samples, tmp_path, requests, tmp_path / "probe.log", 220.0,
                             result_of) for i, own in ((0, [2, 4]), (1, [3])))
    assert first.peak_mem_gib == 90.0 and member.peak_mem_gib == 131.4
