import optuna
import pytest

from pathlib import Path

from autotune.search.prescreen import (INITIAL_MARGIN, MAX_UNDER, MemoryGate, dominated_by_fit, dominates_oom,
                                       inferred_oom, known_fit, memory_ratio)
from autotune.spaces.candidate import Candidate

H100_SEED_DB = (Path(__file__).parents[2] / "benchmarks" / "results" / "h100-2026-12-07-verl-profile" / "seed_node"
                / "autotune.db")
BASE = Candidate(ppo_micro_batch_size_per_gpu=8, log_prob_micro_batch_size_per_gpu=16, gpu_memory_utilization=0.5).as_params()


def _with(**kw):
    return {**BASE, **kw}


def test_bigger_micro_batch_dominates_a_cuda_oom():
    assert dominates_oom(_with(ppo_micro_batch_size_per_gpu=16), BASE, "cuda_oom")
    assert dominates_oom(BASE, BASE, "cuda_oom")
    assert not dominates_oom(_with(ppo_micro_batch_size_per_gpu=4), BASE, "cuda_oom")


def test_different_layout_or_flags_infer_nothing():
    assert not dominates_oom(_with(ppo_micro_batch_size_per_gpu=16, gradient_checkpointing=False), BASE, "cuda_oom")
    assert not dominates_oom(_with(ppo_micro_batch_size_per_gpu=16, rollout_tp=4), BASE, "cuda_oom")


def test_one_dimension_down_breaks_dominance():
    assert not dominates_oom(_with(ppo_micro_batch_size_per_gpu=16, gpu_memory_utilization=0.4), BASE, "cuda_oom")


def test_kv_cache_failure_runs_the_other_way_in_gpu_memory_utilization():
    # less share for vLLM and more sequences leave even less KV room, whatever the trainer does
    assert dominates_oom(_with(gpu_memory_utilization=0.4, max_num_seqs=512, gradient_checkpointing=False),
                         BASE, "kv_cache_too_small")
    assert not dominates_oom(_with(gpu_memory_utilization=0.6), BASE, "kv_cache_too_small")
    assert not dominates_oom(_with(gpu_memory_utilization=0.4, rollout_tp=4), BASE, "kv_cache_too_small")


def test_smaller_points_are_known_to_fit():
    assert dominated_by_fit(_with(ppo_micro_batch_size_per_gpu=4), BASE)
    assert not dominated_by_fit(_with(ppo_micro_batch_size_per_gpu=16), BASE)
    # lower gpu_memory_utilization needs less memory but may not hold the KV cache: not known to fit
    assert not dominated_by_fit(_with(gpu_memory_utilization=0.4), BASE)


def test_gate_tightens_after_an_unexpected_oom_and_loosens_after_an_unexpected_fit():
    gate = MemoryGate()
    assert gate.margin == INITIAL_MARGIN and gate.admits(0.95) and not gate.admits(0.97)
    assert gate.learn(0.90, measured_oom=True)  # the model said 90% and it OOMed
    assert not gate.admits(0.90) and gate.admits(0.88)
    assert not gate.learn(0.95, measured_oom=True), "an OOM the gate would have rejected teaches nothing"
    loose = MemoryGate(margin=0.05)
    assert loose.learn(1.048, measured_oom=False)  # predicted 4.8% over, at the gate's edge, and it fitted
    assert loose.admits(1.055) and loose.margin == pytest.approx(0.058)
    assert not MemoryGate().learn(0.5, measured_oom=False)


def _study_with(state, cand, **attrs):
    study = optuna.create_study(directions=["maximize"])
    trial = study.ask()
    trial.set_user_attr("state", state)
    trial.set_user_attr("candidate", cand)
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    trial.set_constraint("memory", 3.0 if state == "oom" else 0.0)
    study.tell(trial, 0.0)
    return study


