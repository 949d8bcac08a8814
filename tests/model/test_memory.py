"""The analytic memory model (autotune/model/memory.py): directions, consistency and anchors.

The calibration constants move as probes come in, so these tests pin directions (more of X costs
more memory) and coarse anchors far from the capacity edge, not exact GiB.
"""

from __future__ import annotations

import itertools

import pytest

from autotune.errors import ConfigError
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.model.memory import MemoryEstimate, estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import verl_default_candidate
from autotune.workload import Workload

H200 = get_gpu("H200")
WL = Workload()
Q7B = get_model("qwen2.5-7b")
Q72B = get_model("qwen2.5-72b")
DEFAULT_7B = verl_default_candidate(Q7B, WL, gpus_per_node=8, nodes=1)
MEGATRON_7B = DEFAULT_7B.with_(actor_engine="megatron", cuda_device_max_connections=1)
COMPONENTS = {"weights", "gradients", "optimizer", "activations", "logits", "vllm_share", "overhead"}


def mem(cand: Candidate, model=Q7B, *, workload: Workload = WL, gpus_per_node: int = 8, nodes: int = 1,
        gpu=H200) -> MemoryEstimate:
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    return estimate_memory(model, gpu, workload, cand, layout)


def strictly_increasing(values) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


# ---- directions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", [DEFAULT_7B, DEFAULT_7B.with_(gradient_checkpointing=False),
                                  MEGATRON_7B.with_(actor_tp=2, gradient_checkpointing=False)],
                         ids=["fsdp-ckpt", "fsdp-no-ckpt", "megatron-tp2"])
def test_update_peak_grows_with_micro_batch(base):
    peaks = [mem(base.with_(ppo_micro_batch_size_per_gpu=m)).phase_peak_gib["update_actor"] for m in (1, 2, 4, 8, 16)]
    assert strictly_increasing(peaks), peaks


def test_update_peak_grows_with_token_budget():
    base = DEFAULT_7B.with_(use_dynamic_bsz=True)
    budgets = [WL.seq_len * k for k in (1, 2, 4, 8, 16)]
    peaks = [mem(base.with_(ppo_max_token_len_per_gpu=b)).phase_peak_gib["update_actor"] for b in budgets]
    assert strictly_increasing(peaks), peaks


def test_log_prob_peak_grows_with_log_prob_micro_batch():
    peaks = [mem(DEFAULT_7B.with_(log_prob_micro_batch_size_per_gpu=m)).phase_peak_gib["old_log_prob"]
             for m in (2, 8, 32, 128)]
    assert strictly_increasing(peaks), peaks


def test_rollout_peak_grows_with_gpu_memory_utilization():
    fractions = (0.3, 0.5, 0.7, 0.9)
    estimates = [mem(DEFAULT_7B.with_(gpu_memory_utilization=f)) for f in fractions]
    assert strictly_increasing([e.phase_peak_gib["rollout"] for e in estimates])
    # vLLM's share is a fraction of the whole device, and it is the only thing that changed
    for f, e in zip(fractions, estimates):
        assert e.components_gib["vllm_share"] == pytest.approx(f * H200.mem_gib)
    assert strictly_increasing([e.kv_cache_gib for e in estimates])


@pytest.mark.parametrize("base", [DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=8),
                                  DEFAULT_7B.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4 * WL.seq_len)],
                         ids=["static-micro-8", "dynamic-4x"])
def test_checkpointing_lowers_update_peak(base):
    with_ckpt = mem(base.with_(gradient_checkpointing=True))
    without = mem(base.with_(gradient_checkpointing=False))
    assert with_ckpt.phase_peak_gib["update_actor"] < without.phase_peak_gib["update_actor"]
    assert with_ckpt.components_gib["activations"] < without.components_gib["activations"]


