"""The sim against every measured real verl probe (verl 0.9.1 + vLLM 0.24, one H200, 2026-12-03 and 2026-12-06; no
GPU needed), priced as for a node with flash-attn and as for what these nodes were (no flash-attn: verl's per-token
log-prob loop).

    PYTHONPATH=benchmarks python benchmarks/sim_vs_verl_h200.py > benchmarks/results/sim_vs_verl_h200.txt

Measured: step 2 of each measured trial in benchmarks/results/h200-2026-12-03-verl*/ (verl's timing_s/*,
metrics.jsonl) and the GPU's peak from the study's NVML samples where the probe kept them; each trial's
configuration is read from its probe.yaml (what verl ran). The job: Qwen2.5-1.5B shapes, 32 prompts x 4, prompt cap
256 (verl's prompt_length/mean read per step), 512-token responses (ignore_eos), no remove-padding, rollout TP 1,
enforce_eager (not a knob of the model: it prices CUDA graphs).
calibration.py's weight_sync_fixed_s was measured on the FIRST study's trial 0 (*). A per-micro-batch host constant
fitted on that row alone was dropped: the held-out probes of the second study took as long in old_log_prob with 2
micro-batches as that row with 16 (5.3 s each), so the missing time is per token, not per micro-batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from autotune.hardware import get_gpu
from autotune.model.cost import estimate_step_time
from autotune.model.memory import estimate_memory
from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

RESULTS = Path(__file__).parent / "results"
# (study folder, trial, GPU peak from NVML in GiB or None, whether the host constants were fitted on it)
TRIALS = [("h200-2026-12-03-verl", 0, None, True),
          ("h200-2026-12-03-verl-2", 0, 89.81, False),
          ("h200-2026-12-03-verl-2", 1, 115.90, False),
          ("h200-2026-12-03-verl-2", 2, 120.24, False)]
# launches of the recipe's job on one H200, 2026-12-06: (label, console log under results/, the launch's overrides)
LAUNCHES = [("12-06 job (not fused)", "h200-2026-12-06-fused/rmpad_off.log", []),
            ("12-06 job, fused kernels", "h200-2026-12-06-fused/fused_logprob.log",
             ["actor_rollout_ref.model.use_fused_kernels=True"])]
SCRIPT = Path(__file__).parent / "verl_h200" / "run_tiny_grpo.sh"
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


def job_of(probe_yaml: Path, prompt_mean: float) -> tuple[Workload, Candidate]:
    """The workload and system knobs verl ran, from the probe's own config file."""
    cfg = yaml.safe_load(probe_yaml.read_text())
    aro, data = cfg["actor_rollout_ref"], cfg["data"]
    actor, rollout, model = aro["actor"], aro["rollout"], aro["model"]
    workload = Workload(train_batch_size=data["train_batch_size"], ppo_mini_batch_size=actor["ppo_mini_batch_size"],
                        rollout_n=rollout["n"], max_prompt_length=data["max_prompt_length"],
                        max_response_length=data["max_response_length"],
                        prompt_fill=prompt_mean / data["max_prompt_length"], use_kl_loss=actor["use_kl_loss"])
    cand = Candidate(actor_engine=actor["strategy"],
                     ppo_micro_batch_size_per_gpu=actor["ppo_micro_batch_size_per_gpu"],
                     log_prob_micro_batch_size_per_gpu=rollout["log_prob_micro_batch_size_per_gpu"],
                     ref_log_prob_micro_batch_size_per_gpu=aro["ref"]["log_prob_micro_batch_size_per_gpu"],
                     gradient_checkpointing=model["enable_gradient_checkpointing"],
                     gpu_memory_utilization=rollout["gpu_memory_utilization"],
                     use_remove_padding=model["use_remove_padding"], rollout_tp=rollout["tensor_model_parallel_size"],
                     max_num_seqs=rollout["max_num_seqs"], max_num_batched_tokens=rollout["max_num_batched_tokens"])
    return workload, cand


