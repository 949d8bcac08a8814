"""How many configurations a launch should measure, under a budget of GPU time (issues 28 and 34).

A verl launch costs minutes of start-up and a warm-up step before its first timed step; the knobs verl reads at every
step cost one step each once it is up (search/groups.py). A larger cap on configurations per launch
(probe.configs_per_launch; the verl backend's default is 4) buys more measurements per GPU-hour, but spends them on
one restart key's neighbourhood. On the search benchmark's simulated machines (benchmarks/truths.py; launches with the
sim's start-up and warm-up, SIMULATED: 232 s, warm-up 2.1x a step, measured on the H200) each search gets the same
GPU-hour budget and the default search settings; reported per cap: the true regret of the export at the end (1 - its
true value / the machine's optimum), the configurations measured, the launches, the share of GPU time the timed
steps took, and the export's measured score over its true value. Noise: `--sigma` per launch (one log-normal factor on all of a launch's members, what a node and its
processes add; issue 34 measured 25% between two H200s), on top of 3% per phase per step.

    python benchmarks/launch_size.py --machines 10 --machine-offset 180 --gpu-hours 16 --caps 1 4 8 16 --workers 2
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_efficiency as se  # noqa: E402
from export_regret import export_of, machine_arguments, run_units, search_study  # noqa: E402
from optimum import exact_optimum  # noqa: E402
from truths import TRUTH_BY_NAME, Machine  # noqa: E402

from autotune.config import Budget, ProbeBudget, SearchOptions  # noqa: E402
from autotune.search.confirm import HOLDOUT_ATTR, HOLDS_OUT  # noqa: E402
from autotune.search.learned import NOISY_ATTR  # noqa: E402
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.storage.records import TrialRecord, baseline_record  # noqa: E402
from autotune.storage.tuning_cost import tuning_cost  # noqa: E402


def search(machine: Machine, cap: int, gpu_hours: float) -> dict:
    """autotune's search on this machine, launches of up to `cap` configurations, until `gpu_hours` are spent."""
    job = machine.job
    study, cfg = search_study(machine, Budget(gpu_hours=gpu_hours), SearchOptions(),
                              probe=ProbeBudget(configs_per_launch=cap))
    trials = study.get_trials(deepcopy=False)
    base = baseline_record(study)
    base_params = (base.user_attrs.get("candidate") or base.params) if base else {}
    export, _ = export_of(study, cfg, trials, base_params, bool(study.user_attrs.get(NOISY_ATTR)))
    true = machine.truth(Candidate.from_params(export.user_attrs["candidate"]), job.workload) if export else 0.0
    cost = tuning_cost([TrialRecord.of(t) for t in trials], cfg.world_size, simulated=True)
    return {"true": true, "probes": cost["probes"], "launches": cost["launches"], "gpu_hours": cost["gpu_hours"],
            "efficiency": cost["probe_efficiency"] or 0.0,
            "measured_over_true": export.tokens_per_s_per_gpu / true if export and true else float("nan"),
            "held_out": HOLDOUT_ATTR in study.user_attrs, "verify_launch": any(
                "verifies" in t.user_attrs and HOLDS_OUT not in t.user_attrs for t in trials)}


def run_unit(unit: tuple) -> list[dict]:
    job_name, truth_name, machine_seed, caps, gpu_hours, sigma = unit
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    job, truth = se.JOB_BY_NAME[job_name], TRUTH_BY_NAME[truth_name]
    probe_machine = Machine(job, truth, machine_seed, run_seed=machine_seed)
    opt = exact_optimum(probe_machine.model, probe_machine.gpu, job.workload, se.space_of(job),
                        gpus_per_node=job.gpus_per_node, nodes=job.nodes, evaluator=probe_machine.ev)
    if opt is None:
        return []
    rows = []
    for cap in caps:
        machine = Machine(job, truth, machine_seed, run_seed=machine_seed, probe_sigma=sigma)
        machine.runner.share = True
        row = search(machine, cap, gpu_hours)
        rows.append({**row, "cap": cap, "sigma": sigma, "machine": machine_seed,
                     "regret": 1.0 - row["true"] / opt.tokens_per_s_per_gpu})
    print(f"  {job_name} {truth_name} machine {machine_seed} sigma {sigma} done", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = machine_arguments(__doc__.splitlines()[0])
    parser.add_argument("--gpu-hours", type=float, default=16.0, help="each search's budget")
    parser.add_argument("--caps", type=int, nargs="*", default=[1, 4, 8, 16])
    parser.add_argument("--sigma", type=float, nargs="*", default=[0.0, 0.1])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    units = [(args.job, args.truth, args.machine_offset + m, tuple(args.caps), args.gpu_hours, sigma)
             for sigma in args.sigma for m in range(args.machines)]
    started = time.time()
    rows = run_units(run_unit, units, args.workers)
    print(f"# python benchmarks/launch_size.py {' '.join(sys.argv[1:] if argv is None else argv)}  "
          f"({time.time() - started:.0f} s); SIMULATED launches (the sim's start-up and warm-up)")
    print(f"\n{args.job}, truth {args.truth}, machines {args.machine_offset}-{args.machine_offset + args.machines - 1}, "
          f"{args.gpu_hours:g} GPU-hours per search\n")
    print("| noise sigma (per launch) | configurations per launch (cap) | mean regret of the export | worst "
          "| configurations measured (mean) | launches (mean) | GPU-hours spent (mean) | timed share "
          "| export measured/true (median) | verified by held-out probes / by a probe of its own | searches |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for sigma in args.sigma:
        for cap in args.caps:
            runs = [r for r in rows if r["sigma"] == sigma and r["cap"] == cap]
            if not runs:
                continue
            print(f"| {sigma} | {cap} | {100 * statistics.fmean(r['regret'] for r in runs):.1f}% "
                  f"| {100 * max(r['regret'] for r in runs):.1f}% | {statistics.fmean(r['probes'] for r in runs):.1f} "
                  f"| {statistics.fmean(r['launches'] for r in runs):.1f} "
                  f"| {statistics.fmean(r['gpu_hours'] for r in runs):.1f} "
                  f"| {100 * statistics.fmean(r['efficiency'] for r in runs):.0f}% "
                  f"| {statistics.median(r['measured_over_true'] for r in runs):.3f} "
                  f"| {sum(r['held_out'] for r in runs)} / {sum(r['verify_launch'] for r in runs)} | {len(runs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
