"""One phase's GP of log(measured / predicted) (autotune/search/phase_gp.py): which candidates a probe corrects, and
the flag terms' scale chosen by the probes' evidence."""

import math

import numpy as np
import pytest

from autotune.search.equivalence import LAYOUT, canonical_params
from autotune.search.phase_gp import FLAG_SCALES, PHASE_LEVELS, PhaseGP, best_evidence_gp
from autotune.spaces.candidate import Candidate


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


def test_a_flag_measured_slow_in_one_layout_is_expected_slow_in_another():
    """Issue 34's quirk truth (a factor per flag, across layouts): the flag's own term carries what one layout's
    probes with it on and off taught to a layout never probed. Before, the flag only shared terms with its layout."""
    levels = PHASE_LEVELS["update_actor"]
    on = _params(actor_engine="fsdp", ulysses_sp=1, gradient_checkpointing=True)
    off = _params(actor_engine="fsdp", ulysses_sp=1, gradient_checkpointing=False)
    gp = PhaseGP(levels, [on, off], np.array([math.log(1.3), 0.0]))
    other_on = _params(actor_engine="fsdp", ulysses_sp=2, gradient_checkpointing=True)
    other_off = _params(actor_engine="fsdp", ulysses_sp=2, gradient_checkpointing=False)
    (m_on, _), (m_off, _) = gp.predict(other_on), gp.predict(other_off)
    assert m_on - m_off > 0.05  # 0.0 without a term per flag


def test_the_flag_terms_scale_is_what_the_probes_residuals_support():
    """Each phase picks its flag terms' prior scale by marginal likelihood: a flag that erred alike in three layouts
    keeps a term, residuals that ignore the flag drop it (a fixed term absorbed probe noise on the layout truth)."""
    levels = PHASE_LEVELS["update_actor"]
    keys = [_params(actor_engine="fsdp", ulysses_sp=sp, gradient_checkpointing=on) for sp in (1, 2, 4)
            for on in (True, False)]
    flag_effect = np.array([math.log(1.3) if k["gradient_checkpointing"] else 0.0 for k in keys])
    layout_only = np.array([math.log(1.3) if k["ulysses_sp"] == 2 else 0.0 for k in keys])

    def flag_scale(gp):
        return max([s for knobs, s in gp.levels if knobs == ("gradient_checkpointing",)], default=0.0)

    assert flag_scale(best_evidence_gp(levels, keys, flag_effect, 0.05)) == max(FLAG_SCALES)
    assert flag_scale(best_evidence_gp(levels, keys, layout_only, 0.05)) == 0.0


def test_a_probe_whose_every_phase_ran_slow_is_read_as_a_slow_probe_where_other_probes_pin_a_phase():
    """Issue 34: a slow launch moves all of a probe's phases alike (the job on two H200s: every phase x1.2-1.5). Four
    probes pinned generation under one rollout setting; a fifth, of a new actor layout with that setting, ran x1.25
    slow in every phase. Learned phase by phase, the new layout's update takes most of the x1.25; coupled by a
    shared per-probe effect, generation's x1.25 says the probe was slow and the update keeps much less of it."""
    from autotune.search.phase_gp import couple_probes

    gen_keys, upd_keys = [], []
    for sp in (1, 2, 4, 8):
        p = _params(actor_engine="fsdp", ulysses_sp=sp, rollout_tp=2)
        gen_keys.append(p)
        upd_keys.append(p)
    new = _params(actor_engine="megatron", actor_tp=2, rollout_tp=2)
    gen_keys.append(new)
    upd_keys.append(new)
    slow = math.log(1.25)
    y_gen = np.array([0.0, 0.0, 0.0, 0.0, slow])
    y_upd = np.array([0.0, 0.0, 0.0, 0.0, slow])
    noise, own = 0.1, 0.05
    shared = noise ** 2 - own ** 2

    def fit(coupled: bool) -> float:
        gps = {"gen": PhaseGP(PHASE_LEVELS["gen"], gen_keys, y_gen, own if coupled else noise),
               "update_actor": PhaseGP(PHASE_LEVELS["update_actor"], upd_keys, y_upd, own if coupled else noise)}
        if coupled:
            couple_probes(gps, {"gen": [0, 1, 2, 3, 4], "update_actor": [0, 1, 2, 3, 4]}, shared)
        return gps["update_actor"].predict(new)[0]

    apart, together = fit(False), fit(True)
    assert apart > 0.7 * slow  # phase by phase: the new layout is believed ~x1.2 slow
    assert together < 0.6 * apart  # the shared effect takes the probe's factor out of the update
    # and it is the fifth probe's effect that holds it (its posterior mean), not the four that pinned generation
    from autotune.search.phase_gp import shared_effects

    gps = {"gen": PhaseGP(PHASE_LEVELS["gen"], gen_keys, y_gen, own),
           "update_actor": PhaseGP(PHASE_LEVELS["update_actor"], upd_keys, y_upd, own)}
    probes = {"gen": [0, 1, 2, 3, 4], "update_actor": [0, 1, 2, 3, 4]}
    couple_probes(gps, probes, shared)
    effects = shared_effects(gps, probes, shared)
    assert effects[4] > 0.4 * slow and all(abs(effects[i]) < 0.25 * effects[4] for i in range(4))
    assert shared_effects(gps, probes, 0.0) == {}
    # nothing shared (a deterministic backend): coupling changes nothing
    gps = {"gen": PhaseGP(PHASE_LEVELS["gen"], gen_keys, y_gen, noise),
           "update_actor": PhaseGP(PHASE_LEVELS["update_actor"], upd_keys, y_upd, noise)}
    couple_probes(gps, {"gen": [0, 1, 2, 3, 4], "update_actor": [0, 1, 2, 3, 4]}, 0.0)
    assert gps["update_actor"].predict(new)[0] == pytest.approx(apart)


def test_with_one_phase_measured_the_shared_effect_is_that_phases_noise():
    """A study whose probes timed one phase only: the coupled GP (own noise + shared effect) is the phase's GP at the
    probe's whole noise, not one that takes the probe for 5% noise."""
    from autotune.search.phase_gp import couple_probes

    keys = [_params(actor_engine="fsdp", ulysses_sp=sp) for sp in (1, 2, 4)]
    y = np.array([0.1, -0.05, 0.2])
    noise, own = 0.1, 0.05
    whole = PhaseGP(PHASE_LEVELS["update_actor"], keys, y, noise)
    gps = {"update_actor": PhaseGP(PHASE_LEVELS["update_actor"], keys, y, own)}
    couple_probes(gps, {"update_actor": [0, 1, 2]}, noise ** 2 - own ** 2)
    other = _params(actor_engine="megatron", actor_tp=2)
    for p in keys + [other]:
        assert gps["update_actor"].predict(p) == pytest.approx(whole.predict(p))
