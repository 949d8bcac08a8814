"""Issue 29's held-out job against the model, before any probe of it (no GPU needed).

    PYTHONPATH=benchmarks:. python benchmarks/heldout_job_h200.py > benchmarks/results/heldout_job_h200.txt

Issue 29 opens with a job its author ran on real verl 0.9.1 on one H200 and autotune never saw: Qwen2.5-1.5B shapes,
16 prompts x 8 responses of up to 1,024 tokens, dynamic batching (4096 / 8192 tokens per GPU), no KL, FSDP, vLLM
share 0.6, SDPA without remove-padding; step 2 measured gen 8.1 s, old_log_prob 10.6, update_actor 36.7,
update_weights 0.4, step 56.0, GPU peak 103.6 GiB (NVML). `verl_h200/run_other_grpo.sh` is that job as a launch script
(assumed where the issue is silent: 256-token prompts, mini-batch 8, gradient checkpointing on, vLLM with CUDA graphs,
verl's default: its gen of 8.1 s for 1,024 decode steps is what CUDA graphs give on this node, where the eager recipe
job took 19.7 ms a step). It is read as `autotune run --from` reads it, and priced as a verl study on that node would:
the per-token log-prob loop (no flash-attn cross-entropy there), without and with the node profile that the 18
configurations of the 2026-12-05 shared study (another job: 32 x 4, 512 tokens, KL, eager vLLM) leave under this model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna

from autotune.cli import load_user_job
from autotune.hardware import get_gpu
from autotune.model.cost import estimate_step_time
from autotune.model.memory import estimate_memory
from autotune.spaces.layout import ParallelLayout
from autotune.verl.rollout import vllm_eager

sys.path.insert(0, str(Path(__file__).parent))
from node_profile_h200 import SOURCE_DB, logged_lengths, profile_factors, rows_at_lengths, source_cfg  # noqa: E402

SCRIPT = Path(__file__).parent / "verl_h200" / "run_other_grpo.sh"
# issue 29's table: real verl 0.9.1 on one H200, step 2 (measured by the issue's author)
MEASURED_S = {"gen": 8.1, "old_log_prob": 10.6, "update_actor": 36.7, "update_weights": 0.4}
MEASURED_STEP_S, MEASURED_PEAK_GIB = 56.0, 103.6
BEFORE = {"gen": 7.5, "old_log_prob": 1.7, "update_actor": 13.4, "update_weights": 0.3, "step": 25.0}  # the issue's
WITHIN = 1.25


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{SOURCE_DB}"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    # each of the profile's probes priced at the lengths it ran (verl's logs of that study: search/node_prior.py)
    rows, others, probes = rows_at_lengths(study, source_cfg(study, loop=True), logged_lengths(SOURCE_DB))
    job = load_user_job(SCRIPT, [], "qwen2.5-1.5b", exporting=False)
    # the profile's study ran vLLM eager, this job with CUDA graphs: its gen rows are not this job's prior
    factor = profile_factors(rows, others, probes, eager_decode=vllm_eager(job.passthrough))
    gpu = get_gpu("H200")
    layout = ParallelLayout.of(job.baseline, job.workload, gpus_per_node=1, nodes=1)
    step = estimate_step_time(job.model, gpu, job.workload, job.baseline, layout, logprob_loop=True,
                              vllm_eager=vllm_eager(job.passthrough))
    mem = estimate_memory(job.model, gpu, job.workload, job.baseline, layout)
    print(f"{SCRIPT.name}: the node profile from {probes} probes of {SOURCE_DB.parent.name} (another job)")
    print(f"{'phase':15s} {'measured s':>10s} {'issue (old model)':>18s} {'model now':>14s} {'with profile':>14s}")
    errors = {"without": [], "with": []}
    for phase, measured in MEASURED_S.items():
        bare = step.phase_s[phase]
        fixed = bare * factor.get(phase, 1.0)
        errors["without"].append(max(bare / measured, measured / bare))
        errors["with"].append(max(fixed / measured, measured / fixed))
        print(f"{phase:15s} {measured:10.1f} {BEFORE[phase]:8.1f} (x{BEFORE[phase] / measured:.2f}) "
              f"{bare:6.1f} (x{bare / measured:.2f}) {fixed:6.1f} (x{fixed / measured:.2f})")
    fixed_step = step.step_s + sum(s * (factor.get(p, 1.0) - 1.0) for p, s in step.phase_s.items())
    print(f"{'step':15s} {MEASURED_STEP_S:10.1f} {BEFORE['step']:8.1f} (x{BEFORE['step'] / MEASURED_STEP_S:.2f}) "
          f"{step.step_s:6.1f} (x{step.step_s / MEASURED_STEP_S:.2f}) {fixed_step:6.1f} (x{fixed_step / MEASURED_STEP_S:.2f})")
    print(f"GPU peak: measured {MEASURED_PEAK_GIB} GiB, model {mem.peak_gib:.1f} GiB (x{mem.peak_gib / MEASURED_PEAK_GIB:.2f})")
    for label, values in errors.items():
        print(f"{label:8s} the profile: phases within {WITHIN}x {sum(v <= WITHIN for v in values)}/{len(values)}, "
              f"worst x{max(values):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
