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

Held-out probes instead of a verifying launch: where launches are shared (a verl launch measures several
configurations, one start-up of minutes for a step of seconds each), the verifying probe alone would cost a launch of
its own for one step (on one H100, 2026-12-07: 171-231 s of start-up and a 39-s warm-up before a 16-s step). So where
the leaders share one restart key and a launch holds them twice, each leader's confirmation is queued with a second,
held-out probe of it, and the one launch measures both. The held-out probes are stored only after the launch's
confirmations, and the export is chosen (and fixed) before the first of them is stored: nothing that chose it has
seen them. The chosen one's held-out probe is then its verifying probe; the others' become more confirmations of
their own leader. It costs a probe per leader besides the first (two leaders: four probes where confirmations and a
verifying probe took three) and saves a launch.
"""

from __future__ import annotations

import math

import optuna

from autotune.search.groups import PLANNED_ATTR
from autotune.spaces.candidate import Candidate
from autotune.storage.noise import measured_noise, probe_sigma, probes_of
from autotune.storage.records import EXPORT_CHOSEN_ATTR, best_records, records
from autotune.verl.step_knobs import restart_key

CONFIRM_ATTR = "confirm_enqueued"  # study attribute: the trial numbers the confirmation enqueued (set once)
HOLDOUT_ATTR = "holdouts_enqueued"  # study attribute: the leaders queued with a held-out probe (set once)
HOLDS_OUT = "holds_out"  # user attribute of a held-out probe: the leader it measures again
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


def one_launch(leading: list) -> bool:
    """Whether these leaders share one restart key: one launch can measure them all, and their held-out probes."""
    return len({restart_key(Candidate.from_params(_planned(r))) for r in leading}) == 1


def stage_trials(study: optuna.Study, k: int, *, holdouts: bool, verify: int) -> tuple[int, bool]:
    """The trials the confirmation stage will take if it starts now, and whether it is one launch: each leader's
    confirmation, then its held-out probe where they share one launch (`holdouts`), else `verify` for a verifying
    probe of its own."""
    leading = leaders(study, k)
    if holdouts and leading and one_launch(leading):
        return 2 * len(leading), True
    return max(len(leading), 1) + verify, False


def enqueue(study: optuna.Study, k: int, *, holdouts: bool = False, trials: int = 0, verify: int = 0) -> list[int]:
    """Enqueue the leaders' configurations once per study (label "confirm trial N"); the trial numbers confirmed.
    `holdouts`: also a held-out probe of each (label "held-out probe of trial N"), queued after every confirmation,
    where all the leaders share one restart key (one launch measures them all). Where `trials` (what is left of the
    study's) is more than the stage takes (with `verify` kept for a verifying probe of its own where there are no
    held-out probes), the rest are more confirmations, the fastest leader's first, each in its leader's launch: a
    trial left over would be a launch of its own, or search after the export was chosen."""
    if CONFIRM_ATTR in study.user_attrs:
        return []
    chosen = leaders(study, k)
    held_out = holdouts and chosen and one_launch(chosen)
    extra = max(trials - (2 * len(chosen) if held_out else len(chosen) + verify), 0) if chosen else 0
    for i, r in enumerate(chosen):
        _enqueue_again(study, r, "confirms", f"confirm trial {r.number}")
        for _ in range(extra // len(chosen) + (i < extra % len(chosen))):
            _enqueue_again(study, r, "confirms", f"confirm trial {r.number}")
    if held_out:
        for r in chosen:
            _enqueue_again(study, r, HOLDS_OUT, f"held-out probe of trial {r.number}")
        study.set_user_attr(HOLDOUT_ATTR, [r.number for r in chosen])
    study.set_user_attr(CONFIRM_ATTR, [r.number for r in chosen])
    return [r.number for r in chosen]


def choose(study: optuna.Study, among: list[int] | None = None) -> int | None:
    """Choose the export now and fix it (EXPORT_CHOSEN_ATTR), once per study: the first by the ranking of those
    `among` (all where None, or where none of them has a result); the trial chosen, None where nothing was measured."""
    if EXPORT_CHOSEN_ATTR in study.user_attrs:
        return study.user_attrs[EXPORT_CHOSEN_ATTR]
    chosen = _fix_export(study, among)
    return chosen.number if chosen else None


def _fix_export(study: optuna.Study, among: list[int] | None = None):
    """The first by the ranking of those `among` (see choose), stored as the study's export (EXPORT_CHOSEN_ATTR)."""
    ranked = best_records(study, k=len(study.trials) if among is not None else 1)
    picked = [r for r in ranked if among is None or r.number in among] or ranked
    chosen = picked[0] if picked else None
    study.set_user_attr(EXPORT_CHOSEN_ATTR, chosen.number if chosen else None)
    return chosen


