"""`autotune estimate` with a node profile (issue 29 item 4): the times are corrected by it and it is named."""

import math

import pytest

from autotune import estimate as estimate_module
from autotune.estimate import estimate, node_profile_for, render
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.spaces.space import verl_default_candidate
from autotune.storage import node_profile
from autotune.storage.node_profile import NodeKind, record_study
from autotune.workload import Workload

KIND = NodeKind(gpu="H200", driver="580.159.04", torch="2.11.0", vllm="0.24.0", verl="0.9.1", attention="sdpa",
                backend="verl")


@pytest.fixture
def h200_node(tmp_path, monkeypatch):
    """TEST DOUBLE for the GPU: this machine reads as an H200 node of KIND."""
    monkeypatch.setenv("AUTOTUNE_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setattr(node_profile, "detect_kind", lambda backend, passthrough, detected=None: KIND)


def test_estimate_corrects_each_phase_by_the_nodes_profile_and_says_so(h200_node):
    model, gpu, workload = get_model("qwen2.5-1.5b"), get_gpu("H200"), Workload()
    cand = verl_default_candidate(model, workload, gpus_per_node=8, nodes=1)
    assert node_profile_for(gpu, {})["none"].startswith("no study has measured this kind of node yet")
    record_study(KIND, "s@1", {"gen": [math.log(3.0)] * 3, "update_actor": [math.log(5.0)] * 3}, [0.7], 3)
    profile = node_profile_for(gpu, {})
    assert profile["id"] == KIND.id
    bare = estimate(model, gpu, workload, cand, gpus_per_node=8, nodes=1)
    fixed = estimate(model, gpu, workload, cand, gpus_per_node=8, nodes=1, profile=profile)
    assert fixed.phase_s["gen"] == pytest.approx(3 * bare.phase_s["gen"])
    assert fixed.phase_s["update_actor"] == pytest.approx(5 * bare.phase_s["update_actor"])
    assert fixed.phase_s["old_log_prob"] == pytest.approx(bare.phase_s["old_log_prob"])  # not measured: as modelled
    assert fixed.tokens_per_s_per_gpu == pytest.approx(bare.tokens_per_s_per_gpu * bare.step_s / fixed.step_s)
    assert fixed.mfu_actor == pytest.approx(bare.mfu_actor / 5)
    text = render(fixed, "job", ())
    assert f"node profile {KIND.id}: 3 measured probe(s)" in text and "the times below are corrected by it" in text
    assert node_profile_for(get_gpu("H100-80GB"), {}) == {"none": "this node is H200, the estimate is for H100-80GB"}


def test_without_a_gpu_estimate_says_there_is_no_profile(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert estimate_module.node_profile_for(get_gpu("H200"), {}) == {"none": "no NVIDIA GPU detected here"}


def test_estimate_prices_verls_log_prob_loop_where_the_job_forces_it_and_says_why(monkeypatch, capsys):
    """The job's own VERL_DISABLE_FLASH_ATTN_CE=1 sends verl down its per-token loop on any node
    (utils/torch_functional.py:95): `autotune estimate` prices it on a machine without a GPU too, and names why."""
    from autotune.cli import main

    monkeypatch.delenv("VERL_DISABLE_FLASH_ATTN_CE", raising=False)
    monkeypatch.setattr("autotune.hardware.detect_gpus", lambda: None)
    assert main(["estimate", "--model", "qwen2.5-1.5b", "--gpus", "1"]) == 0
    plain = capsys.readouterr().out
    monkeypatch.setenv("VERL_DISABLE_FLASH_ATTN_CE", "1")
    assert main(["estimate", "--model", "qwen2.5-1.5b", "--gpus", "1"]) == 0
    looped = capsys.readouterr().out
    assert "log-prob loop" not in plain
    assert "verl's per-token log-prob loop is priced (VERL_DISABLE_FLASH_ATTN_CE=1)" in looped

    def step_s(text: str) -> float:
        return float(text.split("time per step ")[1].split(" s")[0])

    assert step_s(looped) > step_s(plain)
