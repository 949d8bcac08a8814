"""Where a verl probe's time goes (autotune/verl/stages.py), read from the probe logs of the real H200 studies
(benchmarks/results/h200-2026-12-03-verl*/) and from lines as a live probe sees them."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.verl.stages import StageClock, describe_stages, stage_durations, stages_from_log

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
LOGS = sorted(RESULTS.glob("h200-2026-12-03-verl*/trial*-probe.log"))


def test_the_real_logs_give_every_stage_in_launch_order():
    assert len(LOGS) == 7
    for path in LOGS:
        seconds = stages_from_log(path)
        assert list(seconds)[:7] == ["ray_up", "dataloader", "workers_created", "engines_ready", "vllm_ready",
                                     "rollout_ready", "ready_to_fit"], path
        assert list(seconds.values()) == sorted(seconds.values()), path


def test_the_second_studys_job_probe_read_to_the_second():
    seconds = stages_from_log(RESULTS / "h200-2026-12-03-verl-2" / "trial0-probe.log")
    # Ray's token line 10:24:45.879 is the first stamp; verl's "actor and ref model engine initialized" 10:26:32.580;
    # vLLM's "init engine ... took 14.61 s" 10:28:47; step 2's line follows vLLM's 10:31:37 wake-up line
    assert seconds["engines_ready"] == pytest.approx(106.70, abs=0.01)
    assert seconds["vllm_ready"] == pytest.approx(241.12, abs=0.01)
    assert seconds["step2"] - seconds["step1"] == pytest.approx(54.0, abs=0.01)
    durations = dict(stage_durations(seconds))
    assert durations["engines_ready -> vllm_ready"] == pytest.approx(134.4, abs=0.1)


def test_a_live_clock_stamps_each_stage_once_and_each_step():
    clock = StageClock()
    for at_s, line in enumerate(["2026-12-03 10:24:50,077\tINFO worker.py:2038 -- Started a local Ray instance.",
                                 "(TaskRunnerV1 pid=1) INFO:2026-12-03 10:26:32,580:actor and ref model engine initialized",
                                 "(TaskRunnerV1 pid=1) INFO:x:actor and ref model engine initialized",  # a repeat
                                 "(TaskRunnerV1 pid=1) step:0 - val-core/acc:0.1"]):
        clock.see(line, float(at_s))
    for step, at_s in ((0, 3.0), (1, 4.0), (2, 5.0), (2, 6.0)):  # step 0 is the validation; a step counts once
        clock.see_step(step, at_s)
    assert clock.seconds == {"ray_up": 0.0, "engines_ready": 1.0, "step1": 4.0, "step2": 5.0}
    line = describe_stages({**clock.seconds, "end": 10.0})
    assert line.startswith("ray_up 0 . engines_ready 1 . step1 4 . step2 5 . end 10") and "(last step 1 s, 10% of the probe)" in line
