"""What the search would export, and how far its true value is from the best (issue 34): regret with noisy probes.

On the search benchmark's simulated machines (benchmarks/truths.py), each search runs with a per-probe log-normal
noise (sigma, on top of 3% per phase per step); after every launched probe k the configuration the study would
export (storage/records.best_records' rule: pooled probes of a configuration, ranked by the corrected model's posterior
where probes are noisy, ties within 1% by headroom) is looked
up and its TRUE value on the machine divided by the machine's exact optimum (benchmarks/optimum.py). Regret at k is
1 minus that. Also the export's measured score over its true score at the end (how much the speedup shown to the
user overstates). Methods: autotune with confirmation (search.confirm 2, the default) and the export's verifying
probe (search.verify), autotune without the verifying probe (autotune_no_verify), without confirmation
(search.confirm 0), with four (autotune_confirm4), and the baselines (argmax of measured): tpe_rules, random.

Machines: seeds MACHINE_OFFSET.. (default 60-69, the validation split: 0-2 were used in development, 50-59 by the
issue's independent run; a test split 70-89 is left for one final run per change).

    python benchmarks/export_regret.py --machines 10 --budget 40 --sigma 0.1 --workers 2
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_efficiency as se  # noqa: E402
from optimum import exact_optimum  # noqa: E402
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

import autotune.search.driver as driver  # noqa: E402
from autotune.config import Budget, ProbeBudget, SearchOptions, TuneConfig  # noqa: E402
from autotune.search import posterior  # noqa: E402
from autotune.search.driver import run_study  # noqa: E402
from autotune.search.learned import NOISY_ATTR, CorrectedModel  # noqa: E402
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.storage.records import (EXPORT_CHOSEN_ATTR, TrialRecord, baseline_record, is_result,  # noqa: E402
                                      pooled, rank)

METHODS = ("autotune", "autotune_no_verify", "autotune_no_confirm", "autotune_confirm4", "autotune_measured",
           "tpe_rules", "random")
CHECK_AT = (15, 40)


def search_study(machine: Machine, budget: int | Budget, search: SearchOptions,
                 probe: ProbeBudget | None = None) -> tuple[optuna.Study, TuneConfig]:
    """autotune's search on this machine with `budget` (launched probes, or a Budget), in memory: the study and its
    configuration."""
    job = machine.job
    cfg = TuneConfig(model=machine.model, gpu=machine.gpu, gpus_per_node=job.gpus_per_node, nodes=job.nodes,
                     backend="sim", trials=100_000, storage_url="sqlite:///:memory:", study_name="bench",
                     out_dir=Path("/nonexistent"), seed=machine.seed, workload=job.workload, fixed=se.FIXED,
                     ranges=job.ranges, tune_workload=(), probe=probe or ProbeBudget(), search=search,
                     budget=budget if isinstance(budget, Budget) else Budget(probes=budget))
    original, driver.open_storage = driver.open_storage, se._in_memory_storage
    try:
        return run_study(cfg, machine.runner), cfg
    finally:
        driver.open_storage = original


def autotune_exports(machine: Machine, budget: int, search: SearchOptions) -> tuple[list[float], float, float, float]:
    """The true value of the export after each launched probe; measured/true and posterior/true of the final export
    (the posterior: its throughput under the corrected model, which the export is ranked by); and the true value of
    the best configuration probed (what an export that knew the truth would take: the search's share of the regret)."""
    job = machine.job
    study, cfg = search_study(machine, budget, search)
    trials = study.get_trials(deepcopy=False)
    base = baseline_record(study)
    base_params = (base.user_attrs.get("candidate") or base.params) if base else {}
    launched = [t.number for t in trials if t.user_attrs.get("launched")]
    values, last, post = [], None, None
    noisy = bool(study.user_attrs.get(NOISY_ATTR)) and search.learn
    for k_last in launched:
        last, post = export_of(study, cfg, [t for t in trials if t.number <= k_last], base_params, noisy)
        values.append(machine.truth(Candidate.from_params(last.user_attrs["candidate"]), job.workload) if last else 0.0)
    overstated = last.tokens_per_s_per_gpu / values[-1] if last and values[-1] else float("nan")
    post_over = post[str(last.number)] / values[-1] if post and last and values[-1] else float("nan")
    probed = max((machine.truth(Candidate.from_params(t.user_attrs["candidate"]), job.workload)
                  for t in trials if is_result(t)), default=0.0)
    return values, overstated, post_over, probed


def export_of(study: optuna.Study, cfg: TuneConfig, prefix: list, base_params: dict,
              noisy: bool) -> tuple[TrialRecord | None, dict | None]:
    """What the study would export had it stopped after these trials (its posterior ranking from them alone where
    probes are noisy; the export fixed before its verifying probe, search/confirm.verify, holds once that probe is
    in), and that posterior."""
    results = [TrialRecord.of(t) for t in prefix if is_result(t)]
    post = posterior.scores(prefix, cfg, CorrectedModel.from_trials(prefix, cfg, study)) if noisy else None
    ranked = rank(pooled(results), base_params, post, study.user_attrs.get(EXPORT_CHOSEN_ATTR))
    return (ranked[0] if ranked else None), post


def argmax_exports(machine: Machine, space, budget: int, method: str, seed: int) -> tuple[list[float], float, float,
                                                                                        float]:
    """A baseline's export is its highest measured probe."""
    sampler = (optuna.samplers.RandomSampler(seed=seed) if method == "random" else None)
    if method == "tpe_rules":
        trace = se.run_autotune(machine, budget, se.SEARCH["tpe_rules"])
    else:
        trace = se.run_optuna_plain(machine, space, budget, sampler)
    return trace.best_true, float("nan"), float("nan"), float("nan")


def run_unit(unit: tuple) -> list[dict]:
    job_name, truth_name, machine_seed, seeds, budget, sigma, methods = unit
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    job, truth = se.JOB_BY_NAME[job_name], TRUTH_BY_NAME[truth_name]
    space = se.space_of(job)
    probe_machine = Machine(job, truth, machine_seed, run_seed=machine_seed)
    opt = exact_optimum(probe_machine.model, probe_machine.gpu, job.workload, space, gpus_per_node=job.gpus_per_node,
                        nodes=job.nodes, evaluator=probe_machine.ev)
    if opt is None:
        return []
    rows = []
    for seed in seeds:
        for method in methods:
            machine = Machine(job, truth, machine_seed, run_seed=seed, probe_sigma=sigma)
            started = time.time()
            if method == "autotune_measured":  # the search before issue 34: probes taken as exact, no confirmation
                machine.runner.deterministic = True
            if method.startswith("autotune"):
                search = {"autotune": SearchOptions(), "autotune_confirm4": SearchOptions(confirm=4),
                          "autotune_no_verify": SearchOptions(verify=False)}.get(method, SearchOptions(confirm=0))
                values, overstated, post_over, probed = autotune_exports(machine, budget, search)
            else:
                values, overstated, post_over, probed = argmax_exports(machine, space, budget, method, seed)
            rows.append(dict(job=job_name, truth=truth_name, machine=machine_seed, seed=seed, method=method,
                             sigma=sigma, optimum=opt.tokens_per_s_per_gpu,
                             share=[v / opt.tokens_per_s_per_gpu for v in values], overstated=overstated,
                             posterior_over=post_over, probed_best=probed / opt.tokens_per_s_per_gpu,
                             seconds=round(time.time() - started, 1)))
    print(f"  {job_name} {truth_name} machine {machine_seed} sigma {sigma} done", file=sys.stderr, flush=True)
    return rows


def regret_at(row: dict, k: int) -> float:
    share = row["share"]
    return 1.0 - (share[min(k, len(share)) - 1] if share else 0.0)


def _known(runs: list[dict], key: str) -> list[float]:
    """The runs' values of `key`, less those a method does not have (NaN: a baseline has no posterior)."""
    return [r[key] for r in runs if not math.isnan(r.get(key, math.nan))]


def run_units(run: Callable[[tuple], list[dict]], units: list[tuple], workers: int) -> list[dict]:
    """Every unit's rows, `workers` processes at a time (forked: the truth machines are rebuilt in each)."""
    rows: list[dict] = []
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for part in pool.imap_unordered(run, units):
                rows.extend(part)
    else:
        for unit in units:
            rows.extend(run(unit))
    return rows


def machine_arguments(description: str) -> argparse.ArgumentParser:
    """The job, truth, machines and probe budget of a search benchmark on the truth machines."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job", default="qwen2.5-7b-x8", choices=list(se.JOB_BY_NAME))
    parser.add_argument("--truth", default="layout_sigma0.15", choices=list(TRUTH_BY_NAME))
    parser.add_argument("--machines", type=int, default=10)
    parser.add_argument("--machine-offset", type=int, default=60)
    parser.add_argument("--budget", type=int, default=40)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = machine_arguments(__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, nargs="*", default=[0.0, 0.1])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    units = [(args.job, args.truth, args.machine_offset + m, (m,), args.budget, sigma, tuple(args.methods))
             for sigma in args.sigma for m in range(args.machines)]
    started = time.time()
    rows = run_units(run_unit, units, args.workers)
    print(f"# python benchmarks/export_regret.py {' '.join(sys.argv[1:] if argv is None else argv)}  "
          f"({time.time() - started:.0f} s)")
    print(f"\n{args.job}, truth {args.truth}, machines {args.machine_offset}-{args.machine_offset + args.machines - 1} "
          f"(one search each), budget {args.budget} launched probes\n")
    print("| noise sigma | method | mean regret @15 | mean regret @40 | export measured/true (median) "
          "| measured/true (geometric mean) | posterior/true (median, geometric mean) | best probed: regret at the end "
          "| searches |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sigma in args.sigma:
        for method in args.methods:
            runs = [r for r in rows if r["sigma"] == sigma and r["method"] == method]
            if not runs:
                continue
            cells = [f"{100 * statistics.fmean(regret_at(r, k) for r in runs):.1f}%" if k <= args.budget else "-"
                     for k in CHECK_AT]
            over, post, probed = (_known(runs, key) for key in ("overstated", "posterior_over", "probed_best"))
            post_cell = (f"{statistics.median(post):.3f}, {statistics.geometric_mean(post):.3f}" if post else "-")
            probed_cell = f"{100 * statistics.fmean(1 - v for v in probed):.1f}%" if probed else "-"
            over_cells = (f"{statistics.median(over):.3f} | {statistics.geometric_mean(over):.3f}" if over else "- | -")
            print(f"| {sigma} | {method} | {' | '.join(cells)} | {over_cells} | {post_cell} | {probed_cell} "
                  f"| {len(runs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
