"""How many probes does a search spend to reach a near-best configuration? (issue 5)

On the sim backend, compares at the same probe budget, over several seeds and four workloads:
  random   Optuna's RandomSampler; every proposal is launched (verl rejects rule-breakers at start-up)
  tpe      Optuna's default TPESampler, OOMs and rejections taught as constraints, no pre-screen
  grid     DeepSpeed-autotuning style: layouts in a fixed order, binary search on the micro-batch size
  autotune the real driver (autotune.search.driver.run_study): verl's rules, memory gate, OOM
           boundaries, warm start from the model, grouped multivariate TPE, median pruning

Honest noise model: the "machine" each seed plays is the sim model with every constant perturbed
(log-normal, 5-30% depending on how well it is known; see PERTURBATION) plus 3% run-to-run noise per
step. autotune's pre-screen and warm start use the unperturbed model, so they face model error as on
real hardware. The true optimum of each seed's machine comes from exhaustive enumeration
(autotune.search.optimum, checked against brute force in tests/search/test_optimum.py).

    python benchmarks/search_efficiency.py                 # 10 seeds, 40 probes (about 20-30 min on 2 cores)
    python benchmarks/search_efficiency.py --seeds 2 --budget 20 --workloads qwen2.5-7b-x8   # quick look
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import optuna

from autotune.config import Budget, ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.objectives.base import ProbePruned, ProbeRequest
from autotune.objectives.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.objectives.cost import estimate_step_time
from autotune.objectives.memory import estimate_memory
from autotune.objectives.sim import SimRunner
from autotune.errors import ProbeOOM
from autotune.search.driver import run_study
from autotune.search.optimum import exact_optimum
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import SearchSpace, verl_default_candidate
from autotune.workload import Workload

NOISE_REL = 0.03
TARGET = 0.97
# relative std of the log-normal factor applied to each constant, by how well it is known
PERTURBATION = {
    "activations": 0.08, "throughput": 0.08, "rollout": 0.20, "system": 0.15,
}
FIXED = {"use_torch_compile": True, "use_remove_padding": True, "cuda_device_max_connections": 1}


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


def perturbed(seed: int) -> ModelConstants:
    rng = random.Random(seed * 7919 + 17)

    def scale(obj, rel):
        changes = {}
        for f in fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, float) and value > 0:
                factor = math.exp(rng.gauss(0.0, rel))
                new = value * factor
                if f.name in ("allocator_fragmentation",):
                    new = max(1.0, 1.0 + (value - 1.0) * factor)
                if f.name in ("comm_overlap", "collective_efficiency", "host_link_efficiency",
                              "decode_hbm_efficiency", "prefill_mfu", "mfu_max_cap", "chunked_prefill_stall",
                              "unchunked_prefill_stall", "fsdp2_memory_factor"):
                    new = min(new, 0.98)
                changes[f.name] = new
        return replace(obj, **changes)

    k = DEFAULT_CONSTANTS
    return ModelConstants(activations=scale(k.activations, PERTURBATION["activations"]),
                          throughput=scale(k.throughput, PERTURBATION["throughput"]),
                          rollout=scale(k.rollout, PERTURBATION["rollout"]),
                          system=scale(k.system, PERTURBATION["system"]))


class Machine:
    """One seed's simulated cluster: perturbed constants, noisy probes, and its noiseless truth."""

    def __init__(self, job: Job, seed: int) -> None:
        self.job, self.seed = job, seed
        self.model, self.gpu = get_model(job.model), get_gpu("H200")
        self.constants = perturbed(seed)
        self.runner = SimRunner(constants=self.constants, noise_rel=NOISE_REL, seed=seed)

    def truth(self, cand: Candidate, workload: Workload) -> float:
        layout = ParallelLayout.of(cand, workload, gpus_per_node=self.job.gpus_per_node, nodes=self.job.nodes)
        if check(self.model, workload, cand, layout):
            return 0.0
        mem = estimate_memory(self.model, self.gpu, workload, cand, layout, constants=self.constants)
        if not mem.fits:
            return 0.0
        return estimate_step_time(self.model, self.gpu, workload, cand, layout,
                                  constants=self.constants).tokens_per_s_per_gpu

    def probe(self, cand: Candidate, workload: Workload) -> tuple[str, float]:
        """('ok', measured) | ('oom', 0) | ('rejected', 0): what a launch of this candidate gives."""
        layout = ParallelLayout.of(cand, workload, gpus_per_node=self.job.gpus_per_node, nodes=self.job.nodes)
        if check(self.model, workload, cand, layout):
            return "rejected", 0.0
        request = ProbeRequest(model=self.model, gpu=self.gpu, n_gpus=self.job.gpus_per_node, nodes=self.job.nodes,
                               workload=workload, candidate=cand, run_dir=Path("/nonexistent"))
        try:
            return "ok", self.runner.probe(request, lambda *_: False).tokens_per_s_per_gpu
        except ProbeOOM:
            return "oom", 0.0


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
    while len(launches) < budget:
        trial = study.ask()
        cand, workload = space.suggest(trial, machine.job.workload)
        key = tuple(sorted(cand.as_params().items()))
        if key in seen:  # a repeat costs a probe too: plain Optuna does not de-duplicate
            outcome, measured = seen[key][0], seen[key][1]
        else:
            outcome, measured = machine.probe(cand, workload)
        seen[key] = (outcome, measured)
        trial.set_constraint("feasible", 0.0 if outcome == "ok" else 1.0)
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


