"""Confirm before export (autotune/search/confirm.py): the fastest and the leaders within noise of it are probed again,
the export's score is its confirmation's, and nothing is confirmed where a probe is deterministic."""

from __future__ import annotations

import math
import random
import shutil
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.backends.sim import SimRunner
from autotune.cli import status_line
from autotune.config import Budget, ProbeBudget, SearchOptions
from autotune.search import confirm
from autotune.search.budget import confirm_held, verify_held
from autotune.search.driver import run_study
from autotune.search.groups import GROUP_ATTR
from autotune.spaces.candidate import Candidate
from autotune.verl.step_knobs import STEP_KNOBS
from autotune.storage.records import EXPORT_CHOSEN_ATTR, best_records, records
from autotune.storage.results import summary
from sim_study import sim_cfg as _cfg


class _NoisyMachine(SimRunner):
    """TEST DOUBLE: the sim's score times one log-normal factor per probe (sigma 0.1), as a real node's probes move."""

    simulated = False

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def probe(self, request, report):
        result = super().probe(request, report)
        factor = math.exp(self._rng.gauss(0.0, 0.1))
        series = {"perf/throughput": [v * factor for v in result.series["perf/throughput"]]}
        return replace(result, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu * factor, simulated=False,
                       series=series)




def test_the_leaders_are_probed_again_and_the_export_is_scored_by_its_confirmation(tmp_path):
    study = run_study(_cfg(tmp_path, trials=14, search=SearchOptions(verify=False)), _NoisyMachine(seed=1))
    confirmed = study.user_attrs[confirm.CONFIRM_ATTR]
    assert 1 <= len(confirmed) <= 2
    again = [t for t in study.trials if "confirms" in t.user_attrs]
    assert sorted(t.user_attrs["confirms"] for t in again) == sorted(confirmed)
    assert all(t.user_attrs.get("launched") and "duplicate_of" not in t.user_attrs for t in again)
    assert len(study.trials) == 14, "the confirmations come out of --trials, not on top of it"
    assert EXPORT_CHOSEN_ATTR not in study.user_attrs
    best = best_records(study, k=1)[0]
    assert best.number in confirmed
    repeats = best.user_attrs["repeats"]
    assert len(repeats) == 2
    # the export's score is its confirmation's: the first probe is what chose it (storage/records.pooled)
    (after,) = [p for p in repeats if p["scored"]]
    assert after["trial"] != best.number
    assert best.tokens_per_s_per_gpu == pytest.approx(after["tokens_per_s_per_gpu"], rel=1e-9)
    doc = summary(study, f"sqlite:///{tmp_path / 'a.db'}")
    assert doc["best"]["tokens_per_s_per_gpu"] == pytest.approx(after["tokens_per_s_per_gpu"], rel=1e-9)
    line = status_line(doc, 14, 14)
    assert f"scored by its confirmation probe(s) {after['trial']}" in line
    assert f"{doc['best']['posterior_tokens_per_s_per_gpu']:.0f} under the corrected model" in line


def test_the_export_is_chosen_then_scored_by_a_probe_that_did_not_choose_it(tmp_path):
    """After the confirmations the export is fixed, then probed once more; that probe alone is its score, and the
    export stays the export whatever it measures."""
    study = run_study(_cfg(tmp_path, trials=15), _NoisyMachine(seed=1))
    assert len(study.trials) == 15, "the verifying probe comes out of --trials, not on top of it"
    chosen = study.user_attrs[EXPORT_CHOSEN_ATTR]
    (verifying,) = [t for t in study.trials if "verifies" in t.user_attrs]
    assert verifying.user_attrs["verifies"] == chosen
    assert verifying.number == max(t.number for t in study.trials), "it is the study's last probe"
    assert verifying.user_attrs.get("launched") and "duplicate_of" not in verifying.user_attrs
    best = best_records(study, k=1)[0]
    assert best.number == chosen
    (scored,) = [p for p in best.user_attrs["repeats"] if p["scored"]]
    assert scored["trial"] == verifying.number
    assert best.tokens_per_s_per_gpu == pytest.approx(verifying.user_attrs["tokens_per_s_per_gpu"], rel=1e-9)
    line = status_line(summary(study, f"sqlite:///{tmp_path / 'a.db'}"), 15, 15)
    assert f"scored by its verifying probe {verifying.number}" in line


