"""Shared launches in the one study loop (issue 28 items 2 and 4): the search proposes groups that share a restart
key, each group runs as one launch, every member is recorded, and a tuner killed mid-launch loses no trial."""

import json
import os
import socket
from pathlib import Path

import optuna
import pytest

from autotune.backends.base import get_runner
from autotune.backends.sim import SimRunner
from autotune.backends.verl.runner import ProbeLimits, VerlRunner
from autotune.config import ProbeBudget
from autotune.search.driver import fail_dead_local_trials, open_study, run_study
from autotune.search.groups import GROUP_ATTR, NOT_WORTH_ATTR, improvement_per_step_s, worth_a_step
from autotune.search.learned import Scored
from autotune.spaces.candidate import Candidate
from autotune.storage.tuning_cost import launch_overhead_s, tuning_cost
from autotune.storage.records import records
from autotune.verl.step_knobs import restart_key

from autotune.workload import Workload
from sim_study import sim_cfg as _cfg

DOUBLE = Path(__file__).parents[1] / "backends" / "verl" / "verl_double"
TrialState = optuna.trial.TrialState




def _launches(study):
    by_launch = {}
    for t in study.trials:
        launch = t.user_attrs.get("launch")
        if launch:
            by_launch.setdefault(tuple(launch["trials"]), []).append(t)
    return by_launch


def test_a_sim_study_measures_groups_of_one_restart_key_per_launch(tmp_path, costly_launches):
    study = run_study(_cfg(tmp_path, trials=12, probe=ProbeBudget(configs_per_launch=4)), get_runner("sim"))
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert not [t for t in study.get_trials(states=(TrialState.WAITING,)) if GROUP_ATTR in t.user_attrs]
    launches = _launches(study)
    assert launches and max(len(ts) for ts in launches.values()) > 1
    for trials in launches.values():
        assert len(trials) <= 4
        assert len({restart_key(Candidate.from_params(t.user_attrs["candidate"])) for t in trials}) == 1
    members = [t for t in study.trials if GROUP_ATTR in t.user_attrs]
    assert members and all(study.trials[t.user_attrs[GROUP_ATTR]].user_attrs.get("launch") for t in members)
    # the launch's simulated GPU time is shared by its configurations; the timed steps are a larger share of it
    shared = tuning_cost(records(study), 8, simulated=True)
    (tmp_path / "alone").mkdir()
    alone = tuning_cost(records(run_study(_cfg(tmp_path / "alone", trials=12), get_runner("sim"))), 8, simulated=True)
    assert shared["probe_efficiency"] > 1.3 * alone["probe_efficiency"]


def test_group_members_are_the_models_best_untried_per_step_settings(tmp_path, costly_launches):
    study = run_study(_cfg(tmp_path, trials=4, probe=ProbeBudget(configs_per_launch=4), search=_no_extras()),
                      get_runner("sim"))
    lead, *members = study.trials
    assert lead.user_attrs["baseline"] and [t.user_attrs.get(GROUP_ATTR) for t in members] == [0, 0, 0]
    keys = {json.dumps(t.user_attrs["candidate"], sort_keys=True) for t in study.trials}
    assert len(keys) == 4, "four different configurations"
    assert all(t.user_attrs["predicted_tokens_per_s_per_gpu"] > 0 for t in members)


def _no_extras():
    from autotune.config import SearchOptions
    return SearchOptions(warm_start=0, learn=False)


@pytest.fixture
def costly_launches(monkeypatch):
    """Launches so costly before any is measured that every member is worth its step: the tests of what a shared
    launch does (not of which members it takes) get full launches from the first."""
    from autotune.search import groups

    monkeypatch.setattr(groups, "LAUNCH_OVERHEAD_PRIOR_S", 1e9)


class _KilledMidLaunch(SimRunner):
    """TEST DOUBLE: the tuner is interrupted while a shared launch runs."""

    def probe_group(self, requests, reports):
        raise KeyboardInterrupt


def test_a_tuner_interrupted_mid_launch_leaves_no_trial_running_and_resumes(tmp_path, costly_launches):
    cfg = _cfg(tmp_path, trials=4, probe=ProbeBudget(configs_per_launch=4), search=_no_extras())
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, _KilledMidLaunch())
    study = open_study(cfg)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(failed) == 4 and all(t.user_attrs.get("interrupted") for t in failed)
    study = run_study(cfg, get_runner("sim"))
    assert len(study.get_trials(states=(TrialState.FAIL,))) == 4, "the interrupted trials stay stored"
    assert not study.get_trials(states=(TrialState.RUNNING,))
    assert any(t.user_attrs.get("baseline") and t.user_attrs.get("state") == "simulated" for t in study.trials)


