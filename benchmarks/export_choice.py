"""Where the export's regret under noise comes from (issue 34): per search, the export against the best configuration
it probed, and how each of the top probed configurations was measured and ranked.

Runs autotune's search as benchmarks/export_regret.py does (same machines, truths and noise) and, at the end, lists
the five probed configurations with the highest true value: true/optimum, their score (as the study pools it) over
the optimum, the probes behind it, the corrected model's posterior over the optimum (what the export is ranked by)
and the trial number; then the export, and a cause for each search whose export is not its best probed:
- "best probed measured low": the truly best configuration probed scored below the export;
- "verify held": it scored above the export, whose verifying probe measured low, and the export was kept
  (search/confirm.verify: the choice is fixed before that probe, so the score shown is unbiased);
- "posterior": it scored above the export, and the corrected model ranked the export above it.

    python benchmarks/export_choice.py --machines 10 --machine-offset 60
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))
import export_regret as er  # noqa: E402
import search_efficiency as se  # noqa: E402
from optimum import exact_optimum  # noqa: E402
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

from autotune.config import SearchOptions  # noqa: E402
from autotune.search import posterior  # noqa: E402
from autotune.search.learned import CorrectedModel  # noqa: E402
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.storage.records import EXPORT_CHOSEN_ATTR, TrialRecord, is_result, pooled  # noqa: E402


def one_search(job, truth, machine_seed: int, sigma: float, budget: int) -> str:
    space = se.space_of(job)
    exact = Machine(job, truth, machine_seed, run_seed=machine_seed)
    opt = exact_optimum(exact.model, exact.gpu, job.workload, space, gpus_per_node=job.gpus_per_node,
                        nodes=job.nodes, evaluator=exact.ev).tokens_per_s_per_gpu
    machine = Machine(job, truth, machine_seed, run_seed=machine_seed, probe_sigma=sigma)
    study, cfg = er.search_study(machine, budget, SearchOptions())
    trials = study.get_trials(deepcopy=False)
    post = posterior.scores(trials, cfg, CorrectedModel.from_trials(trials, cfg, study))
    rows, verified = [], False
    for r in pooled([TrialRecord.of(t) for t in trials if is_result(t)]):
        if r.number == study.user_attrs.get(EXPORT_CHOSEN_ATTR):
            verified = any(p.get("role") == "verify" for p in r.user_attrs.get("repeats") or ())
        if "candidate" not in r.user_attrs:
            continue
        true = machine.truth(Candidate.from_params(r.user_attrs["candidate"]), job.workload) / opt
        probes = sum(1 for _ in r.user_attrs.get("repeats") or ()) or 1
        rows.append((true, r.tokens_per_s_per_gpu / opt, probes, post.get(str(r.number), float("nan")) / opt,
                     r.number))
    rows.sort(reverse=True)
    chosen = study.user_attrs.get(EXPORT_CHOSEN_ATTR)
    export = next((row for row in rows if row[4] == chosen), None)
    best = rows[0]
    cause = "-"
    if export and best[4] != export[4]:
        if best[1] < export[1]:
            cause = f"best probed measured low ({best[2]} probe(s))"
        elif verified:
            cause = "verify held"
        else:
            cause = "posterior"
    top = "; ".join(f"{t:.3f}/{m:.3f}/{n}/{p:.3f}/#{num}" for t, m, n, p, num in rows[:5])
    mine = (f"export #{chosen} true {export[0]:.3f}, score {export[1]:.3f}, {export[2]} probe(s), posterior "
            f"{export[3]:.3f}" if export else f"export #{chosen}")
    switch = max(rows, key=lambda row: row[3])
    after = (f"; the posterior's best now #{switch[4]} (true {switch[0]:.3f})" if export and switch[4] != export[4]
             else "")
    return (f"machine {machine_seed}: {mine}; best probed #{best[4]} {best[0]:.3f}; cause: {cause}{after}\n"
            f"  top 5 by truth (true/score/probes/posterior/trial): {top}")


def main(argv: list[str] | None = None) -> int:
    parser = er.machine_arguments(__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, default=0.1)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    job, truth = se.JOB_BY_NAME[args.job], TRUTH_BY_NAME[args.truth]
    print(f"{args.job}, truth {args.truth}, sigma {args.sigma}, {args.budget} probes, machines "
          f"{args.machine_offset}-{args.machine_offset + args.machines - 1}")
    for m in range(args.machine_offset, args.machine_offset + args.machines):
        print(one_search(job, truth, m, args.sigma, args.budget), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
