"""How many layout probes a search that follows the model needs on each simulated machine (issue 19's bound).

    python benchmarks/layout_rank.py qwen2.5-7b-x8 --machines 30 [--first 0] [--within 15]

For each machine of the `layout_sigma0.15` truth, each pairing of an actor layout and a rollout setting at its
exact optimum (optimum.best_per_part: its best micro-batching, savers and memory shares), under the truth and
under the model. Two idealised searches that know everything but the truth's per-layout and per-rollout factors:
one spends a probe per layout in the model's order (best predicted first) and reaches 95% of the optimum at the
model's rank of the first layout whose own optimum is within 95%; the other takes the model's k-th layout and
k-th rollout setting in its k-th probe and pairs every probed part for free ("pair probes"). The truth gives
every layout the same prior spread (sigma 0.15), so the model's order is the order of each layout's chance to be
the best; the script also gives that chance for layouts taken in a random order, which ignores the model.
Results: benchmarks/results/layout_rank_7b.txt (and _32b).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import optimum as om  # noqa: E402
import search_efficiency as se  # noqa: E402
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

SHARES = (0.95, 0.97)


def throughput_by_pair(job, space, evaluator) -> dict:
    """(actor layout key, rollout setting key) -> tokens/s/GPU of that pairing's own optimum under one
    evaluator."""
    return {key: evaluator(cand)[2].tokens_per_s_per_gpu
            for key, (_, cand, _) in om.best_per_part(space, job.workload, evaluator).items()}


def model_order(pairs: dict, part: int) -> list:
    """Layouts (part 0) or rollout settings (part 1), best first by their best pairing's throughput."""
    best: dict = {}
    for key, tokens in pairs.items():
        best[key[part]] = max(best.get(key[part], 0.0), tokens)
    return sorted(best, key=best.get, reverse=True)


def pair_probes(truth: dict, layouts: list, settings: list, target: float) -> int | None:
    """Probes an idealised search needs when its k-th probe takes the model's k-th layout and k-th rollout
    setting and every pairing of the parts probed so far is known for free; None: never."""
    for k in range(1, max(len(layouts), len(settings)) + 1):
        if any(truth.get((L, R), 0.0) >= target for L in layouts[:k] for R in settings[:k]):
            return k
    return None


def random_order_success(layouts: int, good: int, probes: int) -> float:
    """P(at least one of `good` layouts among `probes` drawn without replacement from `layouts`)."""
    if good <= 0:
        return 0.0
    return 1.0 - math.comb(layouts - good, min(probes, layouts)) / math.comb(layouts, min(probes, layouts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=sorted(se.JOB_BY_NAME))
    parser.add_argument("--machines", type=int, default=30)
    parser.add_argument("--first", type=int, default=0, help="first machine seed")
    parser.add_argument("--within", type=int, default=15, help="layout probes allowed (issue 19: 15)")
    args = parser.parse_args()
    job = se.JOB_BY_NAME[args.job]
    space = se.space_of(job)
    started = time.time()
    print(f"# python benchmarks/layout_rank.py {args.job} --machines {args.machines} --first {args.first} "
          f"--within {args.within} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} "
          f"{os.cpu_count()} CPU cores)")
    print("# machine: layouts with a feasible point; per share of the optimum: how many layouts reach it, the "
          "model's rank (1 = its best) of the first that does, and P(a random order of layouts reaches it "
          f"within {args.within})")
    layouts = settings = None
    layout_hits = {s: 0 for s in SHARES}
    pair_hits = {s: 0 for s in SHARES}
    random_hits = {s: 0.0 for s in SHARES}
    for seed in range(args.first, args.first + args.machines):
        machine = Machine(job, TRUTH_BY_NAME["layout_sigma0.15"], seed, run_seed=seed)
        if layouts is None:  # the model is the same on every machine
            model = om._Evaluator(machine.model, machine.gpu, job.workload, job.gpus_per_node, job.nodes,
                                  om.DEFAULT_CONSTANTS)
            predicted = throughput_by_pair(job, space, model)
            layouts, settings = model_order(predicted, 0), model_order(predicted, 1)
        truth = throughput_by_pair(job, space, machine.ev)
        by_layout = {L: max(t for (k, _), t in truth.items() if k == L) for L in {k for k, _ in truth}}
        ranked = [L for L in layouts if L in by_layout]
        optimum = max(truth.values())
        cells = []
        for share in SHARES:
            good = [i + 1 for i, L in enumerate(ranked) if by_layout[L] >= share * optimum]
            p_random = random_order_success(len(ranked), len(good), args.within)
            pairs = pair_probes(truth, layouts, settings, share * optimum)
            layout_hits[share] += good[0] <= args.within
            pair_hits[share] += pairs is not None and pairs <= args.within
            random_hits[share] += p_random
            cells.append(f"{share:.0%}: {len(good)} layouts, model rank {good[0]}, random {p_random:.2f}, "
                         f"pair probes {pairs}")
        print(f"{seed} layouts {len(ranked)} | " + " | ".join(cells), flush=True)
    n = args.machines
    for share in SHARES:
        print(f"{share:.0%} within {args.within}: layouts in the model's order {layout_hits[share]}/{n} machines, "
              f"in a random order {random_hits[share]:.1f}/{n} expected; layouts and rollout settings in the "
              f"model's order {pair_hits[share]}/{n}")
    print(f"# {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
