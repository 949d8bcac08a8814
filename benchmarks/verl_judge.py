"""verl 0.9.1 judges autotune's exports: candidates drawn from the search space of each setup, exported, composed
with verl's Hydra config and run through verl's validate_config and config dataclasses (autotune/verl/judge.py).

Prints the counts (candidates, setups, verl refusals, disagreements) and, for every refusal, our rule beside
verl's reason. Needs verl 0.9.1 with its config dependencies (README: Run the tests). Output of a run is kept in
benchmarks/results/verl_judge.txt.

    python benchmarks/verl_judge.py [--per-setup 64] [--per-script 8] [--processes 2]
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from autotune.verl.judge import run, summary, tasks

EXAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "verl_examples"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-setup", type=int, default=64)
    parser.add_argument("--per-script", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    start = time.perf_counter()
    rows = run(tasks(EXAMPLES, args.per_setup, args.per_script), processes=args.processes)
    elapsed_s = time.perf_counter() - start
    print("setup                                      candidates  verl refused  disagreements")
    for name in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == name]
        print(f"{name:44s} {len(mine):9d} {sum(r['verl'] is not None for r in mine):13d} "
              f"{sum(not r['agree'] for r in mine):14d}")
    print()
    pairs = collections.Counter((r["ours"][0].split(":")[0] if r["ours"] else "-",
                                 (r["verl"] or "-")[:110]) for r in rows if r["verl"] or r["ours"])
    print("our rule -> verl's reason (count)")
    for (ours, theirs), count in sorted(pairs.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {ours} -> {theirs}")
    print()
    for row in rows:
        if not row["agree"]:
            print("DISAGREE", row["setup"], row["ours"], row["verl"], row["candidate"])
    s = summary(rows)
    print(f"candidates {s['candidates']}, setups {s['setups']}, verl refused {s['verl_refused']}, "
          f"our rules refused {s['rules_refused']}, disagreements {s['disagreements']}; {elapsed_s:.0f} s on "
          f"{args.processes} processes")
    return 1 if s["disagreements"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
