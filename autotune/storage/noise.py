"""How noisy one timed step is on this node, measured from the study's own repeats, and the interval that noise puts
on a speedup (issue 34).

A configuration timed more than once (`probe: {timed_steps: 2}` or more, a shared launch's first configuration timed
again at the launch's end, or a confirmation probe of a leader) shows how far one step of the same configuration moves. The pooled spread of those
repeats (standard deviation of log tokens/s within a configuration) is the study's step noise; a score that is the
mean of n steps carries noise/sqrt(n), and a ratio of two scores the root of the sum of their squares. The interval
uses Student's t on the repeats' degrees of freedom: with one repeat it is honest and wide. A simulated study has
no measurement noise (storage/results.py does not ask).
"""

from __future__ import annotations

import math
import statistics

from autotune.storage.records import TrialRecord, configuration_key

LEVEL = 0.95
# Student's t, two-sided 95%, by degrees of freedom (any statistics table; e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t at `dof` (the nearest tabled dof below; 1.96 past 60)."""
    if dof < 1:
        raise ValueError("a t quantile needs at least one degree of freedom")
    if dof > 60:
        return 1.960
    return _T95[max(d for d in _T95 if d <= dof)]


def timed_values(rec: TrialRecord) -> list[float]:
    """A measured trial's timed steps, tokens/s (the warm-up is never in its series)."""
    return [v for v in (rec.user_attrs.get("series") or {}).get("perf/throughput") or () if v and v > 0]


def steps_of(rec: TrialRecord) -> int:
    """The timed steps behind a score: every probe's, for a configuration probed more than once."""
    repeats = rec.user_attrs.get("repeats")
    return sum(p["steps"] for p in repeats) if repeats else max(len(timed_values(rec)), 1)


def step_noise(recs: list[TrialRecord]) -> dict | None:
    """The pooled standard deviation of log tokens/s of one step, over measured trials timed twice or more:
    {"sigma_rel", "dof", "trials"} (each configuration's first trial); None when no configuration was timed twice."""
    by_config: dict[str, tuple[int, list[float]]] = {}
    for r in sorted(recs, key=lambda r: r.number):
        if r.feasible_measurement and "duplicate_of" not in r.user_attrs:
            first, logs = by_config.setdefault(configuration_key(r), (r.number, []))
            logs.extend(math.log(v) for v in timed_values(r))
    groups = [(n, logs) for n, logs in by_config.values() if len(logs) >= 2]
    dof = sum(len(logs) - 1 for _, logs in groups)
    if not dof:
        return None
    squares = sum(sum((x - statistics.fmean(logs)) ** 2 for x in logs) for _, logs in groups)
    return {"sigma_rel": math.sqrt(squares / dof), "dof": dof, "trials": [n for n, _ in groups]}


def speedup_interval(best: TrialRecord, base: TrialRecord, noise: dict | None) -> tuple[float, float] | None:
    """The 95% interval of best/base given each one's number of timed steps and the study's step noise."""
    if noise is None or not best.tokens_per_s_per_gpu or not base.tokens_per_s_per_gpu:
        return None
    n_best, n_base = steps_of(best), steps_of(base)
    half = t95(noise["dof"]) * noise["sigma_rel"] * math.sqrt(1 / n_best + 1 / n_base)
    ratio = best.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu
    return ratio * math.exp(-half), ratio * math.exp(half)


def describe(noise: dict | None, interval: list[float] | None, *, simulated: bool) -> str:
    """The clause the summary adds to a speedup: its interval and where the noise came from, or why there is none."""
    if simulated:
        return "simulated: no measurement noise"
    if noise is None:
        return "step noise not measured (no configuration was timed twice; `probe: {timed_steps: 2}` measures it)"
    text = (f"{100 * LEVEL:.0f}% interval x{interval[0]:.2f}-x{interval[1]:.2f}, " if interval else "")
    text += f"one step's noise {100 * noise['sigma_rel']:.0f}% from {noise['dof']} repeat(s)"
    if interval and interval[0] <= 1.0:
        text += "; within the noise: not shown to be faster"
    return text
