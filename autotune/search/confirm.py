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

Verify after choosing: the export is picked after the confirmations by a posterior that has seen them, so the
luckier of two confirmed leaders tends to win and its confirmation is high by luck in turn (on 40 fresh 7B machines
of the benchmark, sigma 0.1: measured/true 1.049 on median with the confirmations as its score). Where
`search.verify` is on, one more trial is kept back: once the confirmations are in, the export is chosen and fixed
(study attribute EXPORT_CHOSEN_ATTR), then probed once more, and that probe alone is its score
(storage/records.pooled): a measurement taken after the choice and never used to make it, so it is as likely low as
high.
"""

from __future__ import annotations

import math

import optuna

from autotune.search.groups import PLANNED_ATTR
from autotune.storage.noise import measured_noise, probe_sigma, probes_of
from autotune.storage.records import EXPORT_CHOSEN_ATTR, best_records, records

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
        _enqueue_again(study, r, "confirms", f"confirm trial {r.number}")
    study.set_user_attr(CONFIRM_ATTR, [r.number for r in chosen])
    return [r.number for r in chosen]


def verify(study: optuna.Study) -> int | None:
    """Choose the export now and fix it (EXPORT_CHOSEN_ATTR), then enqueue its verifying probe (label "verify trial
    N"), once per study; the trial chosen, None where nothing was measured."""
    if EXPORT_CHOSEN_ATTR in study.user_attrs:
        return None
    ranked = best_records(study, k=1)
    chosen = ranked[0] if ranked else None
    if chosen is not None:
        _enqueue_again(study, chosen, "verifies", f"verify trial {chosen.number}")
    study.set_user_attr(EXPORT_CHOSEN_ATTR, chosen.number if chosen else None)
    return chosen.number if chosen else None


def _enqueue_again(study: optuna.Study, rec, role: str, label: str) -> None:
    """Queue a measured configuration's probe again; `role` ("confirms" or "verifies") names the trial it repeats."""
    planned = rec.user_attrs.get("candidate") or dict(rec.params)
    study.enqueue_trial(dict(rec.params), user_attrs={role: rec.number, "label": label, PLANNED_ATTR: planned},
                        skip_if_exists=False)
