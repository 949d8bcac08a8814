"""How noisy a measured score is on this node, measured from the study's own repeats, and the interval that noise
puts on a speedup (issue 34).

Two kinds of repeat show it. Steps of one probe (`probe: {timed_steps: 2}` or more, or a shared launch's first
configuration timed again at the launch's end) show how far one step moves inside a launch. Probes of one
configuration (a confirmation of a leader, search/confirm.py) show how far a whole probe moves: a new launch, other
clocks, another state of the node, which the steps of one probe share and cannot show (the same configuration moved
18% inside one H200 launch and 25% between two H200s, 2026-12-03/05). Each is the pooled standard deviation of log
tokens/s within a configuration; it shrinks with the probes behind a score, not with the steps inside one.

One estimate of a probe's noise serves the search (its corrected model and its confirmation band) and the interval
shown on a speedup (score_noise): the noise measured between probes pooled with a prior (UNMEASURED_PROBE_NOISE,
worth PRIOR_DOF repeats), the conjugate normal / scaled-inverse-chi-squared update, so the interval is Student's t on
the prior's and the repeats' degrees of freedom together; a noise measured only between the steps of one launch is
a floor under the prior (a new launch moves more than a step). So every measured speedup has an interval, an assumed
noise is said to be assumed, and one repeat neither hides the noise (one step's 3% taken as a probe's) nor blows
it up (t at one degree of freedom is 12.7). A simulated study has no measurement noise (storage/results.py does not
ask).
"""

from __future__ import annotations

import math
import statistics

from autotune.storage.records import TrialRecord, configuration_key, timed_values

LEVEL = 0.95
# a probe's noise on real hardware where the study has not measured it: the same configuration moved 18% inside one
# H200 launch (sd of logs 0.13) and 25% between two H200s (2026-12-03/05); the search benchmark's noisy machines 0.10
UNMEASURED_PROBE_NOISE = 0.10
# the degrees of freedom that prior is worth: two confirmations measure the noise between probes with 2 dof, and
# their estimate alone swings by a factor of two either way; the search leans on it only as repeats accumulate
PRIOR_DOF = 4
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


def probes_of(rec: TrialRecord) -> int:
    """The probes behind a score: every probe of its configuration, or where it was confirmed its confirmations
    alone (storage/records.pooled)."""
    return sum(1 for p in rec.user_attrs.get("repeats") or () if p.get("scored", True)) or 1


def _pooled_sd(groups: list[list[float]]) -> tuple[float, int]:
    groups = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if not dof:
        return 0.0, 0
    return math.sqrt(sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups) / dof), dof


def measured_noise(recs: list[TrialRecord]) -> dict | None:
    """The noise of one probe's score on this node: {"sigma_rel", "dof", "between_probes", "trials"}, where
    between_probes says whether probes of one configuration were repeated (else only steps inside a probe were, and
    the figure is a floor), trials the first trial of each repeated configuration; None when nothing was repeated."""
    mine = sorted((r for r in recs if r.feasible_measurement and "duplicate_of" not in r.user_attrs),
                  key=lambda r: r.number)
    steps = _pooled_sd([[math.log(v) for v in timed_values(r)] for r in mine])
    by_config: dict[str, list[TrialRecord]] = {}
    for r in mine:
        by_config.setdefault(configuration_key(r), []).append(r)
    probes = _pooled_sd([[math.log(r.tokens_per_s_per_gpu) for r in rs] for rs in by_config.values()])
    if not steps[1] and not probes[1]:
        return None
    sigma, dof = max(steps, probes)
    repeated = [rs[0].number for rs in by_config.values() if len(rs) >= 2 or len(timed_values(rs[0])) >= 2]
    return {"sigma_rel": sigma, "dof": dof, "between_probes": probes[1] > 0, "trials": repeated}


def score_noise(noise: dict | None) -> tuple[float, int]:
    """(sigma, degrees of freedom) of one probe's score on this node: the search's noise and the interval's. The
    noise measured between probes (measured_noise) pooled with UNMEASURED_PROBE_NOISE worth PRIOR_DOF repeats; a
    noise measured only between steps inside probes is a floor under the prior and adds no degrees of freedom to it
    (it says how far a step moves, not a launch)."""
    if noise is None:
        return UNMEASURED_PROBE_NOISE, PRIOR_DOF
    if not noise["between_probes"]:
        return max(UNMEASURED_PROBE_NOISE, noise["sigma_rel"]), PRIOR_DOF
    dof = PRIOR_DOF + noise["dof"]
    return math.sqrt((PRIOR_DOF * UNMEASURED_PROBE_NOISE ** 2 + noise["dof"] * noise["sigma_rel"] ** 2) / dof), dof


def probe_sigma(noise: dict | None) -> float:
    """The noise one probe's score carries, for the search (its corrected model and its confirmation band)."""
    return score_noise(noise)[0]


def speedup_interval(best: TrialRecord, base: TrialRecord, noise: dict | None) -> tuple[float, float] | None:
    """The 95% interval of best/base given the probes behind each score and the noise of one probe (score_noise);
    None without both scores."""
    if not best.tokens_per_s_per_gpu or not base.tokens_per_s_per_gpu:
        return None
    sigma, dof = score_noise(noise)
    half = t95(dof) * sigma * math.sqrt(1 / probes_of(best) + 1 / probes_of(base))
    ratio = best.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu
    return ratio * math.exp(-half), ratio * math.exp(half)


def describe(noise: dict | None, interval: list[float] | None, *, simulated: bool) -> str:
    """The clause the summary adds to a speedup: its interval and where the noise behind it came from."""
    if simulated:
        return "simulated: no measurement noise"
    sigma, _ = score_noise(noise)
    prior = f"{100 * UNMEASURED_PROBE_NOISE:.0f}%"
    text = f"{100 * LEVEL:.0f}% interval x{interval[0]:.2f}-x{interval[1]:.2f}, " if interval else ""
    if noise is None:
        text += (f"noise {prior} assumed (as between real probes; nothing was timed twice: `probe: {{timed_steps: 2}}` "
                 "or `search: {confirm: 2}` measures it)")
    elif not noise["between_probes"]:
        text += (f"noise {100 * sigma:.0f}% ({100 * noise['sigma_rel']:.0f}% between steps inside a launch from "
                 f"{noise['dof']} repeat(s), a floor under the {prior} assumed between launches)")
    else:
        text += (f"noise {100 * sigma:.0f}% ({100 * noise['sigma_rel']:.0f}% between probes from {noise['dof']} "
                 f"repeat(s), pooled with the {prior} assumed, worth {PRIOR_DOF})")
    if interval and interval[0] <= 1.0:
        text += "; within the noise: not shown to be faster"
    return text
