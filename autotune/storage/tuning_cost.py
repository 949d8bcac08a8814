"""What a study cost in GPU time, how much of it was measurement, and when the speedup it found pays it back on the
run it tunes (issue 28 item 5). Read from the stored trials: each launched probe's `probe_wall_s` (real for the verl
and torch backends, simulated for `sim`) and its timed steps' `step_s`."""

from __future__ import annotations

import statistics

from autotune.storage.records import TrialRecord

PLANNED_STEPS_KEY = "trainer.total_training_steps"
# on a launch's lead: how many untried settings of the per-step knobs the GPU-time rule left out of its launch, as not
# worth their step (search/groups.py)
NOT_WORTH_ATTR = "members_not_worth_a_step"


def tuning_cost(recs: list[TrialRecord], world_size: int, *, simulated: bool) -> dict:
    """GPU-hours of every launched probe (a shared launch's wall time is split among its configurations, a failed
    probe's counts too); the share of them the timed steps took (probe efficiency); how many launches measured the
    configurations, and what a launch's start-up and a timed step cost on this node (medians); how many untried
    settings the launches left out as not worth a step (a low probe efficiency the search chose)."""
    launched = [r for r in recs if r.user_attrs.get("launched")]
    probe_s = sum(r.user_attrs.get("probe_wall_s") or 0.0 for r in launched)
    timed_s = sum(timed_step_s(r.user_attrs) for r in launched)
    launches = {launch_of(r.user_attrs, r.number) for r in launched}
    startups = [r.user_attrs["stage_s"]["ready_to_fit"] for r in launched
                if isinstance(r.user_attrs.get("stage_s"), dict) and "ready_to_fit" in r.user_attrs["stage_s"]]
    steps = [r.user_attrs["step_s"] for r in launched if r.user_attrs.get("step_s")]
    # a shared launch times its first configuration again at its end (backends/verl/shared_launch.py): how far one
    # step of the same configuration moved inside a launch, as scored (at the launch's rollout) and as verl logged it
    repeats = [r.user_attrs["launch"] for r in launched
               if isinstance(r.user_attrs.get("launch"), dict) and r.user_attrs["launch"].get("repeat_spread") is not None]
    spreads = [x.get("repeat_spread_at_launch_rollout", x["repeat_spread"]) for x in repeats]
    logged = [x["repeat_spread"] for x in repeats]
    return {"probes": len(launched), "launches": len(launches), "gpu_hours": probe_s * world_size / 3600,
            "timed_step_gpu_hours": timed_s * world_size / 3600,
            "probe_efficiency": timed_s / probe_s if probe_s else None,
            "startup_s": statistics.median(startups) if startups else None,
            "step_s": statistics.median(steps) if steps else None,
            "repeat_spread": max(spreads) if spreads else None,
            "repeat_spread_as_logged": max(logged) if logged else None,
            "settings_left_out": sum(r.user_attrs.get(NOT_WORTH_ATTR) or 0 for r in launched), "simulated": simulated}


def timed_step_s(user_attrs: dict) -> float:
    """The seconds of a probe's timed steps: its mean step times the steps it timed."""
    return (user_attrs.get("step_s") or 0.0) * len((user_attrs.get("series") or {}).get("perf/throughput") or ())


def launch_overhead_s(recs: list[TrialRecord]) -> float | None:
    """What a launch costs beyond its timed steps on this node, seconds (the median over this study's launches that
    measured something): start-up, the warm-up step, teardown, and any step that measured nothing. A launch that
    failed before its first step is left out; it says what a failure costs, not what a launch does. So is one whose
    wall time is not longer than the steps it timed: the steps' seconds (verl's own timer) and the wall time (the
    tuner's) then disagree, and the difference is no cost (a test double's instant launch reporting real-looking
    steps measured -2.9 s, and made every member look not worth its step)."""
    walls: dict[tuple, list[dict]] = {}
    for r in recs:
        if r.user_attrs.get("launched") and r.user_attrs.get("probe_wall_s"):
            walls.setdefault(launch_of(r.user_attrs, r.number), []).append(r.user_attrs)
    overheads = [sum(a["probe_wall_s"] for a in attrs) - sum(timed_step_s(a) for a in attrs)
                 for attrs in walls.values() if any(timed_step_s(a) > 0 for a in attrs)]
    overheads = [s for s in overheads if s > 0]
    return statistics.median(overheads) if overheads else None


def launch_of(user_attrs: dict, number: int) -> tuple:
    """What identifies the launch that measured a trial: its run folder and trials (shared), else the trial."""
    launch = user_attrs.get("launch")
    if isinstance(launch, dict):
        return (launch.get("run_dir"), tuple(launch.get("trials") or ()))
    return ("trial", number)


def payback(cost: dict, *, world_size: int, speedup: float | None, best_step_s: float | None,
            planned_steps: int | None) -> dict | None:
    """When the time the speedup saves has repaid the tuning: in hours of the tuned run (the job's GPUs run the
    tuning too, so GPU-hours / GPUs is the job's own hours). None without a speedup."""
    if not speedup or cost["gpu_hours"] <= 0:
        return None
    tuning_hours = cost["gpu_hours"] / world_size
    doc = {"tuning_hours": tuning_hours, "speedup": speedup,
           "pays_back_after_hours": tuning_hours / (speedup - 1) if speedup > 1 else None}
    if planned_steps and best_step_s:
        run_hours = planned_steps * best_step_s / 3600
        doc.update(planned_steps=planned_steps, planned_run_hours=run_hours,
                   saved_hours=planned_steps * best_step_s * (speedup - 1) / 3600 - tuning_hours)
    return doc


def planned_steps(passthrough: dict) -> int | None:
    value = (passthrough or {}).get(PLANNED_STEPS_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def describe(cost: dict, back: dict | None) -> str:
    """One line for the summary: what the tuning cost, how much was measurement, when it pays back."""
    label = " (simulated)" if cost["simulated"] else ""
    eff = cost["probe_efficiency"]
    launches = cost.get("launches")
    shared = f" in {launches} launch(es)" if launches and launches < cost["probes"] else ""
    text = (f"tuning took {60 * cost['gpu_hours']:.0f} GPU-minutes{label} over {cost['probes']} probe(s){shared}"
            + (f"; the timed steps were {100 * eff:.0f}% of it" if eff is not None else ""))
    if cost.get("settings_left_out"):
        text += (f"; {cost['settings_left_out']} untried setting(s) of launched layouts' per-step knobs were left out "
                 "as not worth their step")
    if cost.get("repeat_spread") is not None:
        text += (f"; the first configuration timed again at its launch's end moved {100 * cost['repeat_spread']:.0f}%"
                 " (speedups below that are within one step's noise)")
    if back is None:
        return text
    if back["pays_back_after_hours"] is None:
        return text + f"; at x{back['speedup']:.2f} it does not pay back"
    text += f"; at x{back['speedup']:.2f} it pays back after {back['pays_back_after_hours']:.1f} hours of training"
    if back.get("planned_run_hours"):
        text += f" (your run: {back['planned_steps']} steps, {back['planned_run_hours']:.1f} hours)"
    else:
        text += f" (set {PLANNED_STEPS_KEY} to compare with your run)"
    return text
