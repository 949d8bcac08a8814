"""The sim model's step time against published GRPO runs on other machines (no GPU, seconds to run).

    python benchmarks/sim_vs_published.py > benchmarks/results/sim_vs_published.txt

Data: benchmarks/data/published_grpo_runs.yaml (every number read in the cited source; source URL per run).
Each run is mapped to a verl-style job (Megatron training, vLLM rollout, colocated) and the model predicts one
synchronous step. Printed: predicted / published step time per run, the published phases where the source
gives them, the median and range of the ratio, and leave-one-source-out: the fitted constants refitted without
a source, then that source predicted.

Mapping assumptions (not read in the sources; stated so they can be checked):
- generations per prompt 16 (NeMo-RL's GRPO default, grpo_math_1B.yaml num_generations_per_prompt), so
  train_batch_size = G-GBS / 16 prompts and ppo_mini_batch_size = T-GBS / 16;
- "G-Average Seq len" is prompt + response; prompts (OpenMathInstruct-2 problems) are taken as a 512-token cap
  filled to 0.3 (154 tokens), so mean response = G-Average - 154 and max response = T-Max - 512;
- NeMo-RL packs sequences up to max_total_sequence_length per micro-batch: dynamic batching with that many
  tokens per GPU (twice that for log-prob passes, verl's perf guide);
- vLLM share 0.6 (NeMo-RL's vllm_cfg default), verl's defaults for the rest (checkpointing on, reference model
  for the KL term);
- GB200 (not in autotune's GPU table): 2.5e15 dense bf16 FLOP/s, 186 GB HBM3e at 8 TB/s, NVLink 5 at 900 GB/s
  per direction across the NVL72 rack (one NVLink domain of 72 GPUs), NVLink-C2C to the Grace host
  (https://www.nvidia.com/en-us/data-center/gb200-nvl72/).

Fitted constants (few, physical, on every row unless left out): see FITTED below.
"""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from autotune.hardware import GpuSpec, get_gpu
from autotune.models import get_model
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import estimate_step_time
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

DATA = Path(__file__).parent / "data" / "published_grpo_runs.yaml"
GENERATIONS_PER_PROMPT = 16
PROMPT_CAP, PROMPT_FILL = 512, 0.3
VLLM_SHARE = 0.6
GB200 = GpuSpec(name="GB200", peak_bf16_flops=2.5e15, mem_gib=186e9 / 2**30, hbm_bytes_per_s=8.0e12,
                intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=50e9, host_link_bytes_per_s=450e9,
                source="https://www.nvidia.com/en-us/data-center/gb200-nvl72/")
NVLINK_DOMAIN = {"H100-80GB": 8, "GB200": 72}
# (section, field, grid): the constants fitted here, none per row
FITTED = [("rollout", "decode_hbm_efficiency", [0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.75]),
          ("rollout", "decode_step_overhead_s", [0.004, 0.008, 0.012, 0.016, 0.02, 0.03])]


# the values these constants had before they were fitted here (calibration.py's priors)
PRIORS = {("rollout", "decode_hbm_efficiency"): 0.75, ("rollout", "decode_step_overhead_s"): 0.004}


def gpu_of(name: str) -> GpuSpec:
    return GB200 if name == "GB200" else get_gpu(name)


