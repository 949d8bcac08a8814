"""Dry-run a planned GPU study on CPU: `autotune run --backend verl ...` exactly as gpu/run_study.sh calls it, with the
verl launches run by the step-switch TEST DOUBLE (tests/backends/verl/verl_double) and NVML's answer replaced by
the GPU named here. What it shows before any device time is spent: how many launches the study makes, which
configurations each measures, in what order, and that the study ends, exports and resumes as the node would run it.
The double's step times are not verl's (its throughput follows the micro-batch), so which configurations the
search picks after the first measurement, and how many of them a launch takes (search/groups.py weighs them by what
was measured), differ from the node's; the first new launch of a resumed study is decided on real data alone.

    PYTHONPATH=. python benchmarks/verl_h200/dry_run.py --gpu "NVIDIA H100 80GB HBM3" --resume <autotune.db> \
        -- --from benchmarks/verl_h200/run_tiny_grpo.sh --model qwen2.5-1.5b --gpus 1 --config <tune.yaml> \
           --seed 7 --trials 23
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "tests" / "backends" / "verl" / "verl_double"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3", help="the device name NVML would report")
    ap.add_argument("--mem-gib", type=float, default=79.2)
    ap.add_argument("--resume", type=Path, help="a study's autotune.db to go on from (copied)")
    ap.add_argument("--out", type=Path, help="autotune's --out (default: a fresh temporary folder)")
    ap.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `autotune run`'s arguments")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dry_run."))
    out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        shutil.copy(args.resume, out / "autotune.db")
    os.environ.setdefault("AUTOTUNE_PROFILE_DIR", str(out / "node-profiles"))

    from autotune import cli, hardware
    from autotune.backends import select
    from autotune.backends.base import BACKENDS
    from autotune.backends.verl import runner as verl_runner
    from autotune.hardware import DetectedGpus

    fake = DetectedGpus(count=1, device_name=args.gpu, total_mem_gib=args.mem_gib, driver="580.159.04")
    hardware.detect_gpus = lambda environ=None: fake
    select.unavailable_reason = lambda name, gpus: None  # verl, vLLM and Ray are the double's to stand in for
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    class DoubleRunner(verl_runner.VerlRunner):  # every launch through the TEST DOUBLE
        def __init__(self, **kwargs):
            super().__init__(env=env, shared_entry="step_switch_double", **kwargs)

    verl_runner.DoubleRunner = DoubleRunner
    BACKENDS["verl"] = "autotune.backends.verl.runner:DoubleRunner"
    run_args = [a for a in args.run_args if a != "--"]
    rc = cli.main(["run", "--backend", "verl", "--out", str(out), *run_args])
    launches = out / "runs" / "launches.jsonl"
    n = len(launches.read_text().splitlines()) if launches.exists() else 0
    print(f"dry run: rc {rc}; {n} launch(es) of the double; out {out}")
    for path in sorted((out / "runs").glob("*/step_schedule.json")):
        plan = json.loads(path.read_text())
        print(f"  {path.parent.name}: steps -> configuration {plan['steps']}")
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