def test_a_verifying_probe_that_measures_low_leaves_the_export_where_it_was():
    """The probe that scores the export must not also choose it: one that measured it far below the runner-up still
    scores it, and the export does not move."""
    study = _measured_study({0: 100.0, 1: 230.0, 2: 220.0})
    assert confirm.verify(study) == 1
    assert confirm.verify(study) is None, "once per study"
    (queued,) = [t for t in study.trials if "verifies" in t.user_attrs]
    assert queued.user_attrs["label"] == "verify trial 1"
    study.add_trial(optuna.trial.create_trial(
        params={}, distributions={}, value=150.0,
        user_attrs={"state": "measured", "feasible": True, "tokens_per_s_per_gpu": 150.0, "verifies": 1,
                    "candidate": {"config": 1}, "series": {"perf/throughput": [150.0]}}))
    best = best_records(study, k=2)
    assert [r.number for r in best] == [1, 2]
    assert best[0].tokens_per_s_per_gpu == pytest.approx(150.0)
    assert confirm.verify(_measured_study({})) is None


def _measured_study(scores: dict[int, float]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for number, tps in sorted(scores.items()):
        trial = optuna.trial.create_trial(
            params={}, distributions={}, value=tps,
            user_attrs={"state": "measured", "feasible": True, "tokens_per_s_per_gpu": tps, "baseline": number == 0,
                        "candidate": {"config": number}, "series": {"perf/throughput": [tps]}})
        study.add_trial(trial)
    return study


def test_the_fastest_is_probed_again_even_with_no_other_within_the_noise():
    """Its first probe is the highest of many and so high by luck; the score shown for it comes from the next."""
    alone = _measured_study({0: 100.0, 1: 230.0, 2: 150.0})  # 1.53x apart: far outside a 10% probe's band
    assert [r.number for r in confirm.leaders(alone, 2)] == [1]
    assert [r.number for r in confirm.leaders(alone, 1)] == [1]
    close = _measured_study({0: 100.0, 1: 230.0, 2: 220.0, 3: 215.0})
    assert [r.number for r in confirm.leaders(close, 2)] == [1, 2]
    assert confirm.leaders(close, 0) == []


def test_a_deterministic_probe_and_a_small_study_confirm_nothing(tmp_path):
    assert confirm_held(_cfg(tmp_path, trials=30), SimRunner()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30), _NoisyMachine()) == 2
    assert confirm_held(_cfg(tmp_path, trials=9), _NoisyMachine()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30, budget=Budget(probes=8)), _NoisyMachine()) == 0
    assert confirm_held(_cfg(tmp_path, trials=30, search=SearchOptions(confirm=0)), _NoisyMachine()) == 0
    assert verify_held(_cfg(tmp_path, trials=30), _NoisyMachine()) == 1
    assert verify_held(_cfg(tmp_path, trials=30, search=SearchOptions(verify=False)), _NoisyMachine()) == 0
    assert verify_held(_cfg(tmp_path, trials=30, search=SearchOptions(confirm=0)), _NoisyMachine()) == 0
    assert verify_held(_cfg(tmp_path, trials=30), SimRunner()) == 0
    study = run_study(_cfg(tmp_path, trials=14), SimRunner())
    assert confirm.CONFIRM_ATTR not in study.user_attrs and EXPORT_CHOSEN_ATTR not in study.user_attrs
    assert not any("confirms" in t.user_attrs or "verifies" in t.user_attrs for t in study.trials)


def test_a_probe_budget_keeps_the_confirmations_probes(tmp_path):
    study = run_study(_cfg(tmp_path, trials=100, budget=Budget(probes=10)), _NoisyMachine(seed=2))
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    assert len(launched) == 10
    assert [t for t in launched if "confirms" in t.user_attrs], "the last probes confirm the leaders"
    assert study.user_attrs.get("stopped_by", "").startswith("probe budget reached")


def test_a_resumed_study_does_not_confirm_twice(tmp_path):
    run_study(_cfg(tmp_path, trials=12), _NoisyMachine(seed=3))
    study = run_study(_cfg(tmp_path, trials=16), _NoisyMachine(seed=4))
    assert sum("confirms" in t.user_attrs for t in study.trials) <= 2
    assert sum("verifies" in t.user_attrs for t in study.trials) <= 1
    assert len(study.trials) == 16
    assert all(r.state != "running" for r in records(study))


