"""Host memory of offload (autotune/model/host_memory.py) and its gate in the driver.

Anchored on the 7B study of 2026-12-02 on an H200 host of 125 GiB (benchmarks/results/
h200-2026-12-02-torch-session4/study_7b_a.*): probes with Adam moments offloaded per tensor were
killed by the kernel, although the moments themselves are 57 GiB.
"""

from __future__ import annotations

import pytest

from autotune.hardware import GIB, detect_host_mem_gib
from autotune.models import get_model
from autotune.model.host_memory import (HOST_HEADROOM, estimate_host_memory, pinned_block_bytes,
                                             pinned_optimizer_bytes)
from autotune.model.memory import actor_state_bytes
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import verl_default_candidate
from autotune.workload import Workload

Q7B = get_model("qwen2.5-7b")
STUDY = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=512,
                 max_response_length=128)
ONE_GPU = verl_default_candidate(Q7B, STUDY, gpus_per_node=1, nodes=1)
HOST_GIB = 125.0  # `free -g` on the H200 machine


def host(cand, *, gpus_per_node=1, capacity=HOST_GIB, workload=STUDY):
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=1)
    return estimate_host_memory(Q7B, workload, cand, layout, gpus_per_node=gpus_per_node, capacity_gib=capacity)


@pytest.mark.parametrize("nbytes, block", [(1, 1), (3 * GIB // 2, 2 * GIB), (2 * GIB, 2 * GIB), (0, 0)])
def test_pinned_blocks_round_up_to_a_power_of_two(nbytes, block):
    assert pinned_block_bytes(nbytes) == block


def test_offloaded_adam_moments_of_7b_take_far_more_pinned_memory_than_their_size():
    layout = ParallelLayout.of(ONE_GPU, STUDY, gpus_per_node=1, nodes=1)
    exact = actor_state_bytes(Q7B, ONE_GPU, layout).optimizer
    fsdp2 = pinned_optimizer_bytes(Q7B, ONE_GPU.with_(actor_engine="fsdp2"), layout)
    fsdp1 = pinned_optimizer_bytes(Q7B, ONE_GPU, layout)
    assert exact / GIB == pytest.approx(56.7, abs=0.2)
    assert fsdp2 > 1.8 * exact  # per-parameter blocks: the MLP's 272 MB shards take 512 MiB each
    assert exact < fsdp1 < fsdp2  # one flat block per layer rounds less


def test_the_host_killed_7b_probe_is_predicted_not_to_fit_and_no_offload_fits():
    # study_7b_a trial 11: FSDP2, optimizer and activation offload; killed by SIGKILL on the 125 GiB host
    killed = ONE_GPU.with_(actor_engine="fsdp2", optimizer_offload=True, activation_offload=True,
                           gradient_checkpointing=False, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=10240)
    assert not host(killed).fits and host(killed).over_gib > 0
    assert "optimizer" in host(killed).describe() and "activations" in host(killed).describe()
    assert host(ONE_GPU).fits and host(ONE_GPU).node_gib < 0.3 * HOST_GIB


def test_every_gpu_of_a_node_adds_its_own_worker():
    cand = ONE_GPU.with_(optimizer_offload=True)
    one, eight = host(cand), host(cand, gpus_per_node=8)
    # eight workers hold an eighth of the sharded state each, plus their own process and vLLM weights
    assert eight.node_gib > one.node_gib
    assert eight.per_gpu_gib["optimizer"] < one.per_gpu_gib["optimizer"] / 4


def test_unknown_host_memory_is_not_checked():
    greedy = ONE_GPU.with_(actor_engine="fsdp2", optimizer_offload=True, activation_offload=True)
    assert host(greedy, capacity=None).fits and host(greedy, capacity=None).over_gib == 0.0
    assert not host(greedy, capacity=8.0).fits


def test_the_gate_plans_for_a_share_of_the_ram():
    est = host(ONE_GPU)
    assert host(ONE_GPU, capacity=est.node_gib / HOST_HEADROOM * 1.01).fits
    assert not host(ONE_GPU, capacity=est.node_gib / HOST_HEADROOM * 0.99).fits


def test_this_machines_ram_is_detected():
    gib = detect_host_mem_gib()
    assert gib is not None and 0.5 < gib < 1 << 20
