"""Node profiles (issue 29 item 4): the key, the file, and a resumed study's rows counted once."""

import json
import math

import pytest

from autotune.storage.node_profile import (NodeKind, NodeProfile, attention_of, describe_summary, detect_kind,
                                           load_profile, profile_path, profile_row, record_study)

H200 = NodeKind(gpu="H200", driver="580.159.04", torch="2.11.0+cu130", vllm="0.24.0", verl="0.9.1",
                attention="sdpa", backend="verl")


@pytest.fixture(autouse=True)
def profile_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_PROFILE_DIR", str(tmp_path / "profiles"))
    return tmp_path / "profiles"


def test_any_difference_in_the_node_kind_is_another_profile():
    from dataclasses import replace

    others = [replace(H200, verl="0.9.2"), replace(H200, attention="flash_attention_2"), replace(H200, vllm="0.25.0"),
              replace(H200, driver="575.57.08"), replace(H200, backend="torch"), replace(H200, gpu="H100-80GB"),
              replace(H200, rows="2026-01-01")]
    assert len({H200.id, *(k.id for k in others)}) == 1 + len(others)
    record_study(H200, "s@1", {"gen": [math.log(3.0)] * 2}, [0.7], 2)
    assert load_profile(H200) is not None
    assert all(load_profile(k) is None for k in others)


def test_a_study_is_recorded_reloaded_and_replaced_on_resume_not_counted_twice(profile_dir):
    path = record_study(H200, "s@1", {"gen": [math.log(3.0), math.log(3.4)], "update_actor": [math.log(5.0)] * 3},
                        [0.5, 0.9], 3)
    assert path == profile_path(H200) and path.parent == profile_dir
    profile = load_profile(H200)
    assert profile.probes == 3
    prior = profile.prior()
    assert math.exp(prior["phases"]["gen"]["log_mean"]) == pytest.approx(math.sqrt(3.0 * 3.4))
    assert prior["other_s"] == pytest.approx(0.7)
    record_study(H200, "s@1", {"gen": [math.log(3.0)] * 5}, [], 5)  # the same study, resumed: its rows replaced
    record_study(H200, "t@2", {"gen": [math.log(4.0)] * 2}, [], 2)
    again = load_profile(H200)
    assert again.probes == 7 and len(again.rows("gen")) == 7 and again.rows("update_actor") == []
    summary = again.summary()
    assert summary["id"] == H200.id and summary["studies"] == 2
    assert describe_summary(summary).startswith(f"node profile {H200.id}: 7 measured probe(s) of 2 earlier study")
    assert "gen x3.00" in describe_summary(summary)


def test_an_eager_jobs_gen_rows_are_not_a_cuda_graph_jobs_prior_and_the_other_phases_are_shared(profile_dir):
    # 2026-12-07, one H100: gen ran x0.64 of the model on an eager job (host-bound launches) and x0.98-1.23 on a
    # job with CUDA graphs; the log-prob and update phases do not depend on the decode mode
    eager = {profile_row("gen", True): [math.log(0.64)] * 4, profile_row("update_actor", True): [math.log(1.1)] * 4}
    assert set(eager) == {"gen@eager", "update_actor"}
    record_study(H200, "seed@1", eager, [0.6], 4)
    graphs_job, eager_job = load_profile(H200).summary(False), load_profile(H200).summary(True)
    assert set(graphs_job["phases"]) == {"update_actor"} and graphs_job["decode"] == "CUDA graphs"
    assert math.exp(eager_job["phases"]["gen"]["log_mean"]) == pytest.approx(0.64)
    assert eager_job["phases"]["update_actor"] == graphs_job["phases"]["update_actor"]
    assert "as this job's" in describe_summary(graphs_job)
    record_study(H200, "other@2", {"gen": [math.log(1.1)] * 2}, [], 2)  # a CUDA-graph job's rows
    assert math.exp(load_profile(H200).summary(False)["phases"]["gen"]["log_mean"]) == pytest.approx(1.1)
    assert math.exp(load_profile(H200).summary(True)["phases"]["gen"]["log_mean"]) == pytest.approx(0.64)