def test_liger_saves_the_silu_output_and_the_norm_upcasts_of_every_layer():
    """use_liger: Liger's SwiGLU keeps gate and up only and its RMSNorm no fp32 copy; the saving is
    liger_saved_per_h x hidden + liger_saved_per_i x MLP width bytes per token per layer, for every layer kept."""
    from autotune.model.calibration import ACTIVATIONS
    from autotune.model.memory import tokens_per_micro_batch

    base = DEFAULT_7B.with_(gradient_checkpointing=False, ppo_micro_batch_size_per_gpu=8)
    saved_gib = mem(base).components_gib["activations"] - mem(base.with_(use_liger=True)).components_gib["activations"]
    tok = tokens_per_micro_batch(base, WL, forward_only=False)
    per_token_layer = ACTIVATIONS.liger_saved_per_h * Q7B.hidden_size + ACTIVATIONS.liger_saved_per_i * Q7B.intermediate_size
    expected_gib = per_token_layer * tok * Q7B.num_layers / 2**30
    assert saved_gib == pytest.approx(expected_gib, rel=1e-9)
    assert mem(base.with_(use_liger=True)).phase_peak_gib["update_actor"] < mem(base).phase_peak_gib["update_actor"]


def test_fused_kernels_keep_one_chunk_of_logits_and_megatron_ignores_them():
    """model.use_fused_kernels: verl's fused log-prob runs 512 tokens at a time from the LM head's input
    (utils/experimental/torch_functional.py:104, 130), so the logits component is one chunk's, whatever the batch."""
    from autotune.model.calibration import ACTIVATIONS

    base = DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=8)
    fused = mem(base.with_(use_fused_kernels=True))
    assert fused.components_gib["logits"] == pytest.approx(
        ACTIVATIONS.fused_chunk_tokens * Q7B.vocab_size * ACTIVATIONS.fused_chunk_bytes / 2**30)
    assert fused.components_gib["logits"] < mem(base).components_gib["logits"]
    for phase in ("old_log_prob", "update_actor"):
        assert fused.phase_peak_gib[phase] < mem(base).phase_peak_gib[phase]
    assert mem(MEGATRON_7B.with_(use_fused_kernels=True)) == mem(MEGATRON_7B)


def test_activation_offload_lowers_activations():
    base = DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=16)
    assert mem(base.with_(activation_offload=True)).components_gib["activations"] < \
        mem(base).components_gib["activations"]


@pytest.mark.parametrize("knob", ["param_offload", "optimizer_offload", "ref_param_offload"])
def test_offload_lowers_rollout_peak(knob):
    on = mem(DEFAULT_7B.with_(**{knob: True})).phase_peak_gib["rollout"]
    off = mem(DEFAULT_7B).phase_peak_gib["rollout"]
    assert on < off


def test_more_gpus_shard_fsdp_state_thinner():
    by_nodes = [mem(DEFAULT_7B, nodes=n).components_gib for n in (1, 2, 4)]
    for key in ("weights", "gradients", "optimizer"):
        values = [c[key] for c in by_nodes]
        assert all(a > b for a, b in itertools.pairwise(values)), (key, values)
        assert values[0] == pytest.approx(2 * values[1]) and values[1] == pytest.approx(2 * values[2])


def test_megatron_tp_and_pp_split_the_weights():
    by_tp = [mem(MEGATRON_7B.with_(actor_tp=tp)).components_gib["weights"] for tp in (1, 2, 4)]
    assert by_tp[0] > by_tp[1] > by_tp[2]
    assert by_tp[0] == pytest.approx(2 * by_tp[1])
    by_pp = [mem(MEGATRON_7B.with_(actor_pp=pp)).components_gib["weights"] for pp in (1, 2, 4)]
    assert by_pp[0] > by_pp[1] > by_pp[2]


def test_1f1b_first_stage_holds_one_micro_batch_of_the_whole_model_and_interleaving_adds_its_factor():
    """Issue 30: plain 1F1B keeps PP micro-batches of L/PP layers on the first stage (one micro-batch's worth of the
    whole model); only the interleaved schedule adds (1 + (p-1)/(p*v)) (Korthikanti et al. 2022, sec. 4.2.3). The
    factor was applied at VPP 1 too (x1.875 on activations at PP 8)."""
    act = {(pp, vpp): mem(MEGATRON_7B.with_(actor_pp=pp, actor_vpp=vpp, gradient_checkpointing=False))
           .components_gib["activations"] for pp, vpp in ((1, 1), (2, 1), (4, 1), (2, 2))}
    assert act[(2, 1)] == pytest.approx(act[(1, 1)]) and act[(4, 1)] == pytest.approx(act[(1, 1)])
    assert act[(2, 2)] == pytest.approx(act[(2, 1)] * (1 + 1 / 4))


