"""The analytic step-time model (autotune/model/cost.py): phases, bookkeeping and directions.

Constants are refitted as probes arrive, so the tests pin directions and identities, not seconds.
"""

from __future__ import annotations

import itertools

import pytest

from autotune.hardware import get_gpu
from autotune.models import MODELS, get_model
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import StepTime, estimate_step_time, train_mfu
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import verl_default_candidate
from autotune.workload import Workload

H200 = get_gpu("H200")
WL = Workload()
Q7B = get_model("qwen2.5-7b")
DEFAULT_7B = verl_default_candidate(Q7B, WL, gpus_per_node=8, nodes=1)
MEGATRON_7B = DEFAULT_7B.with_(actor_engine="megatron", cuda_device_max_connections=1)


def step(cand: Candidate, model=Q7B, *, workload: Workload = WL, gpus_per_node: int = 8, nodes: int = 1,
         constants: ModelConstants = DEFAULT_CONSTANTS) -> StepTime:
    layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    return estimate_step_time(model, H200, workload, cand, layout, constants=constants)


# ---- train_mfu -----------------------------------------------------------------------------------

@pytest.mark.parametrize("hidden", sorted({m.hidden_size for m in MODELS.values()} | {448, 16384}))
def test_train_mfu_rises_with_tokens_and_stays_plausible(hidden):
    tokens = [1, 64, 512, 2048, 8192, 32768, 131072, 1 << 20]
    mfus = [train_mfu(t, hidden) for t in tokens]
    assert all(a < b for a, b in itertools.pairwise(mfus)), mfus
    assert all(0 < m < 0.7 for m in mfus), mfus


def test_train_mfu_saturates():
    # doubling an already huge micro-batch buys almost nothing
    assert train_mfu(1 << 22, 3584) / train_mfu(1 << 21, 3584) < 1.01
    assert train_mfu(4096, 3584) / train_mfu(512, 3584) > 1.2


# ---- phases and bookkeeping ------------------------------------------------------------------------------

CANDIDATES = {
    "fsdp-default": DEFAULT_7B,
    "fsdp2-dynamic": DEFAULT_7B.with_(actor_engine="fsdp2", use_dynamic_bsz=True, ppo_max_token_len_per_gpu=6144,
                                      log_prob_max_token_len_per_gpu=12288),
    "fsdp-ulysses2": DEFAULT_7B.with_(ulysses_sp=2),
    "fsdp-offload": DEFAULT_7B.with_(param_offload=True, optimizer_offload=True, ref_param_offload=True),
    "fsdp-activation-offload": DEFAULT_7B.with_(activation_offload=True),
    "megatron-tp2-pp2": MEGATRON_7B.with_(actor_tp=2, actor_pp=2),
    "megatron-tp4-pp2-vpp2": MEGATRON_7B.with_(actor_tp=4, actor_pp=2, actor_vpp=2),
    "megatron-cp2": MEGATRON_7B.with_(actor_cp=2),
}


@pytest.mark.parametrize("use_kl_loss", [True, False])
@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_phases_present_and_positive(name, use_kl_loss):
    wl = Workload(use_kl_loss=use_kl_loss)
    st = step(CANDIDATES[name], workload=wl)
    expected = {"gen", "old_log_prob", "update_actor", "update_weights"} | ({"ref"} if use_kl_loss else set())
    assert set(st.phase_s) == expected
    assert all(v > 0 for v in st.phase_s.values()), st.phase_s
    assert st.step_s > sum(st.phase_s.values())  # plus the fixed per-step cost (reward, data, dispatch)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_throughput_is_tokens_over_time_over_gpus(name, nodes):
    st = step(CANDIDATES[name], nodes=nodes)
    world = 8 * nodes
    assert st.tokens_per_step == pytest.approx(WL.trajectories_per_step * WL.mean_seq_len)
    assert st.tokens_per_s_per_gpu == pytest.approx(st.tokens_per_step / st.step_s / world)


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_actor_mfu_is_a_fraction(name):
    st = step(CANDIDATES[name])
    assert 0 < st.mfu_actor < 1


def test_kl_loss_costs_a_ref_pass():
    with_ref = step(DEFAULT_7B)
    without = step(DEFAULT_7B, workload=Workload(use_kl_loss=False))
    assert without.step_s < with_ref.step_s


# ---- directions --------------------------------------------------------------------------------------