def test_the_members_of_a_dead_tuners_launch_are_failed_and_retried(tmp_path):
    cfg = _cfg(tmp_path, trials=4, probe=ProbeBudget(configs_per_launch=4), search=_no_extras())
    study = open_study(cfg)
    dead = 2**22 + 12345  # no such process
    for _ in range(3):  # a lead and two members, as a killed tuner leaves them
        trial = study.ask({"ppo_micro_batch_size_per_gpu": optuna.distributions.CategoricalDistribution([2, 4, 8])})
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("pid", dead)
    assert fail_dead_local_trials(study) == 3
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 3, "each one is queued again"


def _verl_double_study(tmp_path, trials: int, **double_env):
    """A verl study of `trials` through the one study loop, its launches run by the step-switch TEST DOUBLE
    (`double_env`: how the double behaves), up to 4 configurations a launch."""
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **double_env}
    runner = VerlRunner(limits=ProbeLimits(deadline_s=60, idle_timeout_s=30, kill_grace_s=2), env=env,
                        shared_entry="step_switch_double")
    cfg = _cfg(tmp_path, trials=trials, backend="verl",
               probe=ProbeBudget(warmup_steps=1, timed_steps=1, configs_per_launch=4), search=_no_extras(),
               fixed={"use_dynamic_bsz": False, "use_liger": False})
    return run_study(cfg, runner)


