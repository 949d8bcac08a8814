"""Wall time of the README's main command on the sim backend (issue 2 target: 40 trials in < 60 s).

    python benchmarks/cli_timing.py [--repeats 3]

Prints one line per run and the median; the committed result is benchmarks/results/cli_timing.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8",
                                   "--backend", "sim", "--out", out, "--seed", str(i), "--quiet"],
                                  capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
            wall_s = time.perf_counter() - t0
            if proc.returncode != 0:
                sys.exit(f"run {i} failed: {proc.stderr.strip()}")
            times.append(wall_s)
            print(f"run {i}: 40 simulated trials in {wall_s:.1f} s")
    print(f"median {statistics.median(times):.1f} s over {len(times)} runs; {os.cpu_count()} CPU cores, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