def test_a_study_that_searched_on_after_the_verifying_probe_chooses_again():
    """The fixed choice holds only while nothing was measured after its verifying probe (a resumed study)."""
    study = _measured_study({0: 100.0, 1: 230.0, 2: 220.0})
    confirm.verify(study)
    for number, config, tps, attrs in ((4, 1, 150.0, {"verifies": 1}), (5, 5, 240.0, {})):
        study.add_trial(optuna.trial.create_trial(
            params={}, distributions={}, value=tps,
            user_attrs={"state": "measured", "feasible": True, "tokens_per_s_per_gpu": tps,
                        "candidate": {"config": config}, "series": {"perf/throughput": [tps]}, **attrs}))
    assert [r.number for r in best_records(study, k=3)] == [5, 2, 1]


def test_a_verifying_probe_that_never_measured_leaves_the_ranking_to_the_scores():
    """Killed or failed before its result: the fixed choice is not held without the probe that was to score it."""
    study = _measured_study({0: 100.0, 1: 220.0, 2: 230.0})
    assert confirm.verify(study) == 2
    study.set_user_attr(EXPORT_CHOSEN_ATTR, 1)  # as a posterior that ranked trial 1 first would have chosen
    (queued,) = [t for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))]
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # Optuna's ask takes the queued verifying trial
    assert study.trials[queued.number].state == optuna.trial.TrialState.FAIL
    best = best_records(study, k=3)
    assert [r.number for r in best] == [2, 1, 0]
    assert best[0].tokens_per_s_per_gpu == pytest.approx(230.0)


def test_where_a_launch_holds_the_leaders_twice_their_held_out_probes_verify_the_export_in_that_launch(tmp_path,
                                                                                                     monkeypatch):
    """Shared launches: each leader's confirmation and a held-out probe of it run in one launch, with no verifying
    launch after it; the export is chosen before any held-out probe is stored, and the chosen one's held-out probe
    alone is its score."""
    seen_at_choice = []
    real_choose = confirm.choose

    def spy(study, among=None):
        if confirm.EXPORT_CHOSEN_ATTR not in study.user_attrs:
            seen_at_choice.append(({t.number for t in study.trials if t.state.is_finished()}, among))
        return real_choose(study, among)

    monkeypatch.setattr(confirm, "choose", spy)
    study = run_study(_cfg(tmp_path, trials=16, fixed=_one_layout(), probe=ProbeBudget(configs_per_launch=4)),
                      _NoisyMachine(seed=1))
    assert len(study.trials) == 16, "the confirmations and their held-out probes come out of --trials"
    leaders = study.user_attrs[confirm.CONFIRM_ATTR]
    assert study.user_attrs[confirm.HOLDOUT_ATTR] == leaders
    confirming = [t for t in study.trials if confirm.HOLDS_OUT not in t.user_attrs and "confirms" in t.user_attrs]
    held_out = [t for t in study.trials if confirm.HOLDS_OUT in t.user_attrs]
    assert sorted(t.user_attrs[confirm.HOLDS_OUT] for t in held_out) == sorted(leaders)
    assert not [t for t in study.trials if str(t.user_attrs.get("label", "")).startswith("verify trial")]
    # one launch: its lead is the first confirmation, the rest joined it
    lead = min(t.number for t in confirming)
    assert all(t.number == lead or t.user_attrs.get(GROUP_ATTR) == lead for t in confirming + held_out)
    assert all(t.user_attrs.get("launched") and "duplicate_of" not in t.user_attrs for t in confirming + held_out)
    assert {t.number for t in confirming + held_out} == set(range(lead, 16)), "nothing searched after the choice"
    ((finished_then, among),) = seen_at_choice
    assert among == leaders, "chosen among the leaders the launch confirmed"
    assert {t.number for t in confirming} <= finished_then
    assert not {t.number for t in held_out} & finished_then, "no held-out probe was stored when the export was chosen"
    chosen = study.user_attrs[EXPORT_CHOSEN_ATTR]
    (verifying,) = [t for t in held_out if "verifies" in t.user_attrs]
    assert verifying.user_attrs["verifies"] == chosen == verifying.user_attrs[confirm.HOLDS_OUT]
    assert all(t.user_attrs["confirms"] == t.user_attrs[confirm.HOLDS_OUT] for t in held_out if t is not verifying)
    best = best_records(study, k=1)[0]
    assert best.number == chosen
    (scored,) = [p for p in best.user_attrs["repeats"] if p["scored"]]
    assert scored["trial"] == verifying.number and scored["role"] == "verify"
    assert best.tokens_per_s_per_gpu == pytest.approx(verifying.user_attrs["tokens_per_s_per_gpu"], rel=1e-9)
    line = status_line(summary(study, f"sqlite:///{tmp_path / 'a.db'}"), 16, 16)
    assert f"scored by its verifying probe {verifying.number}" in line