def test_what_a_launch_cost_is_kept_per_study_and_its_median_is_the_profiles(profile_dir):
    record_study(H200, "a@1", {"gen": [0.0, 0.1]}, [], 2, launch_overhead_s=330.0)
    record_study(H200, "b@2", {"gen": [0.0, 0.1]}, [], 2, launch_overhead_s=290.0)
    record_study(H200, "c@3", {"gen": [0.0, 0.1]}, [], 2)  # a study whose launches measured no cost
    summary = load_profile(H200).summary()
    assert summary["launch_overhead_s"] == pytest.approx(310.0)
    assert "a launch cost 310 s beyond its timed steps" in describe_summary(summary)


def test_one_probe_is_not_a_profile_and_a_broken_file_is_none(profile_dir):
    record_study(H200, "s@1", {"gen": [1.0]}, [], 1)
    assert load_profile(H200).prior()["phases"] == {}  # one configuration's residual is not the node's
    profile_path(H200).write_text("{not json")
    assert load_profile(H200) is None
    profile_path(H200).write_text(json.dumps({"kind": {"gpu": "other"}, "studies": {}}))
    assert load_profile(H200) is None  # a file of another kind under this name is not used


def test_an_unwritable_profile_folder_leaves_the_study_alone(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOTUNE_PROFILE_DIR", str(blocker / "profiles"))
    assert record_study(H200, "s@1", {"gen": [1.0, 1.1]}, [], 2) is None


def test_the_sim_and_a_machine_without_a_gpu_have_no_node_kind(monkeypatch):
    assert detect_kind("sim", {}) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_kind("verl", {}) is None


def test_the_jobs_own_attention_implementation_is_the_key():
    assert attention_of({"actor_rollout_ref.model.override_config.attn_implementation": "sdpa"}) == "sdpa"
    assert attention_of({}) in ("flash_attention_2", "sdpa")


def test_describe_says_why_there_is_none():
    assert describe_summary({"none": "the sim measures nothing"}) == "node profile: none (the sim measures nothing)"
    assert describe_summary(None) == "node profile: none (the study predates profiles)"
    assert NodeProfile(kind=H200).probes == 0


def test_what_fits_peaked_above_the_memory_model_is_kept_per_study_and_the_median_studys_worst_is_the_profiles():
    from autotune.storage.node_profile import profile_peak_under

    record_study(H200, "a@1", {"gen": [0.0, 0.1]}, [], 2, peak_over_predicted=[0.98, 1.11, 1.115])
    assert profile_peak_under(load_profile(H200).summary()) == pytest.approx(1.115)
    record_study(H200, "b@2", {"gen": [0.0, 0.1]}, [], 2, peak_over_predicted=[1.02, 1.087])
    record_study(H200, "c@3", {"gen": [0.0, 0.1]}, [], 2, peak_over_predicted=[0.95, 0.97])  # over-predicted: 1
    record_study(H200, "d@4", {"gen": [0.0, 0.1]}, [], 2)  # no peak read (a torch study without NVML, say)
    summary = load_profile(H200).summary()
    assert summary["peak_under"] == pytest.approx(1.087)  # the median of 1.115, 1.087 and 1.0
    assert "GPU peaks up to x1.09 of the memory model's" in describe_summary(summary)
    assert profile_peak_under(None) == profile_peak_under({"none": "first study"}) == 1.0
    record_study(H200, "a@1", {"gen": [0.0, 0.1]}, [], 2, peak_over_predicted=[0.9])  # resumed: replaced
    assert load_profile(H200).summary()["peak_under"] == pytest.approx(1.0)
    assert "memory model" not in describe_summary(load_profile(H200).summary())
