"""The queued trials the loop takes first (autotune/search/queue.py): the baseline, then a confirmation or the export's
verifying probe, before whatever the search queued ahead of them; a trial another tuner claimed is not claimed twice."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.search import queue


def _study():
    storage = optuna.storages.InMemoryStorage()
    return optuna.create_study(storage=storage, direction="maximize"), storage


def test_a_verifying_probe_queued_last_is_taken_before_the_search_s_queue():
    study, storage = _study()
    study.enqueue_trial({"x": 1}, user_attrs={"label": "warm start"})
    study.enqueue_trial({"x": 2}, user_attrs={"verifies": 0, "label": "verify trial 0"})
    trial = queue.ask_queued_first(study, storage)
    assert trial.number == 1
    assert [t.number for t in queue.repeats_waiting(study)] == []


def test_the_baseline_comes_before_a_confirmation():
    study, storage = _study()
    study.enqueue_trial({"x": 1}, user_attrs={"confirms": 5})
    study.enqueue_trial({"x": 0}, user_attrs={"baseline": True})
    assert queue.ask_queued_first(study, storage).number == 1
    assert queue.ask_queued_first(study, storage).number == 0


def test_a_claimed_trial_is_not_claimed_again():
    study, storage = _study()
    study.enqueue_trial({"x": 1}, user_attrs={"confirms": 5})
    (waiting,) = queue.repeats_waiting(study)
    assert queue.claim_waiting(study, storage, waiting).number == 0
    assert queue.claim_waiting(study, storage, waiting) is None, "another tuner took it first"
    assert study.trials[0].state == TrialState.RUNNING
    assert queue.repeats_a_trial(study.trials[0])
