"""The semantic judge over every fixture script (issue 31): is each export the same training as the user's job?

Each launch script of tests/data/verl_examples and tests/data/verl_examples_v090 (verbatim from verl and
verl-recipe) is imported as a user would (one rerun with the `--` values its error asks for, --model where its
model is not at hand: autotune/verl/judge.py import_script) or refused in one line; its own configuration and
candidates of its search space, on every engine it may move to, are exported, composed with verl 0.9.1's Hydra
config beside the job itself, and compared leaf by leaf (autotune/verl/semantic.py). Prints a row per script and
the totals; every unexplained difference is printed. Output of a run: benchmarks/results/semantic_judge.txt.

    python benchmarks/semantic_judge.py [--sampled 6] [--per-engine 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from autotune.errors import ConfigError
from autotune.verl.engines import holds
from autotune.verl.judge import (COMPOSER, ENVIRON, import_script, refused_as_written, script_candidates,
                                  script_model)
from autotune.verl.launch_script import import_launch_script
from autotune.verl.semantic import judge_exports

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
FOLDERS = (DATA / "verl_examples", DATA / "verl_examples_v090")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampled", type=int, default=6, help="candidates sampled from each job's space")
    parser.add_argument("--per-engine", type=int, default=2, help="candidates on each other engine it may move to")
    args = parser.parse_args()
    start = time.perf_counter()
    totals = {"scripts": 0, "imported": 0, "refused": 0, "exports": 0, "switches": 0, "changed": 0,
              "refused_as_written": 0}
    print(f"{'script':58s} {'import':>8s} {'held':>22s} {'exports':>7s} {'engines':>22s} {'changed':>7s}")
    for path in sorted(p for folder in FOLDERS for p in folder.glob("*.sh")):
        totals["scripts"] += 1
        try:
            imported, job = import_script(path, model_name=script_model(path))
        except ConfigError as exc:
            totals["refused"] += 1
            print(f"{path.name:58s} {'refused':>8s}  {str(exc).split(': ', 1)[-1][:110]}")
            continue
        totals["imported"] += 1
        how = "as is" if imported.overrides == import_launch_script(path, ENVIRON).overrides else "with --"
        gpn, nodes = job.gpus_per_node or 8, job.nodes or 1
        held = holds(job.passthrough, job.baseline.actor_engine, job.workload.lora_rank, job.baseline.rollout_tp)
        candidates = script_candidates(job, gpn, nodes, sampled=args.sampled, per_engine=args.per_engine)
        judged = judge_exports(imported, job, candidates, gpus_per_node=gpn, nodes=nodes, composer=COMPOSER)
        changed = [(c, diffs) for c, diffs, _ in judged if diffs]
        switches = sum(c.actor_engine != job.baseline.actor_engine for c in candidates)
        totals["exports"] += len(judged)
        totals["switches"] += switches
        totals["changed"] += len(changed)
        written = refused_as_written(imported, job)
        totals["refused_as_written"] += written is not None
        engines = "/".join(sorted({c.actor_engine for c in candidates}))
        held_text = ",".join(f"{h.knob}={'/'.join(map(str, h.values))}" for h in held) or "-"
        print(f"{path.name:58s} {how:>8s} {held_text[:22]:>22s} {len(judged):7d} {engines:>22s} {len(changed):7d}"
              + (f"   verl refuses it as written: {written[:80]}" if written else ""))
        for candidate, diffs in changed:
            for diff in diffs:
                print(f"    CHANGED on {candidate.actor_engine}: {diff}")
    elapsed_s = time.perf_counter() - start
    print(f"\nscripts {totals['scripts']}: imported {totals['imported']}, refused in one line {totals['refused']}; "
          f"exports judged {totals['exports']} ({totals['switches']} on another engine than the job's); "
          f"exports that change the training {totals['changed']}; jobs verl 0.9.1 refuses as written "
          f"{totals['refused_as_written']}; {elapsed_s:.0f} s")
    return 1 if totals["changed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
