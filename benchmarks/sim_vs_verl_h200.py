"""The sim against the one real verl step (verl 0.9.1 + vLLM 0.24, one H200, 2026-12-03; no GPU needed to run this).

    python benchmarks/sim_vs_verl_h200.py > benchmarks/results/sim_vs_verl_h200.txt

Measured: step 2 of trial 0 in benchmarks/results/h200-2026-12-03-verl/trial0-metrics.jsonl (verl's timing_s/*), whose
configuration is trial0-probe.yaml: Qwen2.5-1.5B shapes, 32 prompts x 4, prompt cap 256 (mean prompt 72 tokens,
verl's prompt_length/mean), 512-token responses (ignore_eos), FSDP, micro 4 / log-prob 8, checkpointing, no
remove-padding, vLLM share 0.5, rollout TP 1, enforce_eager (not a knob of the model: it prices CUDA graphs).
calibration.py's fsdp_micro_batch_host_s and weight_sync_fixed_s were measured on this step, so those phases agree
by construction; gen is the held-out part.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotune.hardware import get_gpu
from autotune.model.cost import estimate_step_time
from autotune.models import get_model
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

METRICS = Path(__file__).parent / "results" / "h200-2026-12-03-verl" / "trial0-metrics.jsonl"


def compare() -> tuple[dict, object]:
    """(verl's metrics of step 2, the sim's StepTime for that job)."""
    steps = [json.loads(line) for line in METRICS.read_text().splitlines() if line.strip()]
    m = steps[-1].get("data", steps[-1])  # step 2: step 1 includes warm-up
    workload = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=256,
                        max_response_length=512, prompt_fill=m["prompt_length/mean"] / 256, use_kl_loss=True)
    cand = Candidate(actor_engine="fsdp", ppo_micro_batch_size_per_gpu=4, log_prob_micro_batch_size_per_gpu=8,
                     ref_log_prob_micro_batch_size_per_gpu=8, gradient_checkpointing=True, gpu_memory_utilization=0.5,
                     use_remove_padding=False, rollout_tp=1, max_num_seqs=256, max_num_batched_tokens=8192)
    layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
    return m, estimate_step_time(get_model("qwen2.5-1.5b"), get_gpu("H200"), workload, cand, layout)


def main() -> int:
    m, step = compare()
    print(f"real verl step 2 ({METRICS.relative_to(Path(__file__).parents[1])}) against the sim:")
    print(f"{'':16s} {'measured':>9s} {'sim':>9s} {'sim/meas':>9s}")
    for phase in ("gen", "old_log_prob", "ref", "update_actor", "update_weights"):
        measured = m[f"timing_s/{phase}"]
        print(f"{phase + ' s':16s} {measured:9.2f} {step.phase_s[phase]:9.2f} {step.phase_s[phase] / measured:9.2f}")
    print(f"{'step s':16s} {m['timing_s/step']:9.2f} {step.step_s:9.2f} {step.step_s / m['timing_s/step']:9.2f}")
    print(f"{'actor MFU':16s} {m['perf/mfu/actor']:9.3f} {step.mfu_actor:9.3f} {step.mfu_actor / m['perf/mfu/actor']:9.2f}")
    gen_steps = m["response_length/max"]
    print(f"gen per decode step: measured {m['timing_s/gen'] / gen_steps * 1e3:.1f} ms, sim {step.phase_s['gen'] / gen_steps * 1e3:.1f} ms"
          " (every response 512 tokens, all 128 in one wave)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