def test_1f1b_peak_is_the_fullest_stages_micro_batches_times_its_own_layers():
    """Issue 30: stage r of plain 1F1B holds min(PP - r, m) micro-batches of its own layers (megatron-core
    schedules.py, num_warmup_microbatches = PP - rank - 1); with 94 layers on PP 8 (stages 11, 12 x 6, 11) the first
    stage's 8 x 11 = 88 layer-micro-batches is the peak, not 8 x 12 = 96 as the largest stage times PP said."""
    from autotune.verl.pipeline_split import in_flight_layers, stage_layers

    assert stage_layers(94, 8) == [11.0, *[12.0] * 6, 11.0]
    assert in_flight_layers(94, 8, 16) == 88 and in_flight_layers(94, 8, 2) == 2 * 12
    assert in_flight_layers(48, 8, 16) == 48  # an even split is unchanged: PP x L/PP
    from autotune.model.memory import GIB, _token_split, tokens_per_micro_batch, train_activation_bytes

    moe = get_model("qwen3-235b-a22b")
    cand = MEGATRON_7B.with_(actor_tp=4, actor_pp=8, actor_ep=4, gradient_checkpointing=False)
    layout = ParallelLayout.of(cand, WL, gpus_per_node=8, nodes=4)
    assert layout.micro_batches_per_mini >= 8
    tok = tokens_per_micro_batch(cand, WL.at_max_length(), forward_only=False, layout=layout) / _token_split(cand)
    per_layer = train_activation_bytes(moe, tok, layers=1, checkpointing=False) / GIB
    act = mem(cand, model=moe, gpus_per_node=8, nodes=4).components_gib["activations"]
    assert act == pytest.approx(88 * per_layer)


def test_megatron_cpu_optimizer_keeps_its_share_of_the_optimizer_on_the_host():
    """override_optimizer_config.optimizer_cpu_offload with optimizer_offload_fraction f (megatron-core
    OptimizerConfig; verl's Qwen3-235B 96gb script sets 1.0): f of the distributed optimizer stays on the host."""
    from dataclasses import replace

    base = mem(MEGATRON_7B)
    half = mem(MEGATRON_7B, workload=replace(WL, megatron_optimizer_cpu_offload=True,
                                            megatron_optimizer_offload_fraction=0.5))
    off = mem(MEGATRON_7B, workload=replace(WL, megatron_optimizer_offload_fraction=0.5))  # no cpu offload
    assert half.components_gib["optimizer"] == pytest.approx(base.components_gib["optimizer"] / 2)
    assert off.components_gib["optimizer"] == pytest.approx(base.components_gib["optimizer"])
    assert half.phase_peak_gib["update_actor"] < base.phase_peak_gib["update_actor"]
    with pytest.raises(ConfigError, match="megatron_optimizer_offload_fraction"):
        replace(WL, megatron_optimizer_offload_fraction=1.5)


def test_megatron_expert_parallel_splits_moe_weights():
    moe = get_model("qwen3-30b-a3b")
    base = MEGATRON_7B
    weights = [mem(base.with_(actor_ep=ep), moe).components_gib["weights"] for ep in (1, 2, 4, 8)]
    assert all(a > b for a, b in itertools.pairwise(weights)), weights


def test_kl_loss_adds_a_ref_phase_and_resident_ref_weights():
    with_ref = mem(DEFAULT_7B)
    no_ref_wl = Workload(use_kl_loss=False)
    without = mem(DEFAULT_7B, workload=no_ref_wl)
    assert set(with_ref.phase_peak_gib) == {"rollout", "old_log_prob", "update_actor", "ref"}
    assert set(without.phase_peak_gib) == {"rollout", "old_log_prob", "update_actor"}
    assert with_ref.components_gib["reference"] > 0 and without.components_gib["reference"] == 0
    assert without.phase_peak_gib["rollout"] < with_ref.phase_peak_gib["rollout"]


def test_longer_responses_need_more_kv_and_memory():
    short = mem(DEFAULT_7B)
    long_wl = Workload(max_response_length=4096)
    long = mem(DEFAULT_7B, workload=long_wl)
    assert long.kv_cache_needed_gib > short.kv_cache_needed_gib
    assert long.phase_peak_gib["update_actor"] > short.phase_peak_gib["update_actor"]