def test_under_a_gpu_hour_budget_the_stage_takes_what_it_reserved_not_the_trials_left(tmp_path):
    """--trials says nothing under a GPU-hour budget: the stage is the leaders' confirmations and held-out probes (a
    launch of 16 once took 16 confirmations past the budget)."""
    study = run_study(_cfg(tmp_path, trials=500, budget=Budget(gpu_hours=4.0), fixed=_one_layout(),
                           probe=ProbeBudget(configs_per_launch=16)), _NoisyMachine(seed=1))
    leading = study.user_attrs[confirm.HOLDOUT_ATTR]
    stage = [t for t in study.trials if "confirms" in t.user_attrs or confirm.HOLDS_OUT in t.user_attrs]
    assert len(stage) in (2 * len(leading), 2 * len(leading) + 1)
    assert len(study.trials) < 40


def _one_layout() -> dict:
    """Every knob but the per-step ones fixed: the leaders share a restart key, as a real study's often do."""
    one = {k: v for k, v in Candidate(gradient_checkpointing=True).as_params().items()
           if k not in STEP_KNOBS and k not in ("actor_ep", "actor_etp", "use_dynamic_bsz")}
    return {**one, "use_dynamic_bsz": False}


def test_held_out_probes_only_where_the_leaders_share_one_restart_key():
    study = _candidate_study({0: (Candidate(), 100.0), 1: (Candidate(ppo_micro_batch_size_per_gpu=8), 230.0),
                              2: (Candidate(ppo_micro_batch_size_per_gpu=32), 225.0)})
    assert confirm.enqueue(study, 2, holdouts=True) == [1, 2]
    assert study.user_attrs[confirm.HOLDOUT_ATTR] == [1, 2]
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs.get("confirms", t.user_attrs.get(confirm.HOLDS_OUT)) for t in waiting] == [1, 2, 1, 2]
    assert [t.user_attrs["label"] for t in waiting][2:] == ["held-out probe of trial 1", "held-out probe of trial 2"]
    filled = _candidate_study({0: (Candidate(), 100.0), 1: (Candidate(ppo_micro_batch_size_per_gpu=8), 230.0),
                               2: (Candidate(ppo_micro_batch_size_per_gpu=32), 225.0)})
    assert confirm.enqueue(filled, 2, holdouts=True, trials=5) == [1, 2]
    waiting = filled.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [(t.user_attrs.get("confirms"), t.user_attrs.get(confirm.HOLDS_OUT)) for t in waiting] == [
        (1, None), (1, None), (2, None), (None, 1), (None, 2)], "what is left of the study confirms, fastest first"
    apart = _candidate_study({0: (Candidate(), 100.0), 1: (Candidate(ppo_micro_batch_size_per_gpu=8), 230.0),
                              2: (Candidate(actor_engine="fsdp2"), 225.0)})
    assert confirm.enqueue(apart, 2, holdouts=True, trials=4, verify=1) == [1, 2]
    assert confirm.HOLDOUT_ATTR not in apart.user_attrs
    assert not [t for t in apart.trials if confirm.HOLDS_OUT in t.user_attrs]
    waiting = apart.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs["confirms"] for t in waiting] == [1, 1, 2], "a verifying probe's trial kept, the rest confirm"


def _candidate_study(rows: dict) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for number, (cand, tps) in sorted(rows.items()):
        study.add_trial(optuna.trial.create_trial(
            params={}, distributions={}, value=tps,
            user_attrs={"state": "measured", "feasible": True, "tokens_per_s_per_gpu": tps, "baseline": number == 0,
                        "candidate": cand.as_params(), "series": {"perf/throughput": [tps]}}))
    return study


