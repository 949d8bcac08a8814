import math
import operator

import numpy as np
import optuna
import pytest

from autotune.config import SearchOptions
from autotune.backends.base import get_runner
from autotune.search.driver import run_study
from autotune.search.equivalence import LAYOUT, canonical_params, config_key
from autotune.search.learned import CorrectedModel, base_prediction, expected_improvement
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload
from sim_study import sim_cfg as _cfg




def _params(**kw) -> dict:
    return canonical_params(Candidate(**kw).as_params(), True)


def test_corrected_model_learns_a_slower_generation_from_its_phase_times(tmp_path):
    from dataclasses import replace as dc_replace

    from autotune.model.calibration import DEFAULT_CONSTANTS
    from autotune.backends.sim import SimRunner

    slow_decode = dc_replace(DEFAULT_CONSTANTS, rollout=dc_replace(DEFAULT_CONSTANTS.rollout,
                                                                   decode_hbm_efficiency=DEFAULT_CONSTANTS.rollout.decode_hbm_efficiency / 2))
    cfg = _cfg(tmp_path, trials=4, search=SearchOptions(warm_start=2))
    study = run_study(cfg, SimRunner(constants=slow_decode))
    model = CorrectedModel.from_study(study, cfg)
    cand = Candidate(rollout_tp=4, max_num_seqs=512)
    base = base_prediction(cfg, cand, cfg.workload)
    gen_mean, _ = model.gps["gen"].predict(canonical_params(cand.as_params(), True))
    upd_mean, _ = model.gps["update_actor"].predict(canonical_params(cand.as_params(), True))
    assert gen_mean > math.log(1.1) and abs(upd_mean) < 0.02
    params = canonical_params(cand.as_params(), True)
    assert model.step_s(params, base) > sum(base.phase_s.values())
    mean, var = model.log_time(params, base)
    assert math.exp(mean) > sum(base.phase_s.values()) and var > 0


def test_proposals_improve_and_exploit_leave_slots_to_tpe_and_never_repeat_a_configuration(tmp_path):
    cfg = _cfg(tmp_path, trials=18, search=SearchOptions(warm_start=2))
    study = run_study(cfg, get_runner("sim"))
    kinds = [t.user_attrs.get("model_proposal") for t in study.trials]
    assert "exploit" in kinds and "improve" in kinds
    assert any(k is None and not t.user_attrs.get("baseline") and t.user_attrs.get("warm_start") is None
               for k, t in zip(kinds, study.trials)), "TPE keeps some slots"
    proposed = [config_key(t.user_attrs["candidate"], True) for t in study.trials if t.user_attrs.get("model_proposal")]
    assert len(proposed) == len(set(proposed))
    launched = [config_key(t.user_attrs["candidate"], True) for t in study.trials if t.user_attrs.get("launched")]
    assert len(launched) == len(set(launched)), "an equivalent configuration is never launched twice"


def test_learning_off_leaves_every_slot_to_the_sampler(tmp_path):
    cfg = _cfg(tmp_path, trials=8, search=SearchOptions(warm_start=0, learn=False))
    study = run_study(cfg, get_runner("sim"))
    assert not any(t.user_attrs.get("model_proposal") for t in study.trials)


def test_a_workload_holding_lists_is_predicted_and_cached(tmp_path):
    """A job imported from a script may list several train files: the caches and the proposals must not need it
    hashable."""
    cfg = _cfg(tmp_path, trials=8, workload=Workload(train_files=["a.parquet", "b.parquet"]),
               search=SearchOptions(warm_start=2))
    first = base_prediction(cfg, Candidate(), cfg.workload)
    assert first.feasible and base_prediction(cfg, Candidate(), cfg.workload) is first
    study = run_study(cfg, get_runner("sim"))
    assert {"improve", "exploit"} <= {t.user_attrs.get("model_proposal") for t in study.trials}


def test_expected_improvement_is_the_lognormal_partial_expectation():
    rng = np.random.default_rng(0)
    mean, var, best = math.log(100.0), 0.15 ** 2, 105.0
    x = np.exp(rng.normal(mean, math.sqrt(var), 400_000))
    assert expected_improvement(mean, var, best) == pytest.approx(np.maximum(x - best, 0).mean(), rel=0.02)
    assert expected_improvement(math.log(50.0), 0.01 ** 2, 100.0) == pytest.approx(0.0, abs=1e-9)
    # more uncertainty, more to gain below the incumbent
    assert expected_improvement(mean, 0.3 ** 2, best) > expected_improvement(mean, var, best)


