"""Issue 16: tensor parallelism's compute, other GPUs, response-length distribution, MoE decode, two memory answers."""

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import load_tune_yaml
from autotune.errors import ConfigError
from autotune.estimate import estimate, render
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.model.calibration import DEFAULT_CONSTANTS
from autotune.model.cost import (_pass_parts, decode_steps, estimate_step_time, experts_touched,
                                      gpu_curve_factors, matmul_rate_factor, train_mfu)
from autotune.model.memory import estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload


def _megatron(model_name: str, gpu_name: str, tp: int, workload: Workload, micro: int):
    model, gpu = get_model(model_name), get_gpu(gpu_name)
    cand = Candidate(actor_engine="megatron", actor_tp=tp, rollout_tp=tp, ppo_micro_batch_size_per_gpu=micro,
                     log_prob_micro_batch_size_per_gpu=micro, ref_log_prob_micro_batch_size_per_gpu=micro)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=8, nodes=1)
    return model, gpu, cand, layout


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_name=st.sampled_from(["qwen2.5-7b", "qwen2.5-32b", "qwen3-32b", "llama-3.1-8b", "qwen3-30b-a3b"]),
       gpu_name=st.sampled_from(["H200", "H100-80GB", "H20", "A100-80GB"]),
       micro=st.sampled_from([1, 2, 8]), response=st.sampled_from([512, 2048, 6144]),
       forward_only=st.booleans())
def test_a_tp_step_never_makes_compute_slower_than_the_previous_tp_plus_its_communication(
        model_name, gpu_name, micro, response, forward_only):
    workload = Workload(train_batch_size=64, ppo_mini_batch_size=32, rollout_n=4, max_response_length=response)
    previous = None
    for tp in (1, 2, 4, 8):
        model, gpu, cand, layout = _megatron(model_name, gpu_name, tp, workload, micro)
        p = _pass_parts(model, gpu, workload, cand, layout, forward_only=forward_only, k=DEFAULT_CONSTANTS)
        if previous is not None:
            # per token of the job: the same tokens on the same 8 GPUs, so per rank-pass seconds compare
            assert p.compute_s <= previous.compute_s * (1 + 1e-9)
            assert p.total_s <= previous.total_s + p.comm_critical_s + p.comm_hidden_s + 1e-9
        previous = p


def test_the_32b_tp8_h20_step_is_within_2x_of_first_principles():
    # verl's examples/tuning 32B script on 8 H20: 2560 trajectories of 0.4 x 2048 + 6144 tokens. Update +
    # two forward passes ~ 6.3e18 FLOPs (6N per token, N = 33e9, plus attention); at MFU 0.3-0.4 of 8 x 148e12
    # that is 3.7-4.9 h, plus ~0.8 h of generation: 4.5-5.7 h.
    model, gpu = get_model("qwen2.5-32b"), get_gpu("H20")
    workload = Workload(train_batch_size=512, ppo_mini_batch_size=256, rollout_n=5, max_prompt_length=2048,
                        max_response_length=6144)
    cand = Candidate(actor_engine="megatron", actor_tp=8, rollout_tp=8, gpu_memory_utilization=0.6,
                     ppo_micro_batch_size_per_gpu=1, log_prob_micro_batch_size_per_gpu=1,
                     ref_log_prob_micro_batch_size_per_gpu=1, param_offload=True, optimizer_offload=True)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=8, nodes=1)
    hours = estimate_step_time(model, gpu, workload, cand, layout).step_s / 3600
    assert 4.5 / 2 <= hours <= 5.7 * 2


def test_the_curve_is_the_h200_fit_on_the_h200_and_rescaled_elsewhere():
    assert gpu_curve_factors(get_gpu("H200")) == pytest.approx((1.0, 1.0))
    t_h20, ceil_h20 = gpu_curve_factors(get_gpu("H20"))
    assert t_h20 < 0.25 and ceil_h20 > 1.1  # H20: compute-poor, bandwidth-rich: saturates sooner, higher ceiling
    assert train_mfu(1000, 3584, gpu=get_gpu("H20")) > train_mfu(1000, 3584)


