"""The judge's shortcuts give verl's own verdicts: on a sample of candidates, each export is composed twice, by
Hydra's full `compose()` (autotune/verl/compose.py compose_overrides) and by the Composer the judge uses (one base per
engine, overrides applied as compose() ends), and judged twice, as the worker does it (`fast=False`: every config
dataclass built, OmegaConf parsing each interpolation) and as the judge does it (`fast=True`). Prints the times and
any difference (there must be none). Output kept in benchmarks/results/verl_judge_speed.txt.

    python benchmarks/verl_judge_speed.py [--per-setup 12] [--per-script 6]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import time
from pathlib import Path

from omegaconf import OmegaConf

from autotune.verl.compose import Composer, compose_overrides
from autotune.verl.export import hydra_overrides, model_engine, verl_overrides
from autotune.verl.judge import SETUPS, sample_setup, verdict_config

EXAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_examples"
SCRIPTS = ("run_qwen3moe-30b_megatron_96gb.sh", "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh")


def exports(per_setup: int, per_script: int) -> list[list[str]]:
    from autotune.verl.job_import import user_job
    from autotune.verl.judge import sample_space
    from autotune.verl.engines import holds
    from autotune.verl.launch_script import import_launch_script

    out = []
    for name in SETUPS:
        model, workload, gpn, nodes, candidates = sample_setup(name, per_setup, seed=7)
        out += [hydra_overrides(verl_overrides(model, workload, c, gpus_per_node=gpn, nodes=nodes), model_engine(c))
                for c in candidates]
    for script in SCRIPTS:
        job = user_job(import_launch_script(EXAMPLES / script, {"HOME": "/home/user"}))
        gpn, nodes = job.gpus_per_node or 8, job.nodes or 1
        held = holds(job.passthrough, job.baseline.actor_engine, job.workload.lora_rank, job.baseline.rollout_tp)
        candidates = [job.baseline] + sample_space(job.model, job.workload, gpn, nodes, {}, per_script - 1, seed=7,
                                                   holds=held)
        out += [hydra_overrides(verl_overrides(job.model, job.workload, c, gpus_per_node=gpn, nodes=nodes,
                                               passthrough=job.passthrough), model_engine(c)) for c in candidates]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-setup", type=int, default=12)
    parser.add_argument("--per-script", type=int, default=6)
    args = parser.parse_args()
    import verl.trainer.ppo.utils  # noqa: F401  (imported before timing)
    import verl.utils.config  # noqa: F401

    sample = exports(args.per_setup, args.per_script)
    composer = Composer()
    times = {"full compose": 0.0, "Composer": 0.0, "verdict (worker)": 0.0, "verdict (judge, fast)": 0.0}
    differ, refused = [], 0
    for overrides in sample:
        t = time.perf_counter()
        full = compose_overrides(overrides)
        times["full compose"] += time.perf_counter() - t
        t = time.perf_counter()
        quick = composer(overrides)
        times["Composer"] += time.perf_counter() - t
        if OmegaConf.to_container(full, resolve=False) != OmegaConf.to_container(quick, resolve=False):
            differ.append(("composition", overrides))
        t = time.perf_counter()
        slow_verdict = verdict_config(full, private=True, fast=False)
        times["verdict (worker)"] += time.perf_counter() - t
        t = time.perf_counter()
        fast_verdict = verdict_config(quick, private=True, fast=True)
        times["verdict (judge, fast)"] += time.perf_counter() - t
        refused += slow_verdict is not None
        if slow_verdict != fast_verdict:
            differ.append(("verdict", slow_verdict, fast_verdict))
    n = len(sample)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"candidates {n} ({len(SETUPS)} setups x {args.per_setup}, {len(SCRIPTS)} scripts x {args.per_script}); "
          f"verl refused {refused}; differences {len(differ)}")
    for name, seconds in times.items():
        print(f"  {name:24s} {seconds:7.1f} s  ({1000 * seconds / n:6.0f} ms per candidate)")
    before = times["Composer"] + times["verdict (worker)"]
    after = times["Composer"] + times["verdict (judge, fast)"]
    print(f"judge per candidate: {1000 * before / n:.0f} ms as the worker builds configs, {1000 * after / n:.0f} ms "
          f"with the shortcuts (x{before / after:.2f})")
    for d in differ[:5]:
        print("DIFFERENCE", d)


if __name__ == "__main__":
    main()