def test_the_export_is_chosen_among_the_leaders_the_launch_confirmed():
    """A configuration measured in another launch does not overtake the confirmed leaders at the choice: what one
    launch's conditions add is common to its leaders, not to it."""
    study = _measured_study({0: 100.0, 1: 230.0, 2: 220.0, 3: 228.0})
    assert confirm.choose(study, among=[1, 2]) == 1
    assert confirm.choose(study) == 1, "fixed once"
    outside = _measured_study({0: 100.0, 1: 230.0, 2: 220.0, 3: 240.0})
    assert confirm.choose(outside, among=[1, 2]) == 1
    assert confirm.choose(_measured_study({0: 100.0, 1: 240.0}), among=[5, 6]) == 1, "no leader measured: the best"


def test_on_a_real_h100_the_confirmations_and_held_out_probes_ran_in_one_launch_that_verified_the_export(tmp_path):
    """benchmarks/results/h100-2026-12-07-holdout-study: real verl on one H100 resumed the seed study (one launch of
    4) under this stage; its last launch measured two leaders' confirmations and held-out probes, and the export's
    score is its held-out probe, taken in that launch after the choice (autotune train on the export, on the same
    node: 3713 tokens/s/GPU at step 2)."""
    db = tmp_path / "autotune.db"
    shutil.copy(Path(__file__).parents[2] / "benchmarks" / "results" / "h100-2026-12-07-holdout-study" / "autotune.db",
                db)
    study = optuna.load_study(study_name="qwen2.5-1.5b-1x1-verl", storage=f"sqlite:///{db}")
    leading = study.user_attrs[confirm.HOLDOUT_ATTR]
    assert sorted(leading) == [4, 5] and study.user_attrs[confirm.CONFIRM_ATTR] == leading
    stage = [t for t in study.trials if "confirms" in t.user_attrs or confirm.HOLDS_OUT in t.user_attrs]
    assert [t.number for t in stage] == [8, 9, 10, 11]
    assert {t.user_attrs.get(GROUP_ATTR, t.number) for t in stage} == {8}, "one launch"
    assert all(t.user_attrs["state"] == "measured" for t in stage)
    assert study.user_attrs[EXPORT_CHOSEN_ATTR] == 4
    best = best_records(study, k=1)[0]
    assert best.number == 4
    (scored,) = [p for p in best.user_attrs["repeats"] if p["scored"]]
    assert scored["trial"] == 11 and scored["role"] == "verify"
    assert best.tokens_per_s_per_gpu == pytest.approx(3718.8, abs=0.5)
    assert best.tokens_per_s_per_gpu == pytest.approx(3713.1, rel=0.01), "autotune train on the export, same node"


def test_show_marks_the_confirmations_and_the_verifying_probe_of_the_real_h100_study(tmp_path, capsys):
    from autotune.ui import print_trials

    db = tmp_path / "autotune.db"
    shutil.copy(Path(__file__).parents[2] / "benchmarks" / "results" / "h100-2026-12-07-holdout-study" / "autotune.db",
                db)
    print_trials(optuna.load_study(study_name="qwen2.5-1.5b-1x1-verl", storage=f"sqlite:///{db}"))
    rows = {line.split("│")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("│")}
    assert {"4 BEST", "8 c5", "9 c4", "10 c5", "11 v4"} <= rows


def test_leaders_of_two_layouts_are_all_confirmed_and_the_export_verified_by_a_probe_of_its_own(tmp_path):
    """Shared launches, but the leaders differ in restart key: no held-out probes (a held-out probe would share the
    launch that chose its leader over the other), every leader confirmed, and the verifying probe after."""
    study = run_study(_cfg(tmp_path, trials=16, probe=ProbeBudget(configs_per_launch=4)), _NoisyMachine(seed=1))
    leading = study.user_attrs[confirm.CONFIRM_ATTR]
    assert len(leading) == 2 and confirm.HOLDOUT_ATTR not in study.user_attrs
    assert not confirm.one_launch([r for r in best_records(study, k=len(study.trials)) if r.number in leading])
    (verifying,) = [t for t in study.trials if "verifies" in t.user_attrs]
    assert verifying.user_attrs["verifies"] == study.user_attrs[EXPORT_CHOSEN_ATTR]
    assert confirm.HOLDS_OUT not in verifying.user_attrs