def test_log_time_matches_the_first_two_moments_of_the_summed_phases(tmp_path):
    """Fenton-Wilkinson: the log-normal fitted to the sum has its mean and variance (checked by sampling)."""
    cfg = _cfg(tmp_path)
    seen = _params(actor_engine="fsdp", ulysses_sp=2)
    model = CorrectedModel(cfg, [(seen, {"gen": 40.0, "update_actor": 60.0}, {"gen": 50.0, "update_actor": 54.0}, 3.0)])
    other = _params(actor_engine="megatron", actor_tp=2)
    base = base_prediction(cfg, Candidate(**other), cfg.workload)
    mean, var = model.log_time(other, base)
    rng = np.random.default_rng(1)
    total = np.full(200_000, model.other_s)
    for phase, seconds in base.phase_s.items():
        gp = model.gps.get(phase)
        m, v = gp.predict(other) if gp else (0.0, 0.8 ** 2)
        total += seconds * np.exp(rng.normal(m, math.sqrt(v), total.size))
    assert math.exp(mean + var / 2) == pytest.approx(total.mean(), rel=0.01)
    assert math.expm1(var) * math.exp(2 * mean + var) == pytest.approx(total.var(), rel=0.05)


def test_each_pick_kind_probes_what_it_is_for(tmp_path):
    """While such candidates exist, every improve pick is new in both parts; exploit picks pair parts anew; the
    refine pick keeps the best measured configuration's layout and rollout setting."""
    cfg = _cfg(tmp_path, trials=16, search=SearchOptions(warm_start=2))
    study = run_study(cfg, get_runner("sim"))
    layout_of = operator.itemgetter(*LAYOUT)
    rollout_of = operator.itemgetter("rollout_tp", "max_num_seqs", "enable_chunked_prefill")
    layouts, rollouts, pairs, kinds = set(), set(), set(), []
    best, best_pair = 0.0, None
    for t in study.trials:
        if t.user_attrs.get("state") not in ("measured", "simulated"):
            continue
        p = canonical_params(t.user_attrs["candidate"], True)
        kind = t.user_attrs.get("model_proposal")
        kinds.append(kind)
        if kind == "improve":
            assert layout_of(p) not in layouts and rollout_of(p) not in rollouts, t.number
        elif kind == "exploit":
            assert (layout_of(p), rollout_of(p)) not in pairs, t.number
        elif kind == "refine":
            assert (layout_of(p), rollout_of(p)) == best_pair, t.number
        layouts.add(layout_of(p))
        rollouts.add(rollout_of(p))
        pairs.add((layout_of(p), rollout_of(p)))
        if t.user_attrs.get("tokens_per_s_per_gpu", 0) > best:
            best, best_pair = t.user_attrs["tokens_per_s_per_gpu"], (layout_of(p), rollout_of(p))
    assert kinds.count("improve") >= 6 and kinds.count("exploit") >= 1 and kinds.count("refine") == 1


def test_refine_moves_two_knobs_at_once_within_the_pairing(tmp_path):
    """Checkpointing off with a smaller micro-batch is one move: coordinate descent would need the infeasible
    middle point (checkpointing off at the full micro-batch)."""
    from autotune.search import learned
    from autotune.search.equivalence import layout_key, rollout_key
    from autotune.search.prescreen import MemoryGate
    from autotune.search.driver import build_space

    cfg = _cfg(tmp_path)
    space = build_space(cfg)
    model = CorrectedModel(cfg, [])
    acq = learned.Acquisition(cfg, model, MemoryGate(), None)
    start = Candidate(actor_engine="fsdp2", ulysses_sp=2, use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=64,
                      gradient_checkpointing=True)
    acq.refine = (layout_key(start.as_params()), rollout_key(start.as_params()))
    ranked = learned.refine_ranked(space, acq, start, cfg.workload)
    assert ranked and all((layout_key(s.candidate.as_params()), rollout_key(s.candidate.as_params())) == acq.refine
                          for s in ranked)
    off = {s.candidate.ppo_micro_batch_size_per_gpu for s in ranked if not s.candidate.gradient_checkpointing
           and s.candidate.with_(ppo_micro_batch_size_per_gpu=64, gradient_checkpointing=True) == start}
    assert 64 not in off, "checkpointing off at micro-batch 64 does not fit this GPU"
    assert 16 in off, "checkpointing off with a quarter of the micro-batch is reached in one step"