def run_autotune(machine: Machine, budget: int, tmp: Path) -> Trace:
    job = machine.job
    cfg = TuneConfig(model=machine.model, gpu=machine.gpu, gpus_per_node=job.gpus_per_node, nodes=job.nodes,
                     backend="sim", trials=100_000, storage_url=f"sqlite:///{tmp / f'{job.name}-{machine.seed}.db'}",
                     study_name="bench", out_dir=tmp, seed=machine.seed, workload=job.workload, fixed=FIXED,
                     ranges=job.ranges, tune_workload=(), probe=ProbeBudget(), search=SearchOptions(),
                     budget=Budget(probes=budget))
    study = run_study(cfg, machine.runner)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=40, help="launched probes per search")
    parser.add_argument("--workloads", nargs="*", default=[j.name for j in JOBS])
    parser.add_argument("--methods", nargs="*", default=["random", "tpe", "grid", "autotune"])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    jobs = [j for j in JOBS if j.name in args.workloads]
    started = time.time()
    summary_rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for job in jobs:
            space = space_of(job)
            results: dict[str, list[tuple[Trace, float]]] = {m: [] for m in args.methods}
            for seed in range(args.seeds):
                machine = Machine(job, seed)
                opt = exact_optimum(machine.model, machine.gpu, job.workload, space, gpus_per_node=job.gpus_per_node,
                                    nodes=job.nodes, constants=machine.constants)
                if opt is None:
                    print(f"{job.name} seed {seed}: nothing fits; skipped", file=sys.stderr)
                    continue
                for method in args.methods:
                    if method == "random":
                        trace = run_optuna_plain(machine, space, args.budget, optuna.samplers.RandomSampler(seed=seed))
                    elif method == "tpe":
                        trace = run_optuna_plain(machine, space, args.budget, optuna.samplers.TPESampler(seed=seed))
                    elif method == "grid":
                        trace = run_grid_binary(machine, space, args.budget)
                    else:
                        trace = run_autotune(machine, args.budget, tmp)
                    results[method].append((trace, opt.tokens_per_s_per_gpu))
                print(f"  {job.name} seed {seed}: optimum {opt.tokens_per_s_per_gpu:.0f} tokens/s/GPU "
                      f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
            summary_rows += table(job, results, args.budget)
    print_overall(summary_rows, args)
    return 0


def _median(values):
    return statistics.median(values) if values else float("nan")


def table(job: Job, results: dict, budget: int) -> list[dict]:
    print(f"\n## {job.name}  ({job.model}, {job.nodes} x {job.gpus_per_node} GPUs, response "
          f"{job.workload.max_response_length})\n")
    print(f"| method | median probes to {TARGET:.0%} of optimum | runs reaching it | wasted probes (OOM + rejected) "
          f"| launched probes OOM | best after 10 | best after 20 |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for method, runs in results.items():
        if not runs:
            continue
        reach = [t.probes_to(TARGET, opt) for t, opt in runs]
        reached = [r for r in reach if r is not None]
        # runs that never got there count as budget + 1 in the median (a lower bound on their true cost)
        med = _median([r if r is not None else budget + 1 for r in reach])
        wasted = _median([sum(o in ("oom", "rejected") for o in t.outcomes) for t, _ in runs])
        launched = sum(sum(o not in ("unused",) for o in t.outcomes) for t, _ in runs)
        oom_pct = 100 * sum(sum(o == "oom" for o in t.outcomes) for t, _ in runs) / max(launched, 1)
        at10 = _median([t.best_true[min(9, len(t.best_true) - 1)] / opt for t, opt in runs])
        at20 = _median([t.best_true[min(19, len(t.best_true) - 1)] / opt for t, opt in runs])
        med_text = f"{med:.1f}" if med <= budget else f">{budget}"
        print(f"| {method} | {med_text} | {len(reached)}/{len(runs)} | {wasted:.1f} | {oom_pct:.1f}% | "
              f"{at10:.3f} | {at20:.3f} |")
        rows.append(dict(job=job.name, method=method, median=med, oom_pct=oom_pct))
    return rows


def print_overall(rows: list[dict], args) -> None:
    print(f"\nseeds {args.seeds}, budget {args.budget} launched probes, noise {NOISE_REL:.0%} per step, "
          f"machine perturbation {PERTURBATION}")
    for job in sorted({r["job"] for r in rows}):
        by = {r["method"]: r for r in rows if r["job"] == job}
        if "autotune" in by and "tpe" in by:
            a, t = by["autotune"], by["tpe"]
            print(f"{job}: autotune {a['median']:.1f} probes (target <= 12: {'yes' if a['median'] <= 12 else 'NO'}), "
                  f"TPE {t['median']:.1f}{'+' if t['median'] > args.budget else ''} "
                  f"(autotune <= 1/3 of TPE: {'yes' if a['median'] * 3 <= t['median'] else 'NO'}), "
                  f"autotune launched OOM {a['oom_pct']:.1f}% (target <= 5%: {'yes' if a['oom_pct'] <= 5 else 'NO'})")


if __name__ == "__main__":
    sys.exit(main())
