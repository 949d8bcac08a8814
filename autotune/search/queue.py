"""The queued trials the study loop takes before Optuna's own ask: the baseline, the confirmations and the export's
verifying probe (search/confirm.py), and the members of a shared launch (search/groups.py); and the claim of one of
them, which is Optuna's, aimed at a given trial."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.search import groups
from autotune.storage.records import probe_role


def baseline_waiting(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The queued baseline (trial 0, or its retry after an interrupted one), if it has not been taken yet."""
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                 if t.user_attrs.get("baseline")), None)


def ask_queued_first(study: optuna.Study, storage: optuna.storages.BaseStorage) -> optuna.Trial:
    """`study.ask()`, except that a queued baseline, then a queued confirmation or verifying probe, is taken before
    anything queued ahead of it.

    A retry of an interrupted trial 0 is queued behind the warm start that the first run queued, and a
    resumed run with a small --trials would end before reaching it (the report then had no measured
    baseline). This is Optuna's own ask (optuna/study/study.py: `_pop_waiting_trial_id` claims a WAITING
    trial by setting it RUNNING, then `Trial(study, trial_id)`), aimed at one trial; if another tuner
    claimed it first, the ordinary ask follows."""
    for waiting in (baseline_waiting(study), *repeats_waiting(study)):
        claimed = claim_waiting(study, storage, waiting) if waiting is not None else None
        if claimed is not None:
            return claimed
    return study.ask()


def repeats_waiting(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Queued confirmations and the export's verifying probe (search/confirm.py), taken before anything the search
    queued."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)) if repeats_a_trial(t)]


def repeats_a_trial(trial: optuna.trial.FrozenTrial | optuna.Trial) -> bool:
    """A confirmation or a verifying probe: a measured configuration probed again on purpose."""
    return probe_role(trial.user_attrs) != "search"


def claim_waiting(study: optuna.Study, storage: optuna.storages.BaseStorage,
                  waiting: optuna.trial.FrozenTrial) -> optuna.Trial | None:
    """Optuna's claim of a queued trial, aimed at this one; None if another tuner took it first."""
    trial_id = storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study.study_name), waiting.number)
    try:
        if storage.set_trial_state_values(trial_id, TrialState.RUNNING):
            return optuna.Trial(study, trial_id)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass
    return None


def group_members_waiting(study: optuna.Study, lead_number: int) -> list[optuna.trial.FrozenTrial]:
    """The queued members of `lead_number`'s launch (search/groups.py)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if t.user_attrs.get(groups.GROUP_ATTR) == lead_number]