def test_more_concurrent_sequences_shorten_gen_while_kv_allows():
    runs = [step(DEFAULT_7B.with_(max_num_seqs=n)) for n in (64, 128, 256, 512)]
    assert [r.rollout_concurrency for r in runs] == [64, 128, 256, 512]  # KV cache holds them all
    gens = [r.phase_s["gen"] for r in runs]
    assert all(a > b for a, b in itertools.pairwise(gens)), gens


def test_max_num_seqs_stops_helping_once_kv_is_full():
    # rollout TP 1 at 0.3: the KV cache holds a few hundred 1.2k-token sequences, not 512
    base = DEFAULT_7B.with_(rollout_tp=1, gpu_memory_utilization=0.3)
    at_512, at_1024 = step(base.with_(max_num_seqs=512)), step(base.with_(max_num_seqs=1024))
    assert at_512.rollout_concurrency < 512
    assert at_1024.rollout_concurrency == pytest.approx(at_512.rollout_concurrency, rel=0.05)
    assert at_1024.phase_s["gen"] == pytest.approx(at_512.phase_s["gen"], rel=0.05)


def test_more_kv_room_raises_concurrency_when_kv_bound():
    base = DEFAULT_7B.with_(rollout_tp=1, max_num_seqs=1024)
    concurrency = [step(base.with_(gpu_memory_utilization=g)).rollout_concurrency for g in (0.3, 0.4, 0.5)]
    assert all(a < b for a, b in itertools.pairwise(concurrency)), concurrency


def test_checkpointing_slows_update_actor():
    with_ckpt = step(DEFAULT_7B.with_(gradient_checkpointing=True)).phase_s["update_actor"]
    without = step(DEFAULT_7B.with_(gradient_checkpointing=False)).phase_s["update_actor"]
    assert with_ckpt > without


def test_liger_speeds_up_every_pass_by_its_measured_factor():
    from autotune.model.calibration import THROUGHPUT

    plain, liger = step(DEFAULT_7B), step(DEFAULT_7B.with_(use_liger=True))
    assert liger.mfu_actor == pytest.approx(plain.mfu_actor * THROUGHPUT.liger_throughput_factor, rel=0.05)
    for phase in ("old_log_prob", "update_actor"):
        assert liger.phase_s[phase] < plain.phase_s[phase]
    assert liger.phase_s["gen"] == plain.phase_s["gen"]  # vLLM has its own kernels


def test_bigger_micro_batches_speed_up_update_actor():
    times = [step(DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=m)).phase_s["update_actor"] for m in (1, 2, 4, 8)]
    assert all(a > b for a, b in itertools.pairwise(times)), times


def test_dynamic_bsz_with_a_large_budget_beats_micro_batch_1():
    dynamic = DEFAULT_7B.with_(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=16 * WL.seq_len,
                               log_prob_max_token_len_per_gpu=16 * WL.seq_len)
    static_1 = DEFAULT_7B.with_(ppo_micro_batch_size_per_gpu=1, log_prob_micro_batch_size_per_gpu=1,
                                ref_log_prob_micro_batch_size_per_gpu=1)
    fast, slow = step(dynamic), step(static_1)
    assert fast.phase_s["update_actor"] < slow.phase_s["update_actor"]
    assert fast.phase_s["old_log_prob"] < slow.phase_s["old_log_prob"]
    assert fast.step_s < slow.step_s


def test_rollout_tp_changes_gen_and_weight_sync():
    tp1, tp2 = step(DEFAULT_7B.with_(rollout_tp=1)), step(DEFAULT_7B.with_(rollout_tp=2))
    assert abs(tp1.phase_s["gen"] - tp2.phase_s["gen"]) > 0.01 * tp2.phase_s["gen"]
    assert tp1.phase_s["update_weights"] > tp2.phase_s["update_weights"]  # a TP-1 shard is the whole model
    # the trainer's phases do not depend on the rollout layout
    assert tp1.phase_s["update_actor"] == pytest.approx(tp2.phase_s["update_actor"])


@pytest.mark.parametrize("knob, phase", [("optimizer_offload", "update_actor"), ("param_offload", "update_actor"),
                                         ("param_offload", "old_log_prob"), ("param_offload", "update_weights"),
                                         ("ref_param_offload", "ref")])
def test_offload_adds_time(knob, phase):
    on, off = step(DEFAULT_7B.with_(**{knob: True})), step(DEFAULT_7B)
    assert on.phase_s[phase] > off.phase_s[phase]
    assert on.step_s > off.step_s


def test_activation_offload_slows_update_actor():
    assert step(DEFAULT_7B.with_(activation_offload=True)).phase_s["update_actor"] > \
        step(DEFAULT_7B).phase_s["update_actor"]