def test_a_gpu_whose_gemms_reach_less_of_its_peak_trains_and_prefills_slower():
    # AMD's Max-Achievable FLOPs: the MI300X's best bf16 GEMM reaches 708 of its 1307 TFLOP/s (0.54), where the H200's
    # reached ~0.8 here; the data-sheet peak alone made the MI300X's update 1.3x faster than the H200's
    mi300x = _benchmark("sim_vs_published").MI300X
    as_if_h200_rate = replace(mi300x, matmul_peak_fraction=None)
    assert matmul_rate_factor(mi300x) == pytest.approx(708e12 / 1307.4e12 / 0.8)
    assert matmul_rate_factor(get_gpu("H200")) == 1.0
    assert gpu_curve_factors(mi300x)[1] < 0.75 * gpu_curve_factors(as_if_h200_rate)[1]
    model, workload = get_model("qwen2.5-7b"), Workload(max_prompt_length=2048, max_response_length=2048)
    cand = Candidate(ppo_micro_batch_size_per_gpu=8, log_prob_micro_batch_size_per_gpu=16,
                     ref_log_prob_micro_batch_size_per_gpu=16)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=8, nodes=1)
    slow = estimate_step_time(model, mi300x, workload, cand, layout).phase_s
    fast = estimate_step_time(model, as_if_h200_rate, workload, cand, layout).phase_s
    assert slow["update_actor"] > 1.3 * fast["update_actor"]
    assert slow["old_log_prob"] > 1.3 * fast["old_log_prob"]
    assert slow["gen"] > fast["gen"]  # prefill and the batch's decode matmuls; the weight reads are unchanged


def test_moe_decode_reads_nearly_all_experts_at_batch_32():
    model = get_model("qwen3-30b-a3b")
    assert experts_touched(model, 1) == pytest.approx(8 / 128)
    assert experts_touched(model, 32) > 0.85
    assert experts_touched(get_model("qwen2.5-7b"), 32) == 1.0


def test_decode_steps_equal_waves_of_max_length_when_every_response_is_max():
    assert decode_steps(100, 100, 1024, 1024) == 1024
    assert decode_steps(128, 100, 1024, 1024) == 2 * 1024
    # shorter mean: the slots refill, and the last admitted long response sets the end
    assert decode_steps(1000, 100, 500, 1024) == 9 * 500 + 1024


def test_a_shorter_mean_response_shortens_the_step_but_memory_is_gated_at_max():
    model, gpu = get_model("qwen2.5-7b"), get_gpu("H100-80GB")
    at_max = Workload(max_response_length=1024)
    typical = replace(at_max, mean_response_length=680)
    cand = Candidate(gpu_memory_utilization=0.5, ppo_micro_batch_size_per_gpu=8)
    layout = ParallelLayout.of(cand, at_max, gpus_per_node=8, nodes=1)
    assert (estimate_step_time(model, gpu, typical, cand, layout).step_s
            < estimate_step_time(model, gpu, at_max, cand, layout).step_s)
    assert estimate_memory(model, gpu, typical, cand, layout).peak_gib == estimate_memory(model, gpu, at_max, cand, layout).peak_gib
    assert (estimate_memory(model, gpu, typical, cand, layout, typical=True).phase_peak_gib["update_actor"]
            < estimate_memory(model, gpu, at_max, cand, layout).phase_peak_gib["update_actor"])


def test_estimate_says_fits_at_the_mean_and_oom_at_max_length():
    model, gpu = get_model("qwen2.5-7b"), get_gpu("H100-80GB")
    workload = Workload(train_batch_size=64, ppo_mini_batch_size=64, rollout_n=5, max_response_length=4096,
                        mean_response_length=600)
    # find a micro-batch that fits only at the mean
    for micro in (4, 8, 16, 32, 64):
        cand = Candidate(ppo_micro_batch_size_per_gpu=micro, use_remove_padding=True, gpu_memory_utilization=0.3)
        e = estimate(model, gpu, workload, cand, gpus_per_node=8, nodes=1)
        if e.typical_fits and not e.fits:
            text = render(e, "job.sh", ())
            assert "fits at mean 600; OOM if responses reach 4096" in text
            return
    pytest.fail("no micro-batch fits at the mean but not at max length")


