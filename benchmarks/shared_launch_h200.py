"""A real verl study with shared launches against separate probes (issue 28), from a study's stored trials.

For each launch: its configurations in the order they ran, each one's timed step (seconds, tokens/s/GPU, the step
of the launch it ran at), the first configuration's repeat at the end (the spread of one step inside a launch), the
launch's start-up stages and wall time. For the study: its probe efficiency (timed-step GPU time over all of it,
autotune's own `tuning_cost`) and its wall time against what separate probes of the same configurations take on the
same node and job. A separate probe's wall time is by default read from each launch itself: its lead ran exactly
what a probe of its own runs up to the end of its first timed step (start-up, warm-up, one timed step), then the
launch's teardown (end minus its last step) is added. `--separate-s` gives a measured figure instead (seconds of
study wall time per separate probe, from an earlier study on the same node).

    python benchmarks/shared_launch_h200.py benchmarks/results/h100-2026-12-05-verl-shared/autotune.db
    python benchmarks/shared_launch_h200.py DB --separate-s 390   # the 2026-12-03 H200 study: 3 probes in 1170 s
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import optuna

from autotune.storage.records import records
from autotune.storage.tuning_cost import launch_of, tuning_cost


def describe_trial(attrs: dict) -> str:
    cand = attrs.get("candidate") or {}
    if cand.get("use_dynamic_bsz"):
        return f"dyn {cand.get('ppo_max_token_len_per_gpu')}/{cand.get('log_prob_max_token_len_per_gpu')} tok"
    return (f"micro {cand.get('ppo_micro_batch_size_per_gpu')}/{cand.get('log_prob_micro_batch_size_per_gpu')}"
            f"/ref {cand.get('ref_log_prob_micro_batch_size_per_gpu')}")


def phases(attrs: dict) -> str:
    """The timed steps' mean seconds in verl's phases (gen/old_log_prob/ref/update_actor): what moved."""
    phase_s = attrs.get("phase_s") or {}
    return "/".join(f"{phase_s[k]:.1f}" if k in phase_s else "-" for k in ("gen", "old_log_prob", "ref", "update_actor"))


def separate_probe_s(stages: dict, lead_first_step: int | None) -> float | None:
    """What a probe of the lead alone takes: the launch up to its lead's first timed step, and the teardown after
    the launch's last step (stages are seconds from the launch, autotune/verl/stages.py)."""
    steps = sorted(int(k[4:]) for k in stages if k.startswith("step"))
    if lead_first_step is None or f"step{lead_first_step}" not in stages or not steps or "end" not in stages:
        return None
    return stages[f"step{lead_first_step}"] + stages["end"] - stages[f"step{steps[-1]}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path)
    ap.add_argument("--separate-s", type=float,
                    help="study wall seconds per configuration when each has its own launch (an earlier study on "
                         "the same node); default: each launch's own lead up to its first timed step, plus teardown")
    args = ap.parse_args(argv)
    storage = optuna.storages.RDBStorage(f"sqlite:///{args.db.resolve()}")
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    recs = records(study)
    launches: dict[tuple, list] = {}
    for r in recs:
        if r.user_attrs.get("launched"):
            launches.setdefault(launch_of(r.user_attrs, r.number), []).append(r)
    study_wall_s = 0.0
    separate_each_s: list[float] = []
    for key, members in launches.items():
        members.sort(key=lambda r: (r.user_attrs.get("launch") or {}).get("index", 0))
        launch = members[0].user_attrs.get("launch") or {}
        wall_s = launch.get("wall_s") or sum(r.user_attrs.get("probe_wall_s") or 0 for r in members)
        study_wall_s += wall_s
        stages = members[0].user_attrs.get("stage_s") or {}
        print(f"launch of trials {[r.number for r in members]}: wall {wall_s:.0f} s; stages (s from launch): "
              + " . ".join(f"{k} {v:.0f}" for k, v in stages.items()))
        alone_s = separate_probe_s(stages, (launch.get("steps") or [None])[0])
        if alone_s is not None:
            separate_each_s.append(alone_s)
            print(f"  its lead alone (start-up, warm-up, first timed step, teardown): {alone_s:.0f} s")
        for r in members:
            a = r.user_attrs
            steps = (a.get("launch") or {}).get("steps")
            series = (a.get("series") or {}).get("perf/throughput") or []
            step = f"{a['step_s']:.1f} s" if a.get("step_s") else "-"
            tps = f"{r.tokens_per_s_per_gpu:.0f}" if r.tokens_per_s_per_gpu else "-"
            print(f"  trial {r.number:2d} {r.state:9s} {describe_trial(a):24s} steps {steps}  step {step:>8s}  "
                  f"tokens/s/GPU {tps:>6s}  per step {[round(x) for x in series]}  peak {r.peak_mem_gib or 0:.1f} GiB"
                  f"  phases s {phases(a)}"
                  + (f"  {r.reason[:80]}" if r.reason and r.state != 'measured' else ""))
            if (a.get("launch") or {}).get("repeat_spread") is not None:
                print(f"    repeat of the first configuration at the launch's end: spread "
                      f"{100 * a['launch']['repeat_spread']:.1f}% of its mean")
    cost = tuning_cost(recs, 1, simulated=False)
    n = cost["probes"]
    print(f"\n{n} configurations in {cost['launches']} launch(es): {study_wall_s:.0f} s of launches; "
          f"probe efficiency {100 * (cost['probe_efficiency'] or 0):.0f}% (timed steps over all GPU time)")
    each_s = args.separate_s or (statistics.median(separate_each_s) if separate_each_s else None)
    if each_s:
        separate_s = n * each_s
        how = "given" if args.separate_s else "median of the launches' leads alone"
        print(f"separate probes of the same {n} configurations: about {separate_s:.0f} s ({each_s:.0f} s each, {how}); "
              f"shared/separate = {study_wall_s / separate_s:.2f}")
    else:
        print("no separate-probe figure: no launch timed its lead (give --separate-s)")
    steps = [r.user_attrs["step_s"] for r in recs if r.user_attrs.get("step_s")]
    if steps:
        print(f"timed step median {statistics.median(steps):.1f} s over {len(steps)} configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
