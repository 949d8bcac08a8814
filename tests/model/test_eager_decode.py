"""vLLM's eager decode and verl's rollout poll in the time model (model/cost.py _rollout_s), against real verl runs:
fitted on the 2026-12-05 H200 study, checked on rows it was not fitted on (benchmarks/fit_eager_decode.py,
benchmarks/heldout_job_h200.py)."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.hardware import get_gpu
from autotune.model.calibration import DEFAULT_CONSTANTS
from autotune.model.cost import estimate_step_time
from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.verl.rollout import vllm_eager
from autotune.workload import Workload

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
Q15, H200 = get_model("qwen2.5-1.5b"), get_gpu("H200")


@pytest.fixture
def bench_path():
    sys.path.insert(0, str(BENCHMARKS))
    yield
    sys.path.remove(str(BENCHMARKS))


def test_the_job_says_whether_vllm_runs_eager():
    assert vllm_eager({"actor_rollout_ref.rollout.enforce_eager": True})
    assert vllm_eager({"actor_rollout_ref.rollout.enforce_eager": "True"})  # as a launch script writes it
    assert not vllm_eager({"actor_rollout_ref.rollout.enforce_eager": False})
    assert not vllm_eager({})  # verl's default: CUDA graphs (rollout.yaml:52)


def test_eager_adds_the_host_launches_of_every_layer_at_every_decode_step():
    workload = Workload(train_batch_size=32, rollout_n=4, ppo_mini_batch_size=16, max_prompt_length=256,
                        max_response_length=512)
    cand = Candidate(rollout_tp=1, max_num_seqs=256)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
    graphs = estimate_step_time(Q15, H200, workload, cand, layout).phase_s["gen"]
    eager = estimate_step_time(Q15, H200, workload, cand, layout, vllm_eager=True).phase_s["gen"]
    # 128 responses that all run to 512 tokens fit one wave: 512 decode steps x 28 layers
    assert eager - graphs == pytest.approx(512 * Q15.num_layers * DEFAULT_CONSTANTS.rollout.eager_decode_s_per_layer)
    free = replace(DEFAULT_CONSTANTS, rollout=replace(DEFAULT_CONSTANTS.rollout, verl_poll_wait_s=0.0))
    assert graphs - estimate_step_time(Q15, H200, workload, cand, layout, constants=free).phase_s["gen"] == pytest.approx(1.0)


def test_the_constant_is_what_its_fit_gives_on_the_committed_study(bench_path, capsys):
    import fit_eager_decode

    fit_eager_decode.main()
    out = capsys.readouterr().out
    fitted = float(out.split("eager_decode_s_per_layer = ")[1].split(" ms")[0]) * 1e-3
    assert fitted == pytest.approx(DEFAULT_CONSTANTS.rollout.eager_decode_s_per_layer, abs=1e-6)


def test_held_out_gen_of_the_eager_job_on_another_h200(bench_path):
    # 2026-12-03, not fitted on: max_num_seqs 256 and 128 within 1.25x (x0.37 and x0.45 before); 1024 ran 4 s
    # slower on the same job (16.2 s), which the model does not explain (x0.75)
    from sim_vs_verl_h200 import study_row

    ratios = {}
    for trial in (0, 1, 2):
        m, workload, cand = study_row("h200-2026-12-03-verl-2", trial)
        layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
        gen = estimate_step_time(Q15, H200, workload, cand, layout, vllm_eager=True).phase_s["gen"]
        ratios[cand.max_num_seqs] = gen / m["timing_s/gen"]
    assert all(1 / 1.25 <= ratios[s] <= 1.25 for s in (256, 128)) and 0.6 < ratios[1024] < 0.8


def test_issue_29s_held_out_job_is_predicted_within_its_goal_before_any_probe(bench_path, capsys):
    # real verl on an H200, measured by the issue's author; the model then said gen 7.5, old_log_prob 1.7, update 13.4
    # (x0.16 and x0.37); now the loop and the poll are priced, and the job runs CUDA graphs
    import heldout_job_h200

    heldout_job_h200.main()
    out = capsys.readouterr().out
    for phase in ("gen", "old_log_prob", "update_actor", "step"):
        line = next(l for l in out.splitlines() if l.startswith(phase + " "))
        now = float(line.split("(x")[2].split(")")[0])  # the model now, without the profile
        assert 1 / 1.25 <= now <= 1.25, line