def test_lora_prints_verl_mfu_and_model_flops_mfu():
    model, gpu = get_model("qwen2.5-7b"), get_gpu("H200")
    workload = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_response_length=128, lora_rank=32)
    cand = Candidate(ppo_micro_batch_size_per_gpu=32)
    e = estimate(model, gpu, workload, cand, gpus_per_node=1, nodes=1)
    assert e.mfu_actor_model_flops == pytest.approx(e.mfu_actor * 4 / 6)
    assert "as verl reports it (model-FLOPs utilisation" in render(e, "job.sh", ())


def test_tune_yaml_takes_response_length_mean_and_max(tmp_path):
    path = tmp_path / "tune.yaml"
    path.write_text("workload: {response_length: {mean: 680, max: 1024}}\n")
    w = load_tune_yaml(path).workload
    assert (w.mean_response_length, w.max_response_length) == (680, 1024)
    path.write_text("workload: {response_length: {mean: 2000, max: 1024}}\n")
    with pytest.raises(ConfigError, match="mean_response_length"):
        load_tune_yaml(path)


def test_estimate_cli_takes_the_mean_response_length(capsys):
    from autotune.cli import main

    assert main(["estimate", "--from", "tests/data/verl_examples/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh",
                 "--gpus", "1", "--gpu", "H100-80GB", "--mean-response-length", "500"]) == 0
    out = capsys.readouterr().out
    assert "at mean 500" in out and "as verl reports it (model-FLOPs utilisation" in out


def _benchmark(name: str):
    """A benchmark script of benchmarks/ as a module (they are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[2] / "benchmarks" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _published_rows():
    """(the published-runs benchmark module, its rows as it prices them)."""
    import yaml

    bench = _benchmark("sim_vs_published")
    rows, _ = bench.rows_of(yaml.safe_load(bench.DATA.read_text()))
    return bench, rows


def test_the_published_runs_benchmark_meets_its_goal():
    import statistics

    bench, rows = _published_rows()
    # issue 16's bar: >= 12 runs, >= 3 sources of >= 3 publishers, >= 2 GPU types, dense and MoE
    assert len(rows) >= 12 and len({r["source"] for r in rows}) >= 3 and len({r["gpu"] for r in rows}) >= 2
    assert len({r["publisher"] for r in rows}) >= 3
    assert {r["job"][0].is_moe for r in rows} == {True, False}
    ratios = bench.ratios(rows, DEFAULT_CONSTANTS)
    assert 0.8 <= statistics.median(ratios) <= 1.25  # docs/model.md: median 0.93 over the 22 rows
    assert all(0.5 <= r <= 2.0 for r in ratios)  # every row since the eager decode is priced (DeepSeek-V3: 0.55)


def test_the_deepseek_v3_row_with_a_published_mean_meets_the_goal():
    # 0.33 (gen 433 s of the published 1050) while the model priced its eager vLLM as CUDA graphs; 0.55 (gen 809 s)
    # with the eager decode term fitted on the H200 recipe job, a 1.5B model (benchmarks/fit_eager_decode.py). The
    # model's other phases still sum to 121 s where the published step leaves 650 s beside gen.
    bench, rows = _published_rows()
    (row,) = [r for r in rows if r["id"] == "verl-dsv3-671b-h20-96"]
    (ratio,) = bench.ratios([row], DEFAULT_CONSTANTS)
    assert 0.5 <= ratio <= 2.0
    gen_ratio = bench.step_of(row).phase_s["gen"] / row["published"]["gen_s"]
    assert 0.67 <= gen_ratio <= 1.5  # issue 30's per-phase goal


@pytest.mark.xfail(strict=True, reason="issue 30, open: the model's training passes are 1.4-1.7x faster than verl's "
                   "published held-out runs (A800: old_log_prob 0.62, ref 0.62, update_actor 0.71 of published, gen 0.79; "
                   "MI300X, at AMD's reachable GEMM rate: 0.65, 0.64, 0.59, gen 0.64)")
@pytest.mark.parametrize("row_id", ["verl-vl7b-a800-8", "verl-7b-mi300x-8"])
def test_the_rows_nobody_fitted_on_meet_the_per_phase_goal(row_id):
    # verl PR 2049's log (Qwen2.5-VL-7B, 8 A800s) and the MI300 baseline log linked from verl's docs (deepseek-llm-7b,
    # 8 MI300s): phases and response_length/mean published; held out, fit: false
    bench, rows = _published_rows()
    (row,) = [r for r in rows if r["id"] == row_id]
    assert row not in bench.fit_rows(rows)
    phases = bench.step_of(row).phase_s
    for phase in ("gen", "old_log_prob", "ref", "update_actor"):
        assert 0.67 <= phases[phase] / row["published"][f"{phase}_s"] <= 1.5, phase


def test_rows_whose_mean_is_inferred_are_never_fitted_on():
    """Issue 30: a phase row's mean response is inferred from its published old_log_prob, which gave 1.38x and 1.51x
    the real mean where it could be checked; the benchmark's fits (all rows, leave-one-out) use only published means."""
    bench, rows = _published_rows()
    used = bench.fit_rows(rows)
    assert used and all("implied_mean" not in r for r in used)
    assert any("implied_mean" in r for r in rows)


