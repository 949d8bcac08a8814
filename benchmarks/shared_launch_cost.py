"""What shared launches save, on the sim (issue 28 items 2 and 5): the same study of the H200 verl job
(benchmarks/verl_h200/run_tiny_grpo.sh, its tune.yaml pins) with 1, 4 and 6 configurations per launch, 12
configurations each, 3 seeds. SIMULATED: the sim charges a launch the start-up and warm-up measured on the H200
(232 s, warm-up 2.1x a step: benchmarks/results/probe_stages.txt) and each configuration its modelled step; what a
real launch costs is for the H200 study to say. Output: benchmarks/results/shared_launch_cost.txt.

    python benchmarks/shared_launch_cost.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "verl_h200" / "run_tiny_grpo.sh"
PINS = """gpu: H200
fixed: {use_remove_padding: false, param_offload: false, optimizer_offload: false, activation_offload: false}
ranges: {gpu_memory_utilization: [0.5, 0.9]}
probe: {warmup_steps: 1, timed_steps: 1, configs_per_launch: %d}
"""
SEEDS = (1, 2, 3)
TRIALS = 12


def study(per_launch: int, seed: int, work: Path) -> dict:
    out = work / f"p{per_launch}-s{seed}"
    tune = work / f"tune{per_launch}.yaml"
    tune.write_text(PINS % per_launch)
    subprocess.run([sys.executable, "-m", "autotune", "run", "--backend", "sim", "--from", str(JOB), "--model",
                    "qwen2.5-1.5b", "--gpus", "1", "--config", str(tune), "--out", str(out), "--seed", str(seed),
                    "--trials", str(TRIALS), "--quiet"], check=True, capture_output=True, text=True)
    return json.loads((out / "result.json").read_text())


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_launch in (1, 4, 6):
            docs = [study(per_launch, seed, Path(tmp)) for seed in SEEDS]
            cost = [d["tuning_cost"] for d in docs]
            best = [d["best"]["tokens_per_s_per_gpu"] if d.get("best") else float("nan") for d in docs]
            rows.append((per_launch, statistics.mean(c["probes"] for c in cost),
                         statistics.mean(c["launches"] for c in cost),
                         statistics.mean(60 * c["gpu_hours"] for c in cost),
                         statistics.mean(c["probe_efficiency"] for c in cost), statistics.mean(best)))
    print(f"# SIMULATED (sim backend); {TRIALS} configurations per study, seeds {SEEDS}; qwen2.5-1.5b shapes on 1 H200,")
    print("# the job of benchmarks/verl_h200/run_tiny_grpo.sh; means over the seeds")
    print(f"{'configs/launch':>14} {'probes':>7} {'launches':>9} {'GPU-min':>8} {'efficiency':>10} {'best tok/s/GPU':>15}")
    base = rows[0][3]
    for per_launch, probes, launches, gpu_min, eff, best in rows:
        print(f"{per_launch:>14} {probes:>7.1f} {launches:>9.1f} {gpu_min:>8.1f} {100 * eff:>9.0f}% {best:>15.0f}"
              f"   ({gpu_min / base:.2f}x the GPU time of one launch each)")


if __name__ == "__main__":
    main()
