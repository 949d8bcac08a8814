"""How many probes does a search spend to reach a near-best configuration, when the model is wrong? (issues 5, 19)

On simulated machines whose exact optimum is known, compares at the same probe budget:
  random      Optuna's RandomSampler; every proposal is launched (verl rejects rule-breakers at start-up)
  tpe         Optuna's default TPESampler, OOMs and rejections told as 0; every proposal launched
  tpe_rules   autotune's sampler (multivariate grouped TPE, constant liar) with verl's rules checked before
              launch (a rejection costs no probe); no memory gate, no OOM boundaries, no model
  grid        DeepSpeed-autotuning style: layouts in a fixed order, binary search on the micro-batch size
  autotune_cold  the real driver without the warm start: rules, memory gate, OOM boundaries, and proposals
              from the model corrected by every probe's phases (search/learned.py) from the first probe on
  autotune    the real driver (autotune.search.driver.run_study) with the warm start

The machines (benchmarks/truths.py) are truths that differ from the model in structure: rescaled constants
(the benchmark's only truth before issue 19), a vLLM preemption cliff, a 3x host floor, superlinear TP
communication, fragmentation at large micro-batches, a Megatron engine 20% faster than the model believes,
rollout TP scaling worse, per-layout / per-rollout-setting factors (log-normal, sigma 0.10/0.15/0.25), and those with
per-flag factors too (quirk_sigma0.15, issue 34).
Search seed s plays machine seed s % --machines (the machine's constants and factors), with run-to-run noise
of 3% per phase per step. autotune's gate, warm start and corrections start from the unperturbed model. The
true optimum of each machine comes from exact enumeration (benchmarks/optimum.py, checked against brute
force in tests/benchmarks/test_optimum.py).

    python benchmarks/search_efficiency.py --campaign     # 2 jobs x 10 truths x 10 seeds x 40 probes (hours of CPU)
    python benchmarks/search_efficiency.py --campaign --truths layout_sigma0.15 --workers 2   # the committed table 1
    python benchmarks/search_efficiency.py --reduced      # 7B x8, 2 truths, 2 seeds, 15 probes, every method (~2.5 min)
    python benchmarks/search_efficiency.py --seeds 2 --budget 20 --jobs qwen2.5-7b-x8 --truths layout_sigma0.15
    python benchmarks/search_efficiency.py --jobs qwen2.5-7b-x8 --truths quirk_sigma0.15 --methods autotune tpe_rules \
        --seeds 10 --machines 10 --machine-offset 90 --budget 40 --workers 2    # issue 34's quirk truth (~2 min)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna

import autotune.search.driver as driver
from autotune.config import Budget, ProbeBudget, SearchOptions, TuneConfig
from autotune.search.driver import run_study
from autotune.search.equivalence import config_key
from autotune.spaces.candidate import Candidate
from autotune.spaces.space import SearchSpace, verl_default_candidate
from autotune.models import get_model
from autotune.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimum import exact_optimum  # noqa: E402
from truths import NOISE_REL, PERTURBATION, TRUTH_BY_NAME, TRUTHS, Machine  # noqa: E402

FIXED = {"use_torch_compile": True, "use_remove_padding": True, "cuda_device_max_connections": 1}
METHODS = ("random", "tpe", "tpe_rules", "grid", "autotune_cold", "autotune")
FRACTIONS = (0.95, 0.97)
CHECKPOINTS = (5, 10, 20)


@dataclass(frozen=True)
class Job:
    name: str
    model: str
    gpus_per_node: int
    nodes: int
    workload: Workload
    ranges: dict


JOBS = [
    Job("qwen2.5-7b-x8", "qwen2.5-7b", 8, 1, Workload(), {}),
    Job("qwen2.5-32b-x32", "qwen2.5-32b", 8, 4, Workload(), {"actor_cp": [1, 2], "actor_vpp": [1, 2]}),
    Job("qwen3-30b-a3b-x16", "qwen3-30b-a3b", 8, 2, Workload(),
        {"actor_cp": [1, 2], "actor_vpp": [1, 2], "actor_etp": [1]}),
    Job("qwen2.5-7b-x8-16k", "qwen2.5-7b", 8, 1,
        Workload(train_batch_size=256, ppo_mini_batch_size=64, rollout_n=8, max_prompt_length=1024,
                 max_response_length=16384), {"actor_vpp": [1, 2]}),
]
JOB_BY_NAME = {j.name: j for j in JOBS}


@dataclass
class Trace:
    """Per launched probe: its outcome and the true value of the best-measured configuration so far."""

    outcomes: list
    best_true: list

    def probes_to(self, fraction: float, optimum: float) -> int | None:
        for i, value in enumerate(self.best_true, 1):
            if value >= fraction * optimum:
                return i
        return None


def _trace(launches: list[tuple[str, float, float]]) -> Trace:
    """launches: (outcome, measured, true) in launch order."""
    outcomes, best_true = [], []
    best_measured, best_t = -1.0, 0.0
    for outcome, measured, true in launches:
        outcomes.append(outcome)
        if outcome == "ok" and measured > best_measured:
            best_measured, best_t = measured, true
        best_true.append(best_t)
    return Trace(outcomes, best_true)


def space_of(job: Job) -> SearchSpace:
    return SearchSpace.build(get_model(job.model), job.workload, gpus_per_node=job.gpus_per_node, nodes=job.nodes,
                             fixed=FIXED, ranges=job.ranges)


def run_optuna_plain(machine: Machine, space: SearchSpace, budget: int, sampler) -> Trace:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    launches = []
    seen: dict = {}
    kl = machine.job.workload.use_kl_loss
    while len(launches) < budget:
        trial = study.ask()
        cand, workload = space.suggest(trial, machine.job.workload)
        key = config_key(cand.as_params(), kl)
        if key in seen:  # a repeat costs a probe too: plain Optuna does not de-duplicate
            outcome, measured = seen[key][0], seen[key][1]
        else:
            outcome, measured = machine.probe(cand, workload)
        seen[key] = (outcome, measured)
        study.tell(trial, measured)
        launches.append((outcome, measured, machine.truth(cand, workload) if outcome == "ok" else 0.0))
    return _trace(launches)


def run_grid_binary(machine: Machine, space: SearchSpace, budget: int) -> Trace:
    """DeepSpeed-style: for each layout in a fixed order, binary-search the largest micro-batch that fits
    (everything else at verl's defaults), measuring every launched point."""
    job, workload = machine.job, machine.job.workload
    base = verl_default_candidate(machine.model, workload, gpus_per_node=job.gpus_per_node, nodes=job.nodes)
    base = base.with_(**{k: v for k, v in FIXED.items() if k != "cuda_device_max_connections"})
    layouts = [dict(actor_engine="fsdp", ulysses_sp=sp) for sp in space.domains["ulysses_sp"].choices]
    layouts += [dict(actor_engine="megatron", actor_tp=tp, actor_pp=pp, cuda_device_max_connections=1)
                for tp in space.domains["actor_tp"].choices for pp in space.domains["actor_pp"].choices]
    micros = list(space.domains["ppo_micro_batch_size_per_gpu"].choices)
    launches = []

    def launch(cand):
        outcome, measured = machine.probe(cand, workload)
        launches.append((outcome, measured, machine.truth(cand, workload) if outcome == "ok" else 0.0))
        return outcome

    for lay in layouts:
        lo, hi = 0, len(micros) - 1
        while lo <= hi and len(launches) < budget:
            mid = (lo + hi) // 2
            m = micros[mid]
            cand = base.with_(**lay, ppo_micro_batch_size_per_gpu=m,
                              log_prob_micro_batch_size_per_gpu=min(2 * m, max(space.domains[
                                  "log_prob_micro_batch_size_per_gpu"].choices)),
                              ref_log_prob_micro_batch_size_per_gpu=min(2 * m, max(space.domains[
                                  "ref_log_prob_micro_batch_size_per_gpu"].choices)))
            if launch(cand) == "ok":
                lo = mid + 1
            else:
                hi = mid - 1
        if len(launches) >= budget:
            break
    while len(launches) < budget:  # nothing left to try: the budget is simply unused
        launches.append(("unused", 0.0, 0.0))
    return _trace(launches)


def _in_memory_storage(url: str) -> optuna.storages.BaseStorage:
    # the benchmark measures probes, not the database: SQLite commits were a third of its CPU time
    return optuna.storages.InMemoryStorage()


def run_autotune(machine: Machine, budget: int, search: SearchOptions) -> Trace:
    job = machine.job
    cfg = TuneConfig(model=machine.model, gpu=machine.gpu, gpus_per_node=job.gpus_per_node, nodes=job.nodes,
                     backend="sim", trials=100_000, storage_url="sqlite:///:memory:", study_name="bench",
                     out_dir=Path("/nonexistent"), seed=machine.seed, workload=job.workload, fixed=FIXED,
                     ranges=job.ranges, tune_workload=(), probe=ProbeBudget(), search=search,
                     budget=Budget(probes=budget))
    original, driver.open_storage = driver.open_storage, _in_memory_storage
    try:
        study = run_study(cfg, machine.runner)
    finally:  # the patch is the benchmark's; a caller in the same process (the tests) keeps its storage
        driver.open_storage = original
    launches = []
    for t in study.trials:
        if not t.user_attrs.get("launched"):
            continue
        cand = Candidate.from_params(t.user_attrs["candidate"])
        state = t.user_attrs["state"]
        if state in ("simulated", "measured"):
            launches.append(("ok", t.user_attrs["tokens_per_s_per_gpu"], machine.truth(cand, job.workload)))
        elif state == "pruned":
            launches.append(("pruned", 0.0, 0.0))
        else:
            launches.append(("oom" if state == "oom" else state, 0.0, 0.0))
    return _trace(launches)


SEARCH = {"tpe_rules": SearchOptions(warm_start=0, prescreen=False, boundaries=False, learn=False),
          "autotune_cold": SearchOptions(warm_start=0), "autotune": SearchOptions()}


def run_method(method: str, machine: Machine, space: SearchSpace, budget: int, seed: int) -> Trace:
    if method == "random":
        return run_optuna_plain(machine, space, budget, optuna.samplers.RandomSampler(seed=seed))
    if method == "tpe":
        return run_optuna_plain(machine, space, budget, optuna.samplers.TPESampler(seed=seed))
    if method == "grid":
        return run_grid_binary(machine, space, budget)
    return run_autotune(machine, budget, SEARCH[method])


def run_unit(unit: tuple) -> list[dict]:
    """One (job, truth, machine seed): its exact optimum, then every method on each search seed it hosts."""
    job_name, truth_name, machine_seed, seeds, budget, methods = unit
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    job = JOB_BY_NAME[job_name]
    truth = TRUTH_BY_NAME[truth_name]
    space = space_of(job)
    started = time.time()
    probe_machine = Machine(job, truth, machine_seed, run_seed=machine_seed)
    opt = exact_optimum(probe_machine.model, probe_machine.gpu, job.workload, space, gpus_per_node=job.gpus_per_node,
                        nodes=job.nodes, evaluator=probe_machine.ev)
    if opt is None:
        print(f"{job_name} {truth_name} machine {machine_seed}: nothing fits; skipped", file=sys.stderr)
        return []
    rows = []
    for seed in seeds:
        for method in methods:
            machine = Machine(job, truth, machine_seed, run_seed=seed)
            trace = run_method(method, machine, space, budget, seed)
            rows.append(dict(job=job_name, truth=truth_name, method=method, seed=seed, machine=machine_seed,
                             optimum=opt.tokens_per_s_per_gpu, outcomes=trace.outcomes, best_true=trace.best_true))
    print(f"  {job_name} {truth_name} machine {machine_seed} seeds {list(seeds)}: optimum "
          f"{opt.tokens_per_s_per_gpu:.0f} tokens/s/GPU ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    return rows


def units(jobs: list[str], truths: list[str], seeds: int, machines: int, budget: int, methods: list[str],
          machine_offset: int = 0) -> list:
    out = []
    for job in jobs:
        for truth in truths:
            for m in range(machines):
                hosted = tuple(s for s in range(seeds) if s % machines == m)
                if hosted:
                    out.append((job, truth, machine_offset + m, hosted, budget, tuple(methods)))
    return out


def summarise(rows: list[dict], budget: int) -> list[dict]:
    """Per (job, truth, method): probes to 95%/97% (median, runs never reaching it count as budget + 1), how
    many runs reached 95% within 15 and 97% within 40 probes, best after 5/10/20 probes, launched OOMs."""
    out = []
    keys = sorted({(r["job"], r["truth"], r["method"]) for r in rows},
                  key=lambda k: (k[0], [t.name for t in TRUTHS].index(k[1]), METHODS.index(k[2])))
    for job, truth, method in keys:
        runs = [r for r in rows if (r["job"], r["truth"], r["method"]) == (job, truth, method)]
        summary = dict(job=job, truth=truth, method=method, runs=len(runs))
        for frac in FRACTIONS:
            reach = [_probes_to(r, frac) for r in runs]
            summary[f"median_to_{frac:.2f}"] = statistics.median(x if x is not None else budget + 1 for x in reach)
            summary[f"reached_{frac:.2f}"] = reach
        summary["within15_0.95"] = sum(x is not None and x <= 15 for x in summary["reached_0.95"])
        summary["within40_0.97"] = sum(x is not None and x <= min(40, budget) for x in summary["reached_0.97"])
        summary["within40_0.95"] = sum(x is not None and x <= min(40, budget) for x in summary["reached_0.95"])
        for k in CHECKPOINTS:
            if k > budget:
                summary[f"best_after_{k}"] = None  # not measured at this budget
                continue
            summary[f"best_after_{k}"] = statistics.median(
                (r["best_true"][min(k, len(r["best_true"])) - 1] if r["best_true"] else 0.0) / r["optimum"] for r in runs)
        launched = sum(sum(o != "unused" for o in r["outcomes"]) for r in runs)
        summary["oom_pct"] = 100 * sum(sum(o == "oom" for o in r["outcomes"]) for r in runs) / max(launched, 1)
        out.append(summary)
    return out


def _probes_to(row: dict, fraction: float) -> int | None:
    for i, value in enumerate(row["best_true"], 1):
        if value >= fraction * row["optimum"]:
            return i
    return None


def print_tables(summaries: list[dict], budget: int) -> None:
    for job in sorted({s["job"] for s in summaries}, key=lambda n: list(JOB_BY_NAME).index(n)):
        j = JOB_BY_NAME[job]
        print(f"\n## {job}  ({j.model}, {j.nodes} x {j.gpus_per_node} GPUs, response {j.workload.max_response_length})\n")
        print(f"| truth | method | median probes to 95% | 95% within 15 | median probes to 97% | 97% within {min(40, budget)} "
              "| best after 5 | best after 10 | best after 20 | launched probes OOM |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for s in (s for s in summaries if s["job"] == job):
            def med(x):
                return f"{x:.1f}" if x <= budget else f">{budget}"
            best = " | ".join("-" if s[f"best_after_{k}"] is None else f"{s[f'best_after_{k}']:.3f}" for k in CHECKPOINTS)
            print(f"| {s['truth']} | {s['method']} | {med(s['median_to_0.95'])} | {s['within15_0.95']}/{s['runs']} | "
                  f"{med(s['median_to_0.97'])} | {s['within40_0.97']}/{s['runs']} | {best} | {s['oom_pct']:.1f}% |")


def print_targets(summaries: list[dict], budget: int) -> None:
    """Issue 19's done-when, checked on what this run measured."""
    print()
    for s in summaries:
        if s["method"] == "autotune" and s["truth"].startswith("quirk_") and budget >= 40:  # issue 34
            print(f"{s['job']} {s['truth']}: autotune 95% within 40 in {s['within40_0.95']}/{s['runs']} (target >= 7/10: "
                  f"{'yes' if s['within40_0.95'] >= 0.7 * s['runs'] else 'NO'})")
        if s["method"] != "autotune" or s["truth"] != "layout_sigma0.15":
            continue
        ok95 = s["within15_0.95"] >= 0.8 * s["runs"]
        ok97 = s["within40_0.97"] >= 0.6 * s["runs"] and budget >= 40
        ok_oom = s["oom_pct"] <= 5
        print(f"{s['job']} layout_sigma0.15: autotune 95% within 15 in {s['within15_0.95']}/{s['runs']} (target >= 8/10: "
              f"{'yes' if ok95 else 'NO'}), 97% within 40 in {s['within40_0.97']}/{s['runs']} (target >= 6/10: "
              f"{'yes' if ok97 else 'NO'}), launched OOM {s['oom_pct']:.1f}% (target <= 5%: {'yes' if ok_oom else 'NO'})")


CAMPAIGN = dict(jobs=["qwen2.5-7b-x8", "qwen2.5-32b-x32"], truths=[t.name for t in TRUTHS], seeds=10, machines=3,
                budget=40)
REDUCED = dict(jobs=["qwen2.5-7b-x8"], truths=["rescaled", "layout_sigma0.15"], seeds=2, machines=2, budget=15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--campaign", action="store_true", help="2 jobs x 10 truths x 10 seeds x 40 probes (hours of CPU)")
    parser.add_argument("--reduced", action="store_true", help="7B x8, 2 truths, 2 seeds, 15 probes, every method")
    parser.add_argument("--jobs", nargs="*", default=None, choices=list(JOB_BY_NAME))
    parser.add_argument("--truths", nargs="*", default=None, choices=list(TRUTH_BY_NAME))
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, default=None, help="search seeds per (job, truth)")
    parser.add_argument("--machines", type=int, default=None, help="machine seeds per (job, truth); seed s plays s %% M")
    parser.add_argument("--machine-offset", type=int, default=0,
                        help="machine seeds start here: tune the search on other machines than those reported")
    parser.add_argument("--budget", type=int, default=None, help="launched probes per search")
    parser.add_argument("--workers", type=int, default=1, help="processes")
    parser.add_argument("--rows", type=Path, default=None, help="append every run's trace here (JSON lines)")
    parser.add_argument("--from-rows", type=Path, nargs="*", default=None,
                        help="print the tables from saved traces instead of running")
    args = parser.parse_args(argv)
    preset = CAMPAIGN if args.campaign else REDUCED if args.reduced else dict(CAMPAIGN, jobs=[JOBS[0].name],
                                                                               truths=["layout_sigma0.15"], seeds=3)
    jobs = args.jobs or preset["jobs"]
    truths = args.truths or preset["truths"]
    seeds = args.seeds or preset["seeds"]
    machines = min(args.machines or preset["machines"], seeds)
    budget = args.budget or preset["budget"]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    started = time.time()
    work = units(jobs, truths, seeds, machines, budget, args.methods, args.machine_offset)
    rows: list[dict] = []

    def keep(part: list[dict]) -> None:
        rows.extend(part)
        if args.rows:
            with args.rows.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in part)

    if args.from_rows is not None:
        for path in args.from_rows:
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        budget = max(len(r["best_true"]) for r in rows)
        seeds = max(r["seed"] for r in rows) + 1
        machines = len({r["machine"] for r in rows})
    elif args.workers > 1:
        with multiprocessing.get_context("fork").Pool(args.workers) as pool:
            for part in pool.imap_unordered(run_unit, work):
                keep(part)
    else:
        for unit in work:
            keep(run_unit(unit))
    summaries = summarise(rows, budget)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# python benchmarks/search_efficiency.py {' '.join(sys.argv[1:] if argv is None else argv)}  ({stamp}, "
          f"{platform.machine()} {os.cpu_count()} CPU cores, {args.workers} worker(s), {time.time() - started:.0f} s)")
    print(f"\nseeds {seeds} per (job, truth) over {machines} machine seeds, budget {budget} launched probes, noise "
          f"{NOISE_REL:.0%} per phase per step, constants perturbed {PERTURBATION}")
    print_tables(summaries, budget)
    print_targets(summaries, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