def test_the_model_peak_against_the_gpus_on_real_verl_probes():
    """verl 0.9.1 + vLLM on one H200 (benchmarks/results/h200-2026-12-03-verl-2): the model's whole-GPU peak against
    NVML's used memory over each probe (every process: trainer and vLLM server), none of them fitted on."""
    bench = _benchmark("sim_vs_verl_h200")
    checked = 0
    for folder, trial, nvml_peak_gib, _ in bench.TRIALS:
        if nvml_peak_gib is None:
            continue
        _, workload, cand = bench.study_row(folder, trial)
        layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
        memory = estimate_memory(get_model("qwen2.5-1.5b"), get_gpu("H200"), workload, cand, layout)
        assert 0.92 <= memory.peak_gib / nvml_peak_gib <= 1.08, (folder, trial, memory.peak_gib, nvml_peak_gib)
        checked += 1
    assert checked == 3


def test_a_kv_bound_concurrency_a_hair_below_the_sequences_costs_a_hair_not_a_wave():
    """Issue 30: 127.9 concurrent sequences for 128 (KV-bound) cost a whole second wave (gen 233 s against 139 s
    at 0.05 more gpu_memory_utilization on the v07-qwen3-30b-a3b-32 row). vLLM fills the KV cache block by block,
    so the extra is a fraction of a wave; hard max_num_seqs slots with every response at the cap stay whole."""
    assert decode_steps(128, 127.9, 3000, 3584, hard_slots=False) == pytest.approx(
        (128 / 127.9 - 1) * 3000 + 3584)
    assert decode_steps(128, 100, 1024, 1024, hard_slots=True) == 2 * 1024
    near = decode_steps(128, 127.9, 3000, 3584, hard_slots=False)
    assert near < 1.01 * decode_steps(128, 128, 3000, 3584, hard_slots=False)


def test_gen_stops_growing_with_the_cap_at_a_fixed_mean():
    """Issue 30: at a fixed mean the longest response is the expected longest of the replica's responses (the
    exponential's mean x harmonic number), not the cap: gen grew linearly with max_response_length."""
    from autotune.model.cost import expected_longest
    from autotune.spaces.space import verl_default_candidate

    assert expected_longest(1, 1000, 8192) == 1000
    assert expected_longest(1280, 1000, 16384) == pytest.approx(1000 * (math.log(1280) + 0.5772156649 + 1 / 2560))
    assert expected_longest(1280, 1000, 4096) == 4096 and expected_longest(64, 1024, 1024) == 1024
    model, gpu = get_model("qwen2.5-7b"), get_gpu("H200")
    gen = {}
    for cap in (2048, 8192, 16384, 32768):
        w = Workload(max_response_length=cap, mean_response_length=1000)
        cand = verl_default_candidate(model, w, gpus_per_node=8, nodes=1)
        gen[cap] = estimate_step_time(model, gpu, w, cand, ParallelLayout.of(cand, w, gpus_per_node=8, nodes=1)
                                      ).phase_s["gen"]
    assert gen[2048] < gen[8192]
    assert gen[16384] == pytest.approx(gen[8192]) and gen[32768] == pytest.approx(gen[8192])