def test_an_improve_pick_ignores_a_trial_whose_score_another_worker_has_not_written_yet(tmp_path):
    """Another worker's trial shows its state before its score (one storage write each): the incumbent is taken
    from finished results only (seen as a KeyError in CI with 3 workers on PostgreSQL)."""
    from autotune.search import learned
    from autotune.search.driver import start_study

    cfg = _cfg(tmp_path, trials=3, search=SearchOptions(warm_start=1))
    run_study(cfg, get_runner("sim"))
    space, study = start_study(cfg)
    half_written = study.ask()
    half_written.set_user_attr("state", "simulated")  # RUNNING, no tokens_per_s_per_gpu yet
    study.set_user_attr(learned.CYCLE_ATTR, learned.CYCLE.index("improve"))
    assert learned.propose(study, cfg, space)
    assert any(t.user_attrs.get("model_proposal") == "improve" for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,)))


def test_every_layout_is_scored_with_the_best_rollout_settings_not_its_pool_entries_own(tmp_path):
    """An improve pick needs an untried rollout setting. The model's best layout whose pool entries all hold tried
    rollout settings is still proposed, with an untried one (on 32B development machine 16 the model's best
    layout had one admissible entry, with a poor rollout setting, and was never probed in 40)."""
    from autotune.search import learned
    from autotune.search.driver import build_space
    from autotune.search.equivalence import layout_key, rollout_key
    from autotune.search.prescreen import MemoryGate

    cfg = _cfg(tmp_path)
    space = build_space(cfg)
    pool = learned.candidate_pool(optuna.create_study(), cfg, space)
    best = learned.best_by_layout(cfg, pool, MemoryGate())

    def predicted(point):
        base = base_prediction(cfg, *point)
        return base.tokens_per_step / base.world / sum(base.phase_s.values())

    target = max(best, key=lambda key: predicted(best[key]))
    tried = {rollout_key(c.as_params()) for c, _ in pool.values() if layout_key(c.as_params()) == target}
    acq = learned.Acquisition(cfg, CorrectedModel(cfg, []), MemoryGate(), None)
    acq.tried_parts = (set(), tried, set())
    ranked = learned.rank_corrected(cfg, space, acq, starts=[], pool=dict(pool), samples=0)
    mine = [s for s in ranked if layout_key(s.candidate.as_params()) == target]
    assert mine and all(rollout_key(s.candidate.as_params()) not in tried for s in mine)


def test_an_improve_pick_takes_the_best_untried_layout_then_an_untried_rollout_setting_for_it(tmp_path):
    """The layout leads: the pick's layout is the one with the best expected improvement under any rollout setting,
    even where the best-scored rollout settings are tried, and its rollout setting is an untried one."""
    from autotune.search import learned
    from autotune.search.driver import build_space
    from autotune.search.equivalence import layout_key, rollout_key
    from autotune.search.prescreen import MemoryGate

    cfg = _cfg(tmp_path)
    space = build_space(cfg)
    pool = learned.candidate_pool(optuna.create_study(), cfg, space)

    def acquisition(tried_rollouts):
        acq = learned.Acquisition(cfg, CorrectedModel(cfg, []), MemoryGate(), None, incumbent=1000.0)
        acq.tried_parts = (set(), tried_rollouts, set())
        return acq

    free = learned.rank_corrected(cfg, space, acquisition(set()), starts=[], pool=dict(pool), samples=0)
    best_layout = layout_key(free[0].candidate.as_params())
    # the rollout settings of the best layout's best-scored configurations, taken: scoring the pair at once then
    # picks another layout (FSDP 1 with an untried rollout setting, on this model and space)
    tried = {rollout_key(s.candidate.as_params()) for s in free if layout_key(s.candidate.as_params()) == best_layout}
    picks = learned._layout_led(cfg, space, acquisition(tried), [], dict(pool), 0, lambda s: True)
    assert picks and layout_key(picks[0].candidate.as_params()) == best_layout
    assert rollout_key(picks[0].candidate.as_params()) not in tried


