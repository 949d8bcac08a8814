"""Confirm before export (issue 34): the best and the leaders within one step's noise of it are probed once more, and
the export is the configuration with the best posterior over its probes, not the one with the luckiest single step.

A search that takes the highest of many noisy measurements exports a lucky one: on the search benchmark's fresh
machines with a per-probe noise of sigma 0.1, the exported configuration's measured score overstated its true
score by 1.18x on median, and it was more than 1% below the best configuration probed in 14/20 searches (issue
34). The study reserves `search.confirm` of its trials and probes for this; once the search part has spent the
rest, the fastest configuration and those whose score is within the noise band of it (95%, the noise one probe
carries: storage/noise.probe_sigma) are enqueued again, the fastest first. The fastest is probed again even alone:
its first probe is what chose it, so its score comes from the probe after (storage/records.pooled). The noise
between probes is measured by them (storage/noise.py). A backend whose probe is
deterministic (the sim) has nothing to confirm.
"""

from __future__ import annotations

import math

import optuna

from autotune.search.groups import PLANNED_ATTR
from autotune.storage.noise import measured_noise, probe_sigma, probes_of
from autotune.storage.records import best_records, records

CONFIRM_ATTR = "confirm_enqueued"  # study attribute: the trial numbers the confirmation enqueued (set once)
Z95 = 1.96


def leaders(study: optuna.Study, k: int) -> list:
    """Up to k configurations to probe again, as pooled records: the fastest, always (its probe was the highest of
    many, so high by luck: the score shown for the export comes from this probe, storage/records.pooled), then those
    within the noise band of it (a ratio below exp(1.96 sigma sqrt(1/n_best + 1/n)) over the probes behind each)."""
    ranked = best_records(study, k=len(study.trials))
    if k < 1 or not ranked:
        return []
    sigma = probe_sigma(measured_noise(records(study)))
    best = ranked[0]
    close = [r for r in ranked[1:] if math.log(best.tokens_per_s_per_gpu / r.tokens_per_s_per_gpu)
             <= Z95 * sigma * math.sqrt(1 / probes_of(best) + 1 / probes_of(r))]
    return [best] + close[:k - 1]


def enqueue(study: optuna.Study, k: int) -> list[int]:
    """Enqueue the leaders' configurations once per study (label "confirm trial N"); the trial numbers confirmed."""
    if CONFIRM_ATTR in study.user_attrs:
        return []
    chosen = leaders(study, k)
    for r in chosen:
        study.enqueue_trial(dict(r.params), user_attrs={"confirms": r.number, "label": f"confirm trial {r.number}",
                                                        PLANNED_ATTR: r.user_attrs.get("candidate") or dict(r.params)},
                            skip_if_exists=False)
    study.set_user_attr(CONFIRM_ATTR, [r.number for r in chosen])
    return [r.number for r in chosen]