# ---- KV cache, fits and over_gib ---------------------------------------------------------------------

def test_kv_cache_does_not_fit_when_vllm_share_is_below_the_weights():
    # 72.7B bf16 weights are ~135 GiB on one rollout GPU; 0.3 x 140 GiB cannot hold them
    cand = verl_default_candidate(Q72B, WL, gpus_per_node=8, nodes=1).with_(rollout_tp=1, gpu_memory_utilization=0.3)
    est = mem(cand, Q72B)
    assert not est.kv_cache_fits
    assert est.kv_cache_gib < 0
    assert not est.fits
    assert est.over_gib >= est.kv_cache_needed_gib - est.kv_cache_gib > 0


def test_kv_cache_fits_once_rollout_tp_splits_the_weights():
    base = verl_default_candidate(Q72B, WL, gpus_per_node=8, nodes=1).with_(gpu_memory_utilization=0.3)
    kv = [mem(base.with_(rollout_tp=tp), Q72B).kv_cache_gib for tp in (1, 2, 4, 8)]
    assert strictly_increasing(kv), kv
    assert mem(base.with_(rollout_tp=8), Q72B).kv_cache_fits


GRID = [
    (model, cand)
    for model in (get_model("qwen2.5-0.5b"), Q7B, Q72B)
    for cand in (
        Candidate(rollout_tp=rtp, gpu_memory_utilization=gmu, ppo_micro_batch_size_per_gpu=micro,
                  gradient_checkpointing=ckpt)
        for rtp, gmu, micro, ckpt in itertools.product((1, 2, 8), (0.3, 0.6, 0.9), (1, 16, 64), (True, False))
    )
]


def test_fits_iff_nothing_is_over():
    outcomes = set()
    for model, cand in GRID:
        est = mem(cand, model)
        assert est.over_gib >= 0
        assert (est.over_gib == 0) == est.fits, (model.name, cand)
        assert est.fits == (est.peak_gib <= est.capacity_gib and est.kv_cache_fits)
        assert est.peak_gib == max(est.phase_peak_gib.values())
        assert est.worst_phase in est.phase_peak_gib
        assert est.phase_peak_gib[est.worst_phase] == est.peak_gib
        outcomes.add(est.fits)
    assert outcomes == {True, False}  # the grid holds both sides of the line


def test_over_gib_grows_as_it_gets_worse():
    overs = [mem(DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=m, gradient_checkpointing=False)).over_gib
             for m in (32, 64, 128)]
    assert overs[0] > 0 and strictly_increasing(overs), overs


def test_components_are_reported():
    est = mem(DEFAULT_7B)
    assert COMPONENTS <= set(est.components_gib)
    assert all(v >= 0 for v in est.components_gib.values())
    assert all(est.components_gib[k] > 0 for k in COMPONENTS)
    assert est.capacity_gib == H200.mem_gib


# ---- anchors -----------------------------------------------------------------------------------------

def test_qwen25_7b_verl_defaults_fit_on_8_h200():
    est = mem(DEFAULT_7B)
    assert est.fits and est.over_gib == 0
    assert est.kv_cache_fits
    assert est.peak_gib < 0.9 * H200.mem_gib  # not a borderline fit


@pytest.mark.parametrize("offload", [False, True])
def test_qwen25_72b_never_fits_on_one_h200(offload):
    base = verl_default_candidate(Q72B, WL, gpus_per_node=1, nodes=1)
    assert base.rollout_tp == 1
    if offload:
        base = base.with_(param_offload=True, optimizer_offload=True, ref_param_offload=True)
    for gmu in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        est = mem(base.with_(gpu_memory_utilization=gmu), Q72B, gpus_per_node=1)
        assert not est.fits and est.over_gib > 0, gmu
        assert not est.kv_cache_fits, gmu


# ---- bugs (reported) ----------------------------------------------------------------------------------

def test_megatron_moe_reference_is_split_by_expert_parallel():
    moe = get_model("qwen3-30b-a3b")
    refs = [mem(MEGATRON_7B.with_(actor_ep=ep), moe).components_gib["reference"] for ep in (1, 8)]
    assert refs[1] < refs[0] / 2, refs


