import math
import operator

import numpy as np
import optuna
import pytest

from autotune.config import Budget, ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import get_runner
from autotune.search.driver import run_study
from autotune.search.equivalence import canonical_params, config_key
from autotune.search.learned import LAYOUT, PHASE_LEVELS, CorrectedModel, PhaseGP, base_prediction
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload


def _cfg(tmp_path, trials=12, **kw) -> TuneConfig:
    base = dict(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                trials=trials, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="s", out_dir=tmp_path,
                seed=3, workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())
    base.update(kw)
    return TuneConfig(**base)


def _params(**kw) -> dict:
    return canonical_params(Candidate(**kw).as_params(), True)


def test_a_probe_corrects_candidates_sharing_its_layout_most():
    levels = PHASE_LEVELS["update_actor"]
    seen = _params(actor_engine="megatron", actor_tp=2, ppo_micro_batch_size_per_gpu=4)
    gp = PhaseGP(levels, [seen], np.array([math.log(1.3)]))
    same_layout = _params(actor_engine="megatron", actor_tp=2, ppo_micro_batch_size_per_gpu=8)
    other_layout = _params(actor_engine="megatron", actor_tp=4, ppo_micro_batch_size_per_gpu=8)
    fsdp = _params(actor_engine="fsdp", ppo_micro_batch_size_per_gpu=8)
    (m_same, v_same), (m_other, v_other), (m_fsdp, v_fsdp) = (gp.predict(p) for p in (same_layout, other_layout, fsdp))
    assert math.log(1.3) > m_same > m_other > m_fsdp > 0  # the whole-phase term moves everyone a little
    assert v_same < v_other < v_fsdp
    m_seen, v_seen = gp.predict(seen)
    assert m_seen == pytest.approx(math.log(1.3), abs=0.01) and v_seen < 0.01


def test_two_layouts_disagreeing_keep_their_own_factors():
    levels = PHASE_LEVELS["update_actor"]
    a = _params(actor_engine="fsdp", ulysses_sp=1)
    b = _params(actor_engine="fsdp", ulysses_sp=2)
    gp = PhaseGP(levels, [a, b], np.array([math.log(0.8), math.log(1.25)]))
    assert gp.predict(a)[0] < math.log(0.85) and gp.predict(b)[0] > math.log(1.2)
    assert set(LAYOUT) <= set(levels[2][0])


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


def test_thompson_and_exploit_proposals_leave_slots_to_tpe_and_never_repeat_a_configuration(tmp_path):
    cfg = _cfg(tmp_path, trials=18, search=SearchOptions(warm_start=2))
    study = run_study(cfg, get_runner("sim"))
    kinds = [t.user_attrs.get("model_proposal") for t in study.trials]
    assert "exploit" in kinds and "thompson" in kinds
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
    """A job imported from a script may list several train files: the caches must not need it hashable."""
    cfg = _cfg(tmp_path, workload=Workload(train_files=["a.parquet", "b.parquet"]))
    first = base_prediction(cfg, Candidate(), cfg.workload)
    assert first.feasible and base_prediction(cfg, Candidate(), cfg.workload) is first


def test_thompson_picks_pair_an_untried_layout_with_an_untried_rollout_setting(tmp_path):
    """While such candidates exist, every Thompson pick is new in both parts; exploit picks pair parts anew."""
    cfg = _cfg(tmp_path, trials=12, search=SearchOptions(warm_start=2))
    study = run_study(cfg, get_runner("sim"))
    layout_of = operator.itemgetter(*LAYOUT)
    rollout_of = operator.itemgetter("rollout_tp", "max_num_seqs", "enable_chunked_prefill")
    layouts, rollouts, pairs, thompson, exploit = set(), set(), set(), 0, 0
    for t in study.trials:
        if t.user_attrs.get("state") not in ("measured", "simulated"):
            continue
        p = canonical_params(t.user_attrs["candidate"], True)
        if t.user_attrs.get("model_proposal") == "thompson":
            thompson += 1
            assert layout_of(p) not in layouts and rollout_of(p) not in rollouts, t.number
        elif t.user_attrs.get("model_proposal") == "exploit":
            exploit += 1
            assert (layout_of(p), rollout_of(p)) not in pairs, t.number
        layouts.add(layout_of(p))
        rollouts.add(rollout_of(p))
        pairs.add((layout_of(p), rollout_of(p)))
    assert thompson >= 4 and exploit >= 2


def test_a_pick_ignores_a_trial_whose_score_another_worker_has_not_written_yet(tmp_path):
    """Another worker's trial shows its state before its score (one storage write each); the model learns from
    finished results only (the expected-improvement incumbent hit a KeyError in CI with 3 workers on PostgreSQL)."""
    from autotune.search import learned
    from autotune.search.driver import start_study

    cfg = _cfg(tmp_path, trials=3, search=SearchOptions(warm_start=1))
    run_study(cfg, get_runner("sim"))
    space, study = start_study(cfg)
    half_written = study.ask()
    half_written.set_user_attr("state", "simulated")  # RUNNING, no tokens_per_s_per_gpu yet
    study.set_user_attr(learned.CYCLE_ATTR, learned.CYCLE.index("thompson"))
    assert learned.propose(study, cfg, space)
    assert any(t.user_attrs.get("model_proposal") == "thompson" for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,)))


def test_a_posterior_draw_has_the_gp_posterior_mean_and_variance_and_is_one_function():
    """Thompson picks score every candidate under one draw: per candidate the draws must follow the closed-form
    posterior (predict), and two candidates sharing a group must share its drawn value."""
    levels = PHASE_LEVELS["update_actor"]
    seen = [_params(actor_engine="megatron", actor_tp=2, ppo_micro_batch_size_per_gpu=4),
            _params(actor_engine="fsdp", ulysses_sp=2, ppo_micro_batch_size_per_gpu=8)]
    gp = PhaseGP(levels, seen, np.array([math.log(1.3), math.log(0.9)]))
    near = _params(actor_engine="megatron", actor_tp=2, ppo_micro_batch_size_per_gpu=8)
    unseen = _params(actor_engine="megatron", actor_tp=4, actor_pp=2, ppo_micro_batch_size_per_gpu=2)
    rng = np.random.default_rng(0)
    draws = [gp.sample(rng) for _ in range(4000)]
    for params in (seen[0], near, unseen):
        values = np.array([f(params) for f in draws])
        mean, var = gp.predict(params)
        assert values.mean() == pytest.approx(mean, abs=4 * math.sqrt(var / len(values)) + 1e-3)
        assert values.var() == pytest.approx(var, rel=0.1)
    f = draws[0]
    assert f(unseen) == f(unseen)  # a group first met in this draw keeps its value
    # a knob the update phase's groups do not hold leaves the draw unchanged; a shared untried layout moves
    # both of its micro-batch sizes together (independent draws per candidate would give correlation 0)
    assert all(g(unseen) == g({**unseen, "gpu_memory_utilization": 0.3}) for g in draws[:50])
    sibling = {**unseen, "ppo_micro_batch_size_per_gpu": 8}
    corr = np.corrcoef([g(unseen) for g in draws], [g(sibling) for g in draws])[0, 1]
    assert corr > 0.7