def seal_holdout(study: optuna.Study, trial: optuna.Trial) -> None:
    """Before a held-out probe's outcome is stored: the export is chosen (if it is not yet) among the leaders the
    launch confirmed, then the probe becomes the export's verifying probe if it measured the export, else one more
    confirmation of its own leader.

    Among the leaders only: their confirmations ran in one launch, so whatever that launch's conditions added to its
    steps (on one H100 two launches measured one configuration 0.4-0.6% apart, 2026-12-07) is common to all of them
    and cannot choose one; a configuration outside the launch, measured in another launch, could win or lose by it,
    and the held-out probe, in the same launch as the confirmations, would keep that luck in the export's score."""
    chosen = choose(study, among=study.user_attrs.get(HOLDOUT_ATTR))
    leader = trial.user_attrs[HOLDS_OUT]
    trial.set_user_attr("verifies" if leader == chosen else "confirms", leader)


def verify(study: optuna.Study) -> int | None:
    """Choose the export now and fix it (EXPORT_CHOSEN_ATTR), then enqueue its verifying probe (label "verify trial
    N"), once per study; the trial chosen, None where nothing was measured."""
    if EXPORT_CHOSEN_ATTR in study.user_attrs:
        return None
    chosen = _fix_export(study)
    if chosen is not None:
        _enqueue_again(study, chosen, "verifies", f"verify trial {chosen.number}")
    return chosen.number if chosen else None


def _planned(rec) -> dict:
    return rec.user_attrs.get("candidate") or dict(rec.params)


def _enqueue_again(study: optuna.Study, rec, role: str, label: str) -> None:
    """Queue a measured configuration's probe again; `role` ("confirms", "verifies" or HOLDS_OUT) names the trial it
    repeats."""
    study.enqueue_trial(dict(rec.params), user_attrs={role: rec.number, "label": label, PLANNED_ATTR: _planned(rec)},
                        skip_if_exists=False)


class Stage:
    """The confirmation stage in one run of the study loop (search/driver.py): the trials it keeps back from the
    search, when it starts, and when it is done. `to_confirm` leaders at most are confirmed and, with `to_verify`, the
    export verified (search/budget.py confirm_held, verify_held)."""

    def __init__(self, study: optuna.Study, to_confirm: int, to_verify: int) -> None:
        self.study, self.to_confirm, self.to_verify = study, to_confirm, to_verify
        # configurations one launch of this study holds (1 until a launch showed the runner shares them): where it
        # holds the leaders twice, the export is verified by held-out probes in the confirmations' launch
        self.launch_room = 1

    def saw_launch(self, room: int) -> None:
        self.launch_room = max(self.launch_room, room)

    def holdout_leaders(self) -> int:
        return min(self.to_confirm, self.launch_room // 2) if self.to_verify else 0

    def confirmed(self) -> bool:
        return not self.to_confirm or CONFIRM_ATTR in self.study.user_attrs

    def verified(self) -> bool:
        attrs = self.study.user_attrs
        # queued held-out probes verify the export in the confirmations' launch: no verifying probe of its own
        return not self.to_verify or EXPORT_CHOSEN_ATTR in attrs or HOLDOUT_ATTR in attrs

    def held(self, trials_left: int) -> int:
        """The trials and probes the search must leave to the stage, `trials_left` being what the study has still to
        start: what the stage would take if it started now."""
        if self.holdout_leaders() and not self.confirmed():
            return self._reserved(trials_left)[0]
        return (0 if self.confirmed() else self.to_confirm) + (0 if self.verified() else self.to_verify)

    def _reserved(self, trials_left: int) -> tuple[int, bool]:
        """Where held-out probes may run: the trials the stage takes if it starts now, and whether it is one launch."""
        need, one = stage_trials(self.study, self.holdout_leaders(), holdouts=True, verify=self.to_verify)
        # a single trial left before a stage of one launch would be a launch's start-up for one step: the stage
        # takes it, as one more confirmation in its launch
        return (need + 1 if one and trials_left - need == 1 and need < self.launch_room else need), one

    def start(self, trials_left: int) -> None:
        """Queue the stage: the leaders' confirmations, with held-out probes where one launch holds them all."""
        if not self.holdout_leaders():
            enqueue(self.study, self.to_confirm)
            return
        # what the stage reserved (under a GPU-hour or wall-time budget the trials left say nothing)
        reserved, one = self._reserved(trials_left)
        left = min(trials_left, reserved)
        one = one and left >= 2
        enqueue(self.study, min(self.holdout_leaders(), left // 2) if one else self.to_confirm, holdouts=one,
                trials=min(left, self.launch_room), verify=self.to_verify)