def job(run: dict) -> tuple:
    """(model, gpu, workload, candidate, layout) of one published run."""
    model = get_model(run["model"])
    prompt_mean = PROMPT_CAP * PROMPT_FILL
    resp_max = run["t_max_seq"] - PROMPT_CAP
    resp_mean = min(run["g_avg_seq"] - prompt_mean, resp_max)
    prompts = run["g_gbs"] // GENERATIONS_PER_PROMPT
    workload = Workload(train_batch_size=prompts, ppo_mini_batch_size=max(run["t_gbs"] // GENERATIONS_PER_PROMPT, 1),
                        rollout_n=GENERATIONS_PER_PROMPT, max_prompt_length=PROMPT_CAP, max_response_length=resp_max,
                        mean_response_length=resp_mean, prompt_fill=PROMPT_FILL, use_kl_loss=True)
    t = run["train"]
    budget = run["t_max_seq"]
    cand = Candidate(actor_engine="megatron", actor_tp=t["tp"], actor_cp=t["cp"], actor_ep=t["ep"], actor_pp=t["pp"],
                     rollout_tp=run["gen_tp"], gpu_memory_utilization=VLLM_SHARE, use_dynamic_bsz=True,
                     ppo_max_token_len_per_gpu=budget, log_prob_max_token_len_per_gpu=2 * budget,
                     max_num_batched_tokens=max(8192, budget))
    # GPUs that share NVLink: the largest divisor of the job's GPUs within one NVLink domain (8 on a DGX-H100,
    # up to 72 on an NVL72 rack: 64 of them for a 128-GPU job)
    per_node = max(d for d in range(1, NVLINK_DOMAIN[run["gpu"]] + 1) if run["gpus"] % d == 0)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=per_node, nodes=run["gpus"] // per_node)
    return model, gpu_of(run["gpu"]), workload, cand, layout


def with_constants(values: dict) -> ModelConstants:
    k = DEFAULT_CONSTANTS
    for (section, name), value in values.items():
        k = replace(k, **{section: replace(getattr(k, section), **{name: value})})
    return k


def ratios(runs: list[dict], k: ModelConstants) -> list[float]:
    out = []
    for run in runs:
        model, gpu, workload, cand, layout = job(run)
        out.append(estimate_step_time(model, gpu, workload, cand, layout, constants=k).step_s / run["published"]["step_s"])
    return out


def fit(runs: list[dict]) -> dict:
    """The grid point of FITTED minimising the squared log ratios over these runs."""
    best, best_loss = None, math.inf
    keys = [(s, n) for s, n, _ in FITTED]
    for combo in itertools.product(*(grid for *_, grid in FITTED)):
        values = dict(zip(keys, combo))
        loss = sum(math.log(r) ** 2 for r in ratios(runs, with_constants(values)))
        if loss < best_loss:
            best, best_loss = values, loss
    return best


def summary(label: str, rs: list[float]) -> str:
    return (f"{label}: median {statistics.median(rs):.2f}, range {min(rs):.2f}-{max(rs):.2f}, "
            f"within 0.8-1.25: {sum(0.8 <= r <= 1.25 for r in rs)}/{len(rs)}, within 0.5-2.0: "
            f"{sum(0.5 <= r <= 2.0 for r in rs)}/{len(rs)}")


# verl's DAPO 7B experiment script (phase_sources in the data file): everything but the GPU count
DAPO_7B = dict(max_prompt_length=2048, max_response_length=28672, train_batch_size=512, rollout_n=16,
               ppo_mini_batch_size=32, use_kl_loss=False)
DAPO_7B_CANDIDATE = dict(actor_engine="fsdp2", ulysses_sp=4, rollout_tp=4, gpu_memory_utilization=0.8,
                         use_dynamic_bsz=True, ppo_max_token_len_per_gpu=61440, log_prob_max_token_len_per_gpu=92160,
                         param_offload=True, optimizer_offload=True, ref_param_offload=True,
                         max_num_batched_tokens=30720, enable_chunked_prefill=True, gradient_checkpointing=True)
DAPO_PROMPT_FILL = 0.1  # assumed: DAPO-Math-17k prompts of ~200 tokens against the 2048 cap


def phase_job(run: dict, mean_response: float) -> tuple:
    model = get_model(run["model"])
    workload = Workload(**DAPO_7B, prompt_fill=DAPO_PROMPT_FILL, mean_response_length=mean_response)
    cand = Candidate(**DAPO_7B_CANDIDATE)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=8, nodes=run["gpus"] // 8)
    return model, gpu_of(run["gpu"]), workload, cand, layout


def implied_mean(run: dict) -> float | None:
    """The mean response length at which the predicted old_log_prob equals the published one (bisection: the
    forward pass grows with the tokens), or None when no length in (0, max] gives it."""
    def old_log_prob(mean: float) -> float:
        return estimate_step_time(*phase_job(run, mean)).phase_s["old_log_prob"]
    lo, hi = 16.0, float(DAPO_7B["max_response_length"])
    target = run["published"]["old_log_prob_s"]
    if not old_log_prob(lo) <= target <= old_log_prob(hi):
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if old_log_prob(mid) < target else (lo, mid)
    return (lo + hi) / 2


def phase_rows(doc: dict) -> None:
    runs = doc.get("phase_runs") or []
    if not runs:
        return
    print("\nverl runs with published phases but no published mean response length: the mean is inferred from the "
          "published old_log_prob,\nthen gen, update_actor and the step are predictions (committed constants):")
    for name, src in doc["phase_sources"].items():
        print(f"  {name}: {src['url']}\n    configuration: {src['script']}")
    for run in runs:
        mean = implied_mean(run)
        if mean is None:
            print(f"  {run['id']}: no mean response length reproduces old_log_prob {run['published']['old_log_prob_s']} s")
            continue
        step = estimate_step_time(*phase_job(run, mean))
        pub = run["published"]
        cells = [f"{ph} {pub[ph + '_s']:.0f} sim {step.phase_s[ph]:.0f} ({step.phase_s[ph] / pub[ph + '_s']:.2f})"
                 for ph in ("gen", "update_actor")]
        print(f"  {run['id']:22s} implied mean response {mean:6.0f}: " + ", ".join(cells)
              + f", step {pub['step_s']:.0f} sim {step.step_s:.0f} ({step.step_s / pub['step_s']:.2f})")


def main() -> int:
    doc = yaml.safe_load(DATA.read_text())
    runs = doc["runs"]
    print(f"{len(runs)} published GRPO runs from {len(doc['sources'])} sources ({DATA.name}):")
    for name, src in doc["sources"].items():
        print(f"  {name}: {src['url']}")
    prior = ratios(runs, with_constants(PRIORS))
    default = ratios(runs, DEFAULT_CONSTANTS)
    fitted = fit(runs)
    k_fit = with_constants(fitted)
    print("\nfitted on all rows: " + ", ".join(f"{s}.{n} = {v}" for (s, n), v in fitted.items())
          + "  (defaults: " + ", ".join(f"{s}.{n} = {getattr(getattr(DEFAULT_CONSTANTS, s), n)}" for s, n, _ in FITTED)
          + ")")
    print(f"\n{'run':28s} {'GPUs':>9s} {'resp mean/max':>13s} {'published s':>11s} {'sim s':>8s} {'ratio':>6s} "
          f"{'prior':>6s}  sim phases (s)")
    fitted_ratios = []
    for run, r0 in zip(runs, prior):
        model, gpu, workload, cand, layout = job(run)
        step = estimate_step_time(model, gpu, workload, cand, layout, constants=k_fit)
        r1 = step.step_s / run["published"]["step_s"]
        fitted_ratios.append(r1)
        phases = ", ".join(f"{p} {v:.0f}" for p, v in step.phase_s.items())
        published_phases = {p: v for p, v in run["published"].items() if p not in ("step_s", "tokens_per_s_per_gpu")}
        print(f"{run['id']:28s} {run['gpus']:4d} {run['gpu'][:4]:4s} {workload.response_mean:6.0f}/{workload.max_response_length:<6d}"
              f" {run['published']['step_s']:11.1f} {step.step_s:8.1f} {r1:6.2f} {r0:6.2f}  {phases}"
              + (f"; published phases {published_phases}" if published_phases else "; published: step only"))
    print()
    print(summary("priors (before this fit)  ", prior))
    print(summary("committed constants       ", default))
    print(summary("fitted on all rows (above)", fitted_ratios))
    loso = []
    print("\nleave-one-source-out (constants fitted without the source, then its rows predicted):")
    for source in doc["sources"]:
        held = [r for r in runs if r["source"] == source]
        rest = [r for r in runs if r["source"] != source]
        values = fit(rest)
        rs = ratios(held, with_constants(values))
        loso += rs
        print(f"  {source:22s} fitted " + ", ".join(f"{n} {v}" for (_, n), v in values.items())
              + f": ratios {', '.join(f'{r:.2f}' for r in rs)}")
    print(summary("leave-one-source-out", loso))
    phase_rows(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