def study_row(folder: str, trial: int) -> tuple[dict, Workload, Candidate]:
    """(verl's metrics of step 2, the workload, the configuration) of one study trial."""
    run = RESULTS / folder
    steps = [json.loads(line) for line in (run / f"trial{trial}-metrics.jsonl").read_text().splitlines() if line.strip()]
    m = steps[-1].get("data", steps[-1])  # step 2: step 1 includes warm-up
    workload, cand = job_of(run / f"trial{trial}-probe.yaml", m["prompt_length/mean"])
    return m, workload, cand


def launch_row(log: str, overrides: list[str]) -> tuple[dict, Workload, Candidate]:
    """(step 2's metrics, workload, configuration) of a launch of run_tiny_grpo.sh with `overrides`, the job read by
    autotune's own script import (what `autotune run --from` reads)."""
    from dataclasses import replace

    from autotune.cli import load_user_job
    from verl_phase_gap import step_metrics

    m = step_metrics(RESULTS / log, 2)
    job = load_user_job(SCRIPT, overrides, "qwen2.5-1.5b", exporting=False)
    workload = replace(job.workload, prompt_fill=m["prompt_length/mean"] / job.workload.max_prompt_length)
    return m, workload, job.baseline


def rows() -> list[tuple[str, dict, Workload, Candidate, float | None]]:
    out = [(f"{folder.removeprefix('h200-2026-12-03-')} trial {trial}{'*' if fitted else ''}",
            *study_row(folder, trial), peak) for folder, trial, peak, fitted in TRIALS]
    for label, log, overrides in LAUNCHES:
        out.append((label, *launch_row(log, overrides), None))
    return out


def table(loop: bool) -> None:
    model, gpu = get_model("qwen2.5-1.5b"), get_gpu("H200")
    print(f"{'probe':28s} {'tok/s/GPU':>16s} {'step s':>16s} " + " ".join(f"{p:>15s}" for p in PHASES)
          + f" {'GPU peak GiB':>17s}")
    for label, m, workload, cand, nvml_peak in rows():
        layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
        # every row is run_tiny_grpo.sh, which runs vLLM eager (rollout.enforce_eager=True)
        step = estimate_step_time(model, gpu, workload, cand, layout, logprob_loop=loop, vllm_eager=True)
        mem = estimate_memory(model, gpu, workload, cand, layout)
        tps = step.tokens_per_s_per_gpu
        cells = [f"{m['perf/throughput']:5.0f} {tps:5.0f} {tps / m['perf/throughput']:4.2f}",
                 f"{m['timing_s/step']:5.1f} {step.step_s:5.1f} {step.step_s / m['timing_s/step']:4.2f}"]
        cells += [f"{m[f'timing_s/{p}']:4.1f} {step.phase_s[p]:4.1f} {step.phase_s[p] / m[f'timing_s/{p}']:4.2f}"
                  for p in PHASES]
        peak = (f"{nvml_peak:5.1f} {mem.peak_gib:5.1f} {mem.peak_gib / nvml_peak:4.2f}" if nvml_peak
                else f"{'-':>5s} {mem.peak_gib:5.1f} {'-':>4s}")
        print(f"{label:28s} " + " ".join(f"{c:>16s}" if i < 2 else f"{c:>15s}" for i, c in enumerate(cells))
              + f" {peak:>17s}")


def main() -> int:
    print("real verl step 2 of every measured probe against the sim (sim/measured; * = weight-sync latency measured here)")
    print("\n## the sim as it prices a node with flash-attn (no per-token log-prob loop)")
    table(loop=False)
    print("\n## the sim told what these nodes were: no flash-attn, so verl's per-token log-prob loop "
          "(autotune/verl/logprob_path.py; model/cost.py logprob_loop_s)")
    table(loop=True)
    print("cells: measured, sim, sim/measured. GPU peak: NVML's used memory over the probe (every process: the trainer"
          " and vLLM's server); the first study's probes and the 2026-12-06 launches kept no NVML peak. The 2026-12-06"
          " rows ran on one H200 one after the other (benchmarks/results/h200-2026-12-06-fused); the loop's constants"
          " were measured on them (calibration.py logprob_loop_*), so only the 2026-12-03 rows are held out. Both"
          " tables price the job's eager vLLM (calibration.py eager_decode_s_per_layer, fitted on the 2026-12-05"
          " study, none of these rows).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