def test_an_improve_pick_pairs_the_lead_layout_with_the_rollout_setting_that_leads_under_any_layout(
        tmp_path, monkeypatch):
    """The rollout setting is led like the layout: the pick takes the untried setting ranked first under any
    layout (the one the model would teach next), not the one that scores best with the lead layout; the ranking is
    a test double that answers by the acquisition's novelty."""
    from autotune.search import learned
    from autotune.search.equivalence import layout_key, rollout_key

    lead = Candidate(actor_engine="megatron", actor_tp=2, actor_pp=2)
    other = Candidate(actor_engine="megatron", actor_tp=4)
    with_a, with_b = lead.with_(rollout_tp=2, max_num_seqs=512), lead.with_(rollout_tp=4, max_num_seqs=1024)
    ranked_by_novelty = {
        "layout": [lead],
        # under any layout setting B leads (here with another layout), setting A second
        "rollout": [other.with_(rollout_tp=4, max_num_seqs=1024), other.with_(rollout_tp=2, max_num_seqs=512)],
        # with the lead layout, A scores best
        ("with", layout_key(lead.as_params())): [with_a, with_b],
    }
    seen = []

    def ranking(cfg, space, acq, *, starts, pool=None, samples=100, keep_shapes=5, seed=None):
        seen.append(acq.novelty)
        cands = ranked_by_novelty[acq.novelty]
        return [learned.Scored(100.0 - i, 1000.0, c, Workload()) for i, c in enumerate(cands)]

    monkeypatch.setattr(learned, "rank_corrected", ranking)
    acq = learned.Acquisition(_cfg(tmp_path), CorrectedModel(_cfg(tmp_path), []), None, None, incumbent=900.0)
    picks = learned._layout_led(acq.cfg, None, acq, [], {}, 0, lambda s: True)
    assert seen == ["layout", "rollout", ("with", layout_key(lead.as_params()))]
    assert [(layout_key(s.candidate.as_params()), rollout_key(s.candidate.as_params())) for s in picks[:2]] == [
        (layout_key(lead.as_params()), rollout_key(with_b.as_params())),
        (layout_key(lead.as_params()), rollout_key(with_a.as_params()))]
    # settings the any-layout ranking does not name keep their order with the lead layout
    ranked_by_novelty["rollout"] = []
    picks = learned._layout_led(acq.cfg, None, acq, [], {}, 0, lambda s: True)
    assert [rollout_key(s.candidate.as_params()) for s in picks[:2]] == [rollout_key(with_a.as_params()),
                                                                       rollout_key(with_b.as_params())]


def test_configurations_of_one_launch_share_its_effect_and_a_repeat_in_it_reads_the_launch(tmp_path):
    """Issue 34: a shared launch's configurations ran on one node, one after the other; its slowness is theirs alike.
    The job (A) was measured alone at the model's times; a later launch measured A again and a new layout (B, with
    a rollout setting nobody else probed) and ran x1.25 slow in every phase. Taken as separate probes, B's x1.25 is
    B's; taken as one launch, A's repeat says the launch was slow, and B keeps little of it."""
    cfg = _cfg(tmp_path, trials=4)
    a = Candidate(rollout_tp=2)
    b = Candidate(actor_engine="megatron", actor_tp=2, rollout_tp=4, max_num_seqs=512)
    pa, pb = (canonical_params(c.as_params(), True) for c in (a, b))
    base_a, base_b = (base_prediction(cfg, c, cfg.workload).phase_s for c in (a, b))
    slow = 1.25
    obs = [(pa, base_a, dict(base_a), None), (pa, base_a, dict(base_a), None),
           (pa, base_a, {p: s * slow for p, s in base_a.items()}, None),
           (pb, base_b, {p: s * slow for p, s in base_b.items()}, None)]
    launch = ("/runs/launch-2", (7, 8))

    def believed_slowness(launches) -> float:
        """B's update as the corrected model believes it, over the model's own."""
        model = CorrectedModel(cfg, obs, noise_rel=0.1, launches=launches)
        return math.exp(model.phase_residual("update_actor", pb)[0])

    apart = believed_slowness(None)
    together = believed_slowness([None, None, launch, launch])
    assert apart > 1.15  # each probe its own effect: B's update is believed ~x1.2 slow
    assert together < 1.0 + 0.5 * (apart - 1.0)  # the launch's effect, read from A's repeat, is taken out of B
    # and the launch is read as the slow one (its effect's posterior mean), the job's own launches as not slow
    effects = CorrectedModel(cfg, obs, noise_rel=0.1, launches=[None, None, launch, launch]).launch_effects
    assert math.exp(effects[launch]) > 1.1
    assert all(math.exp(effects[("observation", i)]) < 1.0 for i in (0, 1))
    # a deterministic backend (no shared noise): launches change nothing, and no launch effect is read
    deterministic = CorrectedModel(cfg, obs, launches=[None, None, launch, launch])
    assert deterministic.phase_residual("update_actor", pb) == pytest.approx(
        CorrectedModel(cfg, obs).phase_residual("update_actor", pb))
    assert deterministic.launch_effects == {}