def test_inference_reads_only_measured_trials_of_the_study():
    study = _study_with("oom", BASE, oom_kind="cuda_oom", oom_phase="update_actor")
    assert inferred_oom(_with(ppo_micro_batch_size_per_gpu=32), study).number == 0
    assert inferred_oom(_with(ppo_micro_batch_size_per_gpu=2), study) is None
    inferred_only = _study_with("inferred_oom", BASE)
    assert inferred_oom(_with(ppo_micro_batch_size_per_gpu=32), inferred_only) is None
    fitted = _study_with("simulated", BASE)
    assert known_fit(_with(ppo_micro_batch_size_per_gpu=2), fitted).number == 0


def test_memory_ratio_folds_in_a_kv_shortfall():
    from types import SimpleNamespace
    mem = SimpleNamespace(peak_gib=70.0, capacity_gib=140.0, kv_cache_gib=-4.0, kv_cache_needed_gib=10.0)
    assert memory_ratio(mem) == pytest.approx(1.1)
    mem.kv_cache_gib = 20.0
    assert memory_ratio(mem) == pytest.approx(0.5)


def test_a_fit_that_peaked_above_its_prediction_tightens_the_gate_for_what_comes_near_capacity():
    gate = MemoryGate()
    assert gate.admits(0.95)
    assert gate.learn(0.86, measured_oom=False, measured_over_predicted=1.11)  # H100: 76.2 GiB measured for 68.6
    assert gate.under == pytest.approx(1.11) and not gate.admits(0.95) and gate.admits(0.86)
    assert "x 1.11 measured under-prediction" in gate.describe(0.95)
    assert not gate.learn(0.5, measured_oom=False, measured_over_predicted=0.9), "an over-prediction loosens nothing"
    assert gate.learn(0.5, measured_oom=False, measured_over_predicted=3.0) and gate.under == MAX_UNDER


def test_the_gate_learned_from_the_h100_seed_studys_real_peaks_keeps_a_probe_the_model_put_at_96_percent_back():
    """The committed H100 study (real verl, 2026-12-07): its probes peaked up to 1.11x the model's prediction, and
    a lead the model put at 76.2 of 79.6 GiB (ratio 0.957, admitted before) would have been launched into an OOM."""
    study = optuna.load_study(study_name="qwen2.5-1.5b-1x1-verl", storage=f"sqlite:///{H100_SEED_DB}")
    gate = MemoryGate()
    for t in study.trials:
        ua = t.user_attrs
        if ua.get("state") == "measured":
            gate.learn(ua["predicted_memory_ratio"], measured_oom=False,
                       measured_over_predicted=ua["peak_mem_gib"] / ua["predicted_peak_gib"])
    assert 1.10 < gate.under < 1.12
    assert not gate.admits(0.957)
    assert gate.admits(study.trials[0].user_attrs["predicted_memory_ratio"]), "the job (59.6 GiB) is far from it"
    # the micro-batch-32 probes themselves peaked at 76.2-76.5 GiB, 96% of the card: the gate's edge, where only a
    # measured fit (the OOM boundaries' known_fit) lets a configuration through
    edge = study.trials[2].user_attrs
    assert edge["peak_mem_gib"] / 79.6 > 0.96 and not gate.admits(edge["predicted_memory_ratio"])


def test_a_study_on_a_profiled_node_gates_its_first_candidates_by_what_earlier_fits_peaked_above_the_model():
    """The H100's profile (its seed study's fits peaked up to 1.115x the model): a new study's gate holds back the
    probe the model put at 96% before any probe of its own, as the seed study's gate did only after its first
    launch; a profile's factor is capped as a study's own readings are."""
    from autotune.storage.node_profile import PROFILE_ATTR

    study = optuna.create_study()
    assert MemoryGate.of(study).admits(0.957)
    study.set_user_attr(PROFILE_ATTR, {"id": "H100-80GB-verl-x", "phases": {}, "peak_under": 1.115})
    gate = MemoryGate.of(study)
    assert gate.under == pytest.approx(1.115) and not gate.admits(0.957) and gate.admits(0.85)
    study.set_user_attr(PROFILE_ATTR, {"none": "the first study on this kind of node"})
    assert MemoryGate.of(study).under == 1.0
    study.set_user_attr(PROFILE_ATTR, {"id": "x", "phases": {}, "peak_under": 2.2})
    assert MemoryGate.of(study).under == MAX_UNDER