def test_a_verl_study_shares_launches_and_grades_an_oom_in_the_middle(tmp_path, costly_launches):
    """The verl backend through the one study loop, its launches run by the step-switch TEST DOUBLE."""
    study = _verl_double_study(tmp_path, 8, AUTOTUNE_DOUBLE_OOM_MICRO="32")
    assert not study.get_trials(states=(TrialState.RUNNING,))
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    invocations = (tmp_path / "runs" / "launches.jsonl").read_text().splitlines()
    assert len(invocations) < len(launched), "fewer launches than configurations"
    for t in launched:
        assert t.user_attrs["probe_wall_s"] > 0
        if t.user_attrs["state"] == "measured":
            micro = t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"]
            assert t.user_attrs["tokens_per_s_per_gpu"] == 1000.0 + 10 * micro, "its own step, not another's"
    ooms = [t for t in launched if t.user_attrs["state"] == "oom"]
    assert all(t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"] == 32 for t in ooms)


def test_a_verl_studys_shared_launch_members_are_scored_at_the_launchs_rollout_and_show_says_so(tmp_path, costly_launches, capsys):
    """Rollouts timed on verl's 2-s poll grid (the TEST DOUBLE draws 6.1, 2.1, 4.1 s by the step): each member's
    stored score is at the launch's median rollout, verl's own figures stay in its series, `show` names the rollout."""
    from autotune.ui import print_trials
    from autotune.verl.metrics import LAUNCH_ROLLOUT_KEY

    study = _verl_double_study(tmp_path, 4, AUTOTUNE_DOUBLE_GEN="6.1,2.1,4.1")
    shared = [t for t in study.trials if t.user_attrs.get("state") == "measured"
              and len((t.user_attrs.get("launch") or {}).get("trials") or ()) > 1]
    assert shared
    for t in shared:
        gen = t.user_attrs["launch"]["rollout_gen_s"]
        micro = t.user_attrs["candidate"]["ppo_micro_batch_size_per_gpu"]
        assert t.user_attrs["tokens_per_s_per_gpu"] == pytest.approx(8000 / (gen + 8.0 / (1 + micro / 100)))
        assert t.user_attrs["series"][LAUNCH_ROLLOUT_KEY] and t.user_attrs["series"]["perf/throughput"]
    print_trials(study)
    assert "scored at the launch's rollout, gen" in capsys.readouterr().out


def _scored(ei, step_s, micro=4):
    return Scored(ei, 1000.0, Candidate(ppo_micro_batch_size_per_gpu=micro), Workload(), step_s)


def test_a_member_joins_while_it_buys_improvement_as_fast_per_gpu_second_as_its_launch():
    lead = _scored(ei=100.0, step_s=50.0)  # over a 300 s overhead and its own step: 100 / 350 per second
    fast, slow_step, little = _scored(20.0, 50.0, 8), _scored(20.0, 80.0, 16), _scored(10.0, 50.0, 32)
    ranked = sorted([little, slow_step, fast], key=improvement_per_step_s, reverse=True)
    assert ranked == [fast, slow_step, little]
    assert worth_a_step(ranked, lead, overhead_s=300.0, timed_steps=1) == [fast]  # 0.4/s; 0.25 and 0.2 < 0.286
    assert worth_a_step(ranked, lead, overhead_s=600.0, timed_steps=1) == [fast, slow_step, little]
    assert worth_a_step(ranked, lead, overhead_s=None, timed_steps=1) == ranked, "no launch measured yet"
    assert worth_a_step(ranked, None, overhead_s=300.0, timed_steps=1) == ranked, "a lead the model cannot score"


def test_every_launch_weighs_its_members_by_gpu_time_the_first_against_the_prior_launch_cost(tmp_path):
    """A sim study: every lead records how many untried per-step settings the rule left out, the first one too (no
    launch measured yet: weighed against LAUNCH_OVERHEAD_PRIOR_S); its members are its own. Before, the first launch
    filled up unweighed, and on the benchmark's 7B machines a cap of 16 spent a 16 GPU-hour budget in 1.3 launches."""
    study = run_study(_cfg(tmp_path, trials=16, probe=ProbeBudget(configs_per_launch=6)), get_runner("sim"))
    launches = sorted(_launches(study).values(), key=lambda ts: min(t.number for t in ts))
    assert launches, "some launches measure several configurations"
    assert study.trials[0].user_attrs[NOT_WORTH_ATTR] > 0, "the first launch is weighed"
    assert launch_overhead_s(records(study)) > 0
    for trials in launches:
        lead = min(trials, key=lambda t: t.number)
        assert lead.user_attrs.get(NOT_WORTH_ATTR, 0) >= 0
        assert all(t.user_attrs.get(GROUP_ATTR) == lead.number for t in trials if t is not lead)


def test_a_study_with_no_launch_cost_of_its_own_weighs_members_against_its_node_profiles(tmp_path, monkeypatch):
    """Where the study's own launches have not measured what a launch costs (here: none ever does), the cost its node
    profile holds (storage/node_profile.py, what earlier studies on the node paid) weighs the members instead. A
    launch that costs next to nothing buys improvement faster than any extra step: members are left out."""
    from autotune.search import groups
    from autotune.storage.node_profile import PROFILE_ATTR

    monkeypatch.setattr(groups, "launch_overhead_s", lambda recs: None)

    def not_worth(out: Path, profile: dict | None) -> list[int]:
        cfg = _cfg(out, trials=16, probe=ProbeBudget(configs_per_launch=6))
        if profile is not None:  # the profile the study starts from, as search/node_prior.start_profile stores it
            open_study(cfg).set_user_attr(PROFILE_ATTR, profile)
        study = run_study(cfg, get_runner("sim"))
        return [t.user_attrs[NOT_WORTH_ATTR] for t in study.trials if NOT_WORTH_ATTR in t.user_attrs]

    (tmp_path / "costly").mkdir()
    (tmp_path / "cheap").mkdir()
    costly = not_worth(tmp_path / "costly", {"phases": {}, "launch_overhead_s": 1e9})
    cheap = not_worth(tmp_path / "cheap", {"phases": {}, "launch_overhead_s": 0.001})
    # beside a launch that costly only members the model expects nothing of stay out
    assert costly and cheap and sum(cheap) > sum(costly)


def test_a_launchs_members_leave_the_confirmations_and_the_verifying_probe_their_trials(tmp_path):
    """Members used to be counted against the whole budget: a launch late in the search took the trials kept for
    the confirmations, which then never ran (found on the H100 plan's dry run, 2026-12-07)."""
    from autotune.config import Budget, SearchOptions

    class NoisySim(SimRunner):  # TEST DOUBLE: the sim with per-probe noise, taken as a measuring backend's
        deterministic = False

    study = run_study(_cfg(tmp_path, trials=12, probe=ProbeBudget(configs_per_launch=8),
                           search=SearchOptions(confirm=2, verify=True), budget=Budget(probes=12)),
                      NoisySim(noise_rel=0.05, seed=1))
    done = [t for t in study.trials if t.state.is_finished()]
    assert len(done) == 12
    assert sum("confirms" in t.user_attrs for t in done) >= 1, "the confirmations ran"
    assert sum("verifies" in t.user_attrs for t in done) == 1, "and the export's verifying probe"
