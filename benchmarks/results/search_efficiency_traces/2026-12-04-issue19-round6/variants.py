"""Prior variants for learned.PHASE_LEVELS, applied by name (env VARIANT)."""
import os
from autotune.search import learned as L
def train(micro, eng, lay, m=0.05, lm=0.05, lf=0.05, lfm=0.03):
    return (((), L._ALL), (("actor_engine",), eng), (L.LAYOUT, lay), (micro, m), (L.LAYOUT + micro, lm),
            (L.LAYOUT + L.TRAIN_FLAGS, lf), (L.LAYOUT + L.TRAIN_FLAGS + micro, lfm))
SETTING = ("rollout_tp", "max_num_seqs", "enable_chunked_prefill")
def gen(tp, chunk, seqs, setting, sched, gmu=0.05, roll=0.03):
    lv = [((), L._ALL), (("rollout_tp",), tp), (("rollout_tp", "enable_chunked_prefill"), chunk),
          (("rollout_tp", "max_num_seqs"), seqs)]
    if setting: lv.append((SETTING, setting))
    lv += [(L.SCHEDULER, sched), (("rollout_tp", "gpu_memory_utilization"), gmu), (L.ROLLOUT, roll)]
    return tuple(lv)
def apply(name):
    P = dict(L.PHASE_LEVELS)
    if name in ("A", "AG", "AR"):
        P["gen"] = gen(0.1, 0.07, 0.07, 0.18, 0.05)
    if name in ("AGR", "AGRL"):
        P["gen"] = gen(0.1, 0.07, 0.07, 0.18, 0.05)
    if name == "AGRL":
        P["update_actor"] = train(L.UPDATE_MICRO, 0.15, 0.2)
        P["old_log_prob"] = train(L.OLD_MICRO, 0.15, 0.2)
        P["ref"] = train(L.REF_MICRO, 0.15, 0.2)
    if name in ("A", "AT", "AR"):
        P["update_actor"] = train(L.UPDATE_MICRO, 0.08, 0.2)
        P["old_log_prob"] = train(L.OLD_MICRO, 0.08, 0.2)
        P["ref"] = train(L.REF_MICRO, 0.08, 0.2)
    L.PHASE_LEVELS = P
v = os.environ.get("VARIANT")
if v: apply(v); print("VARIANT", v)

def _rollout_led_layout_led(cfg, space, acq, starts, pool, seed, untried):
    from autotune.search.equivalence import layout_key, rollout_key
    acq.novelty = "layout"
    lead = next((s for s in L.rank_corrected(cfg, space, acq, starts=starts, pool=pool, seed=seed) if untried(s)), None)
    if lead is None:
        acq.novelty = "both"; acq.forget()
        return []
    acq.novelty = "rollout"; acq.forget()
    order = list(dict.fromkeys(rollout_key(s.candidate.as_params())
                               for s in L.rank_corrected(cfg, space, acq, starts=starts, pool=pool, seed=seed) if untried(s)))
    acq.novelty = ("with", layout_key(lead.candidate.as_params())); acq.forget()
    withs = L.rank_corrected(cfg, space, acq, starts=[lead.candidate], pool=pool, seed=seed)
    rank = {r: i for i, r in enumerate(order)}
    withs.sort(key=lambda s: (rank.get(rollout_key(s.candidate.as_params()), len(rank)), -s.score))
    return withs + [lead]

_orig_novel = L.Acquisition._novel
def _novel(self, params):
    if self.novelty == "rollout" and self.refine is None and self.tried_parts is not None:
        from autotune.search.equivalence import rollout_key
        return rollout_key(params) not in self.tried_parts[1]
    return _orig_novel(self, params)
if v and "R" in v:
    L.Acquisition._novel = _novel
    L._layout_led = _rollout_led_layout_led
