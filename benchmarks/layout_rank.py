"""How far down the model's ranking the optimum's actor layout lies, per simulated machine (issue 19).

    python benchmarks/layout_rank.py qwen2.5-7b-x8 --machines 30 [--first 0]

For each machine of the `layout_sigma0.15` truth: the model's rank of the layout whose training phases are
truly fastest (each layout at its best micro-batching, one rollout setting held), and, for the model's top k
layouts, how much slower the best of them truly is than that layout. A search that follows the model reaches a
layout ranked 20th only after some 20 layout probes. Results: benchmarks/results/layout_rank_7b.txt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import optimum as om  # noqa: E402
import search_efficiency as se  # noqa: E402
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

from autotune.search.equivalence import layout_key  # noqa: E402

TOP_K = (5, 8, 11, 15)


def training_s_by_layout(job, space, layouts: list[dict], filler: dict, evaluator) -> dict:
    """The fastest training-phase seconds of each layout (layout key -> seconds) under one evaluator."""
    best: dict = {}
    for lv in layouts:
        key = layout_key({**dict.fromkeys(("actor_tp", "actor_pp", "actor_vpp", "actor_cp", "actor_ep", "actor_etp",
                                           "ulysses_sp"), 1), **lv})
        parts = om._best_parts(space, lv, filler, evaluator, job.workload)
        if parts is not None and parts[0] < best.get(key, float("inf")):
            best[key] = parts[0]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=sorted(se.JOB_BY_NAME))
    parser.add_argument("--machines", type=int, default=30)
    parser.add_argument("--first", type=int, default=0, help="first machine seed")
    args = parser.parse_args()
    job = se.JOB_BY_NAME[args.job]
    space = se.space_of(job)
    rollout_names = [n for n in om.ROLLOUT_KNOBS if n in space.domains]
    layout_names = [n for n in space.domains if n not in om.ROLLOUT_KNOBS and n not in om.PART_KNOBS]
    filler = {n: om._values(space, n)[0] for n in rollout_names}
    layouts = [lv for lv in (om._normalise(v, space, job.workload) for v in om._product(space, layout_names)) if lv]
    order = None
    for seed in range(args.first, args.first + args.machines):
        machine = Machine(job, TRUTH_BY_NAME["layout_sigma0.15"], seed, run_seed=seed)
        if order is None:  # the model is the same on every machine
            model = om._Evaluator(machine.model, machine.gpu, job.workload, job.gpus_per_node, job.nodes,
                                  om.DEFAULT_CONSTANTS)
            predicted = training_s_by_layout(job, space, layouts, filler, model)
            order = sorted(predicted, key=predicted.get)
        truth = training_s_by_layout(job, space, layouts, filler, machine.ev)
        fastest = min(truth, key=truth.get)
        rank = order.index(fastest) if fastest in order else -1
        slower = {k: round(min(truth[L] for L in order[:k] if L in truth) / truth[fastest], 3) for k in TOP_K}
        print(seed, "rank", rank, "of", len(order), "train-time ratio of best in model top-k:", slower, flush=True)


if __name__ == "__main__":
    main()
