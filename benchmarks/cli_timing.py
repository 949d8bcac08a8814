"""Wall time of the README's main command on the sim backend (issue 2 target: 40 trials in < 60 s).

    python benchmarks/cli_timing.py [--repeats 3] [--trials 40]

Prints one line per run and the medians; the committed result is benchmarks/results/cli_timing.txt. The CPU
seconds (the run's user + system time) are the figure to compare on a shared machine, where other processes
stretch the wall time but not the CPU time.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=40, help="the run's --trials (40: the README's default)")
    args = parser.parse_args()
    times, cpu_times = [], []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8",
                                   "--backend", "sim", "--out", out, "--seed", str(i), "--trials", str(args.trials),
                                   "--quiet"],
                                  capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
            wall_s = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if proc.returncode != 0:
                sys.exit(f"run {i} failed: {proc.stderr.strip()}")
            times.append(wall_s)
            cpu_times.append(cpu_s)
            print(f"run {i}: {args.trials} simulated trials in {wall_s:.1f} s ({cpu_s:.1f} s CPU)")
    print(f"median {statistics.median(times):.1f} s ({statistics.median(cpu_times):.1f} s CPU) over {len(times)} runs; "
          f"{os.cpu_count()} CPU cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
