#!/usr/bin/env python3
"""Issue 28: a shared launch's members scored at the launch's rollout, against separate launches (no GPU needed).

    PYTHONPATH=benchmarks:. python benchmarks/launch_rollout_h200.py > benchmarks/results/launch_rollout_h200.txt

verl 0.9.1 times `gen` on its replay buffer's 2-s poll grid (autotune/verl/metrics.py REPLAY_POLL_S). Reads the
2026-12-05 shared launch of 16 configurations on one H200 (benchmarks/results/h200-2026-12-05-verl-shared/runs/
trial0000/metrics.jsonl: step 1 warm-up, steps 2-17 one configuration each, step 18 the first again) and the
2026-12-06 separate launches on another H200 of two of them: the job (trial 0) and the exported best (trial 4), by
`autotune train` on the export (benchmarks/results/h200-2026-12-06-fused). Prints each step's tokens/s/GPU as verl
logged it and at the launch's rollout (with_launch_rollout), then the best-over-job ratio both ways. The two
separate launches are put at one rollout too (the median of their two gen times), which autotune does only within
a launch: here it shows what the poll grid does to a comparison of separate launches.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from autotune.verl.metrics import StepMetrics, launch_rollout, with_launch_rollout
from verl_phase_gap import step_metrics

RESULTS = Path(__file__).parent / "results"
LAUNCH = RESULTS / "h200-2026-12-05-verl-shared" / "runs" / "trial0000" / "metrics.jsonl"
SEPARATE = {"job": RESULTS / "h200-2026-12-06-fused" / "rmpad_off.log",
            "best": RESULTS / "h200-2026-12-06-fused" / "train_best.txt"}
JOB_STEPS, BEST_STEP = (2, 18), 4  # the launch's schedule (step_schedule.json): trial 0 at 2 and 18, trial 4 at 4


def launch_steps() -> list[StepMetrics]:
    rows = [json.loads(line) for line in LAUNCH.read_text().splitlines() if line.strip()]
    return [StepMetrics(step=r["step"], metrics=r["data"]) for r in rows if r["step"] >= 2]


def main() -> None:
    steps = launch_steps()
    rollout = launch_rollout(steps)
    print(f"# shared launch of 2026-12-05 (one H200): rollout at the launch's median gen {rollout[0]:.2f} s, "
          f"{rollout[1]:.0f} tokens")
    print("step | gen s | step s | tokens/s/GPU as logged | at the launch's rollout")
    at = {}
    for s in steps:
        at[s.step] = with_launch_rollout(s.metrics, rollout)
        print(f"{s.step} | {s.metrics['timing_s/gen']:.2f} | {s.metrics['timing_s/step']:.2f} | "
              f"{s.metrics['perf/throughput']:.1f} | {at[s.step]:.1f}")
    raw = {s.step: s.metrics["perf/throughput"] for s in steps}
    for label, values in (("as logged", raw), ("at the launch's rollout", at)):
        job = [values[k] for k in JOB_STEPS]
        print(f"the job's two steps {label}: {job[0]:.1f} and {job[1]:.1f}, spread "
              f"{(max(job) - min(job)) / statistics.mean(job):.1%}; best over job "
              f"x{values[BEST_STEP] / statistics.median(job):.3f}")
    separate = {name: step_metrics(path, 2) for name, path in SEPARATE.items()}
    pair = (statistics.median(m["timing_s/gen"] for m in separate.values()),
            statistics.median(m["perf/total_num_tokens"] for m in separate.values()))
    print(f"# separate launches of 2026-12-06 (another H200), step 2 each; one rollout for both: {pair[0]:.2f} s")
    for name, m in separate.items():
        print(f"{name}: gen {m['timing_s/gen']:.2f} s, step {m['timing_s/step']:.2f} s, tokens/s/GPU as logged "
              f"{m['perf/throughput']:.1f}, at one rollout {with_launch_rollout(m, pair):.1f}")
    logged = separate["best"]["perf/throughput"] / separate["job"]["perf/throughput"]
    common = with_launch_rollout(separate["best"], pair) / with_launch_rollout(separate["job"], pair)
    print(f"best over job, separate launches: x{logged:.3f} as logged, x{common:.3f} at one rollout")
    inside = at[BEST_STEP] / statistics.median(at[k] for k in JOB_STEPS)
    inside_raw = raw[BEST_STEP] / statistics.median(raw[k] for k in JOB_STEPS)
    print(f"shared launch against separate launches: x{inside_raw:.3f} vs x{logged:.3f} as logged "
          f"({inside_raw / logged - 1:+.1%}); x{inside:.3f} vs x{common:.3f} at one rollout ({inside / common - 1:+.1%})")


if __name__ == "__main__":
    main()