def test_optimizer_offload_lowers_the_rollout_but_not_the_update():
    """verl loads offloaded Adam state for the whole update (engine/base.py train_mode); the 7B torch
    study of 2026-12-02 OOMed at 138.8 GiB where the model, counting the state as offloaded, said 127.4."""
    on, off = mem(DEFAULT_7B.with_(optimizer_offload=True)), mem(DEFAULT_7B)
    assert on.phase_peak_gib["rollout"] < off.phase_peak_gib["rollout"]
    assert on.phase_peak_gib["update_actor"] == pytest.approx(off.phase_peak_gib["update_actor"])


def test_dynamic_micro_batches_are_balanced_as_verl_splits_a_mini_batch():
    """1.4 budgets of tokens on a rank run as two micro-batches of 0.7 budgets (rearrange_micro_batches)."""
    from autotune.model.memory import tokens_per_micro_batch

    cand = DEFAULT_7B.with_(use_dynamic_bsz=True)
    layout = ParallelLayout.of(cand, WL, gpus_per_node=8, nodes=1)
    rank_tokens = layout.mini_batch_per_rank * WL.mean_seq_len
    budget = int(rank_tokens / 1.4)
    c = cand.with_(ppo_max_token_len_per_gpu=budget)
    largest = tokens_per_micro_batch(c, WL, forward_only=False, layout=layout)
    assert largest == pytest.approx(rank_tokens / 2 + WL.seq_len)
    assert tokens_per_micro_batch(c, WL, forward_only=False) == budget  # without a layout: the budget
    roomy = cand.with_(ppo_max_token_len_per_gpu=int(rank_tokens * 3))
    assert tokens_per_micro_batch(roomy, WL, forward_only=False, layout=layout) == pytest.approx(rank_tokens)


def test_one_split_serves_memory_gradient_accumulation_and_time():
    from autotune.model.memory import accumulates_gradients, dynamic_split, tokens_per_micro_batch

    cand = DEFAULT_7B.with_(use_dynamic_bsz=True)
    layout = ParallelLayout.of(cand, WL, gpus_per_node=8, nodes=1)
    rank_tokens = layout.mini_batch_per_rank * WL.mean_seq_len
    for factor, count in ((0.5, 1), (1.4, 2), (3.2, 4)):
        c = cand.with_(ppo_max_token_len_per_gpu=max(int(rank_tokens / factor), WL.seq_len))
        split = dynamic_split(c, WL, layout, forward_only=False)
        assert split.count == count
        assert split.mean_tokens == pytest.approx(rank_tokens / count)
        assert tokens_per_micro_batch(c, WL, forward_only=False, layout=layout, largest=False) == split.mean_tokens
        assert accumulates_gradients(c, WL, layout) == (count > 1)
        assert split.mean_tokens <= split.largest_tokens <= c.ppo_max_token_len_per_gpu


def test_padded_old_log_prob_entropy_is_priced_as_verl_runs_it():
    """The real verl study on the H200 (benchmarks/results/h200-2026-12-03-verl, trials 1 and 2): remove-padding
    off, log-prob micro-batch 128 of 768-token rows of Qwen2.5-1.5B shapes: verl ran out of memory in old_log_prob
    (116.8 GiB in use, 43.83 GiB more asked inside entropy_from_logits). The model said 66.5 GiB; it must say OOM,
    in old_log_prob, and leave the remove-padding path (compiled entropy on bf16 logits) as it was."""
    model, gpu = get_model("qwen2.5-1.5b"), get_gpu("H200")
    workload = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=256,
                        max_response_length=512)
    cand = Candidate(actor_engine="fsdp2", rollout_tp=1, gpu_memory_utilization=0.5, gradient_checkpointing=False,
                     ppo_micro_batch_size_per_gpu=32, log_prob_micro_batch_size_per_gpu=128,
                     ref_log_prob_micro_batch_size_per_gpu=128, use_remove_padding=False)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
    padded = estimate_memory(model, gpu, workload, cand, layout)
    assert padded.phase_peak_gib["old_log_prob"] > 116.8 + 43.8 > padded.capacity_gib
    assert padded.phase_peak_gib["ref"] < padded.capacity_gib  # the reference pass computes no entropy
    unpadded = estimate_memory(model, gpu, workload, cand.with_(use_remove_padding=True), layout)
    assert unpadded.phase_peak_gib["old_log_prob"] < padded.capacity_gib
