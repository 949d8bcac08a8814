"""Issue 31's defects on the old code: the semantic judge of this checkout on the exports an older autotune writes.

For each fixture script (tests/data/verl_examples, tests/data/verl_examples_v090), the OLD checkout imports it as it
did (HOME set, nothing after `--`, the same --model) and exports its own configuration and candidates of its search
space on every engine its space allows (in a subprocess with the old code on PYTHONPATH). This checkout's judge
(autotune/verl/semantic.py) then composes the user's job (as a user imports it now) beside each old export and lists
the keys where the training changed. Prints a row per script and the totals; the same run on this checkout's own
exports is `benchmarks/semantic_judge.py`. Output: benchmarks/results/semantic_before_after.txt.

    git archive e1c8fe2 | tar -x -C /tmp/old    # the commit before issue 31
    python benchmarks/semantic_before_after.py /tmp/old
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autotune.errors import ConfigError
from autotune.verl.judge import COMPOSER, import_script, script_model
from autotune.verl.semantic import compare, user_job_args

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
FOLDERS = (DATA / "verl_examples", DATA / "verl_examples_v090")

# Run by the old code: import the script as it did, sample its space (with its engine hold), print the exports.
OLD_EXPORTS = r"""
import json, sys
import autotune  # the old checkout (PYTHONPATH, run from its folder), not this one
assert autotune.__file__.startswith(sys.argv[3]), autotune.__file__
from autotune.verl.export import hydra_overrides, model_engine, verl_overrides
from autotune.verl.job_import import user_job
from autotune.verl.judge import sample_space
from autotune.verl.launch_script import import_launch_script
path, model = sys.argv[1], sys.argv[2] or None
try:
    job = user_job(import_launch_script(path, {"HOME": "/home/user", "PWD": "/home/user/work"}), model_name=model)
except Exception as exc:
    print(json.dumps({"refused": str(exc).splitlines()[0][:200]})); raise SystemExit(0)
try:
    from autotune.verl.keys import engine_hold
    hold = engine_hold(job.passthrough, job.baseline.actor_engine)
except ImportError:
    hold = None
gpn, nodes = job.gpus_per_node or 8, job.nodes or 1
candidates = [job.baseline] + sample_space(job.model, job.workload, gpn, nodes, {}, 4, seed=3, hold=hold)
for engine in ("fsdp", "fsdp2", "megatron"):
    if engine != job.baseline.actor_engine and (hold is None or engine in hold.engines):
        try:
            candidates += sample_space(job.model, job.workload, gpn, nodes, {"actor_engine": engine}, 1, seed=5,
                                       hold=hold)
        except Exception:
            pass
out = [{"engine": c.actor_engine, "args": hydra_overrides(verl_overrides(job.model, job.workload, c,
        gpus_per_node=gpn, nodes=nodes, passthrough=job.passthrough), model_engine(c))} for c in candidates]
print(json.dumps({"gpus_per_node": gpn, "nodes": nodes, "lora_rank": job.workload.lora_rank, "exports": out}))
"""


def old_exports(old: Path, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(old)}
    proc = subprocess.run([sys.executable, "-c", OLD_EXPORTS, str(path), script_model(path) or "", str(old.resolve())],
                          env=env, cwd=old,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        return {"refused": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old_checkout", type=Path)
    args = parser.parse_args()
    start = time.perf_counter()
    totals = collections.Counter()
    keys = collections.Counter()
    print(f"{'script':58s} {'old import':>10s} {'exports':>7s} {'changed':>7s}  keys the old exports change")
    for path in sorted(p for folder in FOLDERS for p in folder.glob("*.sh")):
        totals["scripts"] += 1
        try:
            imported, job = import_script(path, model_name=script_model(path))
        except ConfigError:
            continue  # refused now too (a recipe's entry point, a model not at hand): nothing to compare
        old = old_exports(args.old_checkout, path)
        if "refused" in old:
            totals["old refused"] += 1
            print(f"{path.name:58s} {'refused':>10s}  {old['refused'][:100]}")
            continue
        totals["old imported"] += 1
        user_cfg = COMPOSER(user_job_args(imported, job.baseline.actor_engine))
        changed_keys: collections.Counter = collections.Counter()
        changed = composed = 0
        for export in old["exports"]:
            try:
                export_cfg = COMPOSER(export["args"])
            except ConfigError as exc:  # verl's Hydra refuses the old export itself
                changed_keys[f"(refused by verl's Hydra: {str(exc)[:60]})"] += 1
                changed += 1
                continue
            composed += 1
            # judged for the job's own shape: an old export written for another node count changes the job
            diffs = compare(user_cfg, export_cfg, user_engine=job.baseline.actor_engine, export_engine=export["engine"],
                            gpus_per_node=job.gpus_per_node or 8, nodes=job.nodes or 1)
            changed += bool(diffs)
            changed_keys.update(d.key.replace("actor_rollout_ref.", "") for d in diffs)
        totals["exports"] += len(old["exports"])
        totals["changed"] += changed
        keys.update(changed_keys)
        listed = ", ".join(f"{k} ({n})" for k, n in changed_keys.most_common(4))
        print(f"{path.name:58s} {'imported':>10s} {len(old['exports']):7d} {changed:7d}  {listed[:150]}")
    print(f"\nscripts {totals['scripts']}: the old code imported {totals['old imported']} of those this checkout "
          f"imports (refused {totals['old refused']}); old exports {totals['exports']}, of which {totals['changed']} "
          f"change the training; {time.perf_counter() - start:.0f} s")
    print("keys changed, over all old exports:")
    for key, n in keys.most_common():
        print(f"  {n:4d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
