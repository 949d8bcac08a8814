"""verl's per-token log-prob loop in the time model (model/cost.py logprob_loop_s), against real verl runs.

The constants were measured on two H200 launches of 2026-12-06 (fused kernels on and off); the 18 configurations of
the 2026-12-05 shared-launch study (benchmarks/results/h200-2026-12-05-verl-shared/autotune.db) were not used for
them: the term must explain their training phases there, where the model without it was 4.5-8x too fast.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.hardware import get_gpu
from autotune.model.calibration import DEFAULT_CONSTANTS
from autotune.model.cost import estimate_step_time, logprob_loop_s
from autotune.models import get_model
from autotune.search.node_prior import study_rows
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
SHARED_DB = ROOT / "benchmarks" / "results" / "h200-2026-12-05-verl-shared" / "autotune.db"
sys.path.insert(0, str(ROOT / "benchmarks"))
import node_profile_h200  # noqa: E402  (the stored study priced as it ran)
Q15 = get_model("qwen2.5-1.5b")
H200 = get_gpu("H200")
JOB = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=256, max_response_length=512)
FSDP = Candidate(rollout_tp=1, use_remove_padding=False)


def phases(cand: Candidate, *, loop: bool, workload: Workload = JOB, gpus: int = 1) -> dict:
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus, nodes=1)
    return estimate_step_time(Q15, H200, workload, cand, layout, logprob_loop=loop).phase_s


def test_the_loop_adds_its_per_token_cost_to_every_log_prob_pass_and_nothing_else():
    plain, looped = phases(FSDP, loop=False), phases(FSDP, loop=True)
    tokens = JOB.trajectories_per_step * JOB.mean_seq_len
    k = DEFAULT_CONSTANTS.system
    assert looped["old_log_prob"] - plain["old_log_prob"] == pytest.approx(tokens * k.logprob_loop_forward_s)
    assert looped["ref"] - plain["ref"] == pytest.approx(tokens * k.logprob_loop_forward_s)
    assert looped["update_actor"] - plain["update_actor"] == pytest.approx(tokens * k.logprob_loop_train_s)
    assert looped["gen"] == plain["gen"] and looped["update_weights"] == plain["update_weights"]


@pytest.mark.parametrize("micro", [1, 4, 16])
def test_the_loop_is_per_token_whatever_the_micro_batch(micro):
    """Host-bound: the issue-29 job's old_log_prob took 10.2-10.9 s at token budgets from 8k to 41k."""
    base = logprob_loop_s(JOB, FSDP, ParallelLayout.of(FSDP, JOB, gpus_per_node=1, nodes=1), forward_only=True,
                          k=DEFAULT_CONSTANTS)
    cand = FSDP.with_(log_prob_micro_batch_size_per_gpu=micro)
    assert logprob_loop_s(JOB, cand, ParallelLayout.of(cand, JOB, gpus_per_node=1, nodes=1), forward_only=True,
                          k=DEFAULT_CONSTANTS) == base


def test_fused_kernels_and_megatron_never_take_the_loop_and_ranks_split_it():
    assert phases(FSDP.with_(use_fused_kernels=True), loop=True) == phases(FSDP.with_(use_fused_kernels=True),
                                                                           loop=False)
    megatron = Candidate(actor_engine="megatron", rollout_tp=1, cuda_device_max_connections=1)
    assert phases(megatron, loop=True) == phases(megatron, loop=False)
    layout1 = ParallelLayout.of(FSDP, JOB, gpus_per_node=1, nodes=1)
    big = replace(JOB, train_batch_size=64, ppo_mini_batch_size=32)
    layout8 = ParallelLayout.of(FSDP, big, gpus_per_node=8, nodes=1)
    one = logprob_loop_s(JOB, FSDP, layout1, forward_only=False, k=DEFAULT_CONSTANTS)
    eight = logprob_loop_s(big, FSDP, layout8, forward_only=False, k=DEFAULT_CONSTANTS)
    assert eight == pytest.approx(one * 2 / 8)  # twice the batch over eight ranks


def _shared_study_rows(loop: bool) -> dict[str, list[float]]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{SHARED_DB}"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    rows, _, probes = study_rows(study, node_profile_h200.source_cfg(study, loop, db=SHARED_DB))
    assert probes == 18
    return rows


def test_the_loop_explains_the_training_phases_of_18_held_out_real_verl_configurations():
    """Real verl on an H200 without flash-attn (2026-12-05): measured over predicted per phase, every probe."""
    without, with_loop = _shared_study_rows(False), _shared_study_rows(True)
    for phase in ("old_log_prob", "ref", "update_actor"):
        ratios = [math.exp(r) for r in with_loop[phase]]
        assert len(ratios) == 18
        assert 0.9 < min(ratios) and max(ratios) < 1.35, (phase, min(ratios), max(ratios))
        assert min(math.exp(r) for r in without[phase]) > 1.9  # the model without it: 2-8x too fast
    # what the loop does not touch keeps its error (gen: the job's vLLM runs eager, so its rows are kept as such)
    assert without["gen@eager"] == with_loop["gen@eager"]