def test_megatron_pipeline_bubble_shrinks_with_vpp():
    pp = step(MEGATRON_7B.with_(actor_pp=2)).phase_s["update_actor"]
    vpp = step(MEGATRON_7B.with_(actor_pp=2, actor_vpp=2)).phase_s["update_actor"]
    assert vpp < pp


def test_more_gpus_shorten_the_step_for_a_fixed_batch():
    times = [step(DEFAULT_7B, nodes=n).step_s for n in (1, 2, 4)]
    assert all(a > b for a, b in itertools.pairwise(times)), times


# ---- bugs (reported) ----------------------------------------------------------------------------------

def test_megatron_ref_offload_moves_a_bigger_shard_than_fsdp():
    def ref_offload_extra_s(cand: Candidate) -> float:
        return step(cand.with_(ref_param_offload=True)).phase_s["ref"] - step(cand).phase_s["ref"]

    # FSDP on 8 GPUs holds 1/8 of the ref per GPU; Megatron TP 1 PP 1 holds all of it
    assert ref_offload_extra_s(MEGATRON_7B) > 4 * ref_offload_extra_s(DEFAULT_7B)


def test_megatron_syncs_gradients_and_parameters_at_every_optimizer_step():
    """verl 0.9.1 steps the optimizer once per mini-batch (workers/engine_workers.py:287-314, engine/base.py:128):
    each step reduce-scatters the gradients over DP and all-gathers the updated bf16 parameters (the distributed
    optimizer, verl's default). Before, the model paid one gradient sync per full-batch pass, whatever the number of
    mini-batches. Here a DP group across 4 nodes, 4 optimizer steps against 1."""
    from autotune.model.cost import _collective_s, _link, _parallel_comm_s
    from autotune.model.memory import actor_state_bytes

    cand = MEGATRON_7B.with_(actor_tp=8)
    from dataclasses import replace

    one, four = replace(WL, ppo_mini_batch_size=WL.train_batch_size), replace(WL, ppo_mini_batch_size=WL.train_batch_size // 4)
    layout = ParallelLayout.of(cand, one, gpus_per_node=8, nodes=4)
    hidden = {}
    for name, wl in (("one", one), ("four", four)):
        hidden[name], _ = _parallel_comm_s(Q7B, H200, cand, layout, workload=wl, n_micro=8, tok_micro=4096,
                                           forward_only=False, k=DEFAULT_CONSTANTS)
    state = actor_state_bytes(Q7B, cand, layout, one)
    link = _link(H200, layout.world_size, layout.gpus_per_node)
    per_step = _collective_s(state.grads, 4, link, DEFAULT_CONSTANTS) + _collective_s(state.weights, 4, link,
                                                                                       DEFAULT_CONSTANTS)
    assert layout.dp == 4 and per_step > 0
    assert hidden["four"] - hidden["one"] == pytest.approx(3 * per_step)


def test_attention_counts_the_mean_of_squared_lengths_where_responses_vary():
    """verl's FLOP counter sums each sequence's own length squared (utils/flops_counter.py seqlen_square_sum); the
    model priced attention at the mean length squared, too little where responses vary. An exponential-like spread
    (variance the mean squared) where the cap leaves room; none when every response runs to the cap."""
    from dataclasses import replace

    from autotune.model.cost import mean_square_seq_len

    long = Workload(max_prompt_length=1024, prompt_fill=0.25, max_response_length=32768, mean_response_length=8000)
    assert mean_square_seq_len(long) == pytest.approx((256 + 8000) ** 2 + 8000 ** 2)
    near_cap = replace(long, mean_response_length=30000)  # at most mean x (cap - mean) (Bhatia-Davis)
    assert mean_square_seq_len(near_cap) == pytest.approx((256 + 30000) ** 2 + 30000 * 2768)
    at_cap = replace(long, mean_response_length=None)
    assert mean_square_seq_len(at_cap) == pytest.approx(at_cap.mean_seq_len ** 2)
    rmpad = DEFAULT_7B.with_(use_remove_padding=True)
    spread, uniform = step(rmpad, workload=long), step(rmpad, workload=replace(long, max_response_length=8000))
    # the same mean: the spread's attention costs more in every training pass, and verl's MFU counts it
    assert spread.phase_s["update_actor"] > 1.05 * uniform.phase_s["update_actor"]
    assert spread.phase_s["old_log_prob"] > 1.05 * uniform.phase_s["old_log_prob"]
