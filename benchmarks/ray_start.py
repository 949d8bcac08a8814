"""What a fresh Ray costs a verl launch (issue 28 item 3): `ray.init()` on this machine, as verl's main_ppo calls it
without an address, then one task and the shutdown, each timed; repeated in fresh processes. A probe starts its own Ray
(README, "Several configurations per verl launch", says why autotune keeps no cluster across launches).

    python benchmarks/ray_start.py [REPEATS]      # results: benchmarks/results/ray_start.txt
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys

_ONE = """
import time
t = time.perf_counter(); import ray; imported = time.perf_counter() - t
t = time.perf_counter(); ray.init(logging_level="ERROR", include_dashboard=False); init = time.perf_counter() - t
@ray.remote
def one():
    return 1
t = time.perf_counter(); ray.get(one.remote()); task = time.perf_counter() - t
t = time.perf_counter(); ray.shutdown(); down = time.perf_counter() - t
print(f"{imported:.2f} {init:.2f} {task:.2f} {down:.2f}")
"""


def main(argv: list[str]) -> int:
    repeats = int(argv[0]) if argv else 3
    import ray

    print(f"# {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; python benchmarks/ray_start.py {repeats}; "
          f"{platform.machine()}, {os.cpu_count()} CPU cores, no GPU; Ray {ray.__version__}")
    print("import s   init s   first task s   shutdown s")
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _ONE], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            print(f"failed: {out.stderr.strip().splitlines()[-1:]}")
            return 1
        imported, init, task, down = out.stdout.split()[-4:]
        print(f"{imported:>8s} {init:>8s} {task:>14s} {down:>12s}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
