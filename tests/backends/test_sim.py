from pathlib import Path

import pytest

from autotune.errors import ProbeOOM
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import ProbePruned, ProbeRequest, get_runner
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload


def _request(model="qwen2.5-7b", gpus=8, **cand):
    return ProbeRequest(model=get_model(model), gpu=get_gpu("H200"), n_gpus=gpus, nodes=1, workload=Workload(),
                        candidate=Candidate(**cand), run_dir=Path("/nonexistent"), warmup_steps=1, timed_steps=2)


def test_sim_result_is_labelled_simulated_and_reports_every_timed_step():
    steps = []
    result = get_runner("sim").probe(_request(), lambda step, tps: steps.append((step, tps)) or False)
    assert result.simulated is True
    assert [s for s, _ in steps] == [2, 3]
    assert result.tokens_per_s_per_gpu > 0 and 0 < result.mfu < 1
    assert set(result.phase_s) == {"gen", "old_log_prob", "ref", "update_actor", "update_weights"}
    assert result.peak_mem_gib < get_gpu("H200").mem_gib


def test_sim_raises_oom_with_the_phase_and_how_far_over():
    req = _request(ppo_micro_batch_size_per_gpu=64, gradient_checkpointing=False)
    with pytest.raises(ProbeOOM) as info:
        get_runner("sim").probe(req, lambda *_: False)
    assert info.value.phase == "update_actor" and info.value.over_gib > 0
    assert "simulated" in str(info.value)


def test_sim_kv_cache_too_small_is_an_oom_in_rollout():
    req = _request(model="qwen2.5-72b", rollout_tp=1, gpu_memory_utilization=0.3)
    with pytest.raises(ProbeOOM, match="No available memory for the cache blocks") as info:
        get_runner("sim").probe(req, lambda *_: False)
    assert info.value.phase == "rollout"


def test_sim_stops_when_the_study_prunes():
    with pytest.raises(ProbePruned) as info:
        get_runner("sim").probe(_request(), lambda step, tps: True)
    assert info.value.step == 2
