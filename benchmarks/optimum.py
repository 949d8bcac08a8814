"""The exact optimum of the sim model over a search space, by exhaustive enumeration.

Enumerating every point is out of reach (the product of the knobs' choices is 10^8 or more), but the
model's structure makes an exact decomposition possible, and tests/benchmarks/test_optimum.py checks it
against brute force on spaces small enough to enumerate point by point:
- the rollout knobs R (rollout TP, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens, chunked
  prefill) enter only the gen time, the KV-cache check, the weight sync (with param_offload) and the
  rollout-phase memory (with what the trainer keeps resident);
- for a fixed layout-and-flags point L, each micro-batch part (the actor update's, the old-log-prob's,
  the reference's; in dynamic mode the log-prob token budget is shared) enters only its own phase's
  time, memory and rules.
So step_s = fixed + min_L [min_update(L) + min_old(L) + min_ref(L) + min_R (gen(R) + sync(R, L))], each
inner minimum over the choices that pass verl's rules and fit in memory. Used by the search benchmark to
know how close a search got.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import estimate_step_time
from autotune.model.memory import estimate_memory
from autotune.search.equivalence import layout_key, rollout_key
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import DYNAMIC_ONLY, FSDP_ONLY, MEGATRON_ONLY, STATIC_ONLY, SearchSpace
from autotune.workload import Workload
from autotune.verl.roles import separate_reference

ROLLOUT_KNOBS = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                 "enable_chunked_prefill")
PART_KNOBS = STATIC_ONLY + DYNAMIC_ONLY


@dataclass(frozen=True)
class Optimum:
    tokens_per_s_per_gpu: float
    candidate: Candidate
    points: int  # points of the space this optimum covers (the product of valid choices)


def _values(space: SearchSpace, name: str) -> list:
    if name in space.fixed:
        return [space.fixed[name]]
    dom = space.domains[name]
    if dom.choices:
        return list(dom.choices)
    return [round(dom.low + dom.step * i, 6) for i in range(round((dom.high - dom.low) / dom.step) + 1)]


def _product(space: SearchSpace, names: list[str]) -> Iterator[dict]:
    for combo in itertools.product(*(_values(space, n) for n in names)):
        yield dict(zip(names, combo))


class _Evaluator:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, workload: Workload, gpus_per_node: int, nodes: int,
                 constants: ModelConstants) -> None:
        self.model, self.gpu, self.workload = model, gpu, workload
        self.gpus_per_node, self.nodes, self.k = gpus_per_node, nodes, constants

    def __call__(self, cand: Candidate):
        layout = ParallelLayout.of(cand, self.workload, gpus_per_node=self.gpus_per_node, nodes=self.nodes)
        rules = {v.rule for v in check(self.model, self.workload, cand, layout)}
        mem = estimate_memory(self.model, self.gpu, self.workload, cand, layout, constants=self.k)
        step = estimate_step_time(self.model, self.gpu, self.workload, cand, layout, constants=self.k)
        return rules, mem, step


# which rules and phases each part owns
_PART_RULES = {
    "update": {"micro_batch_divides_mini_batch", "real_train_batch_divisible", "dynamic_bsz_token_floor",
               "megatron_vpp_micro_batches"},
    "old": {"rollout_log_prob_micro_divides_batch", "dynamic_bsz_log_prob_token_floor",
            "megatron_vpp_log_prob_micro_batches"},
    "ref": {"ref_log_prob_micro_divides_batch", "megatron_vpp_ref_micro_batches"},
}
_ROLLOUT_RULES = {"rollout_world_divisible", "rollout_replica_spans_whole_nodes", "vllm_heads_divisible_by_tp",
                  "vllm_batched_tokens_cover_seqs", "vllm_batched_tokens_cover_model_len"}


def exact_optimum(model: ModelSpec, gpu: GpuSpec, workload: Workload, space: SearchSpace, *, gpus_per_node: int,
                  nodes: int, constants: ModelConstants = DEFAULT_CONSTANTS, evaluator=None) -> Optimum | None:
    """The fastest feasible point of `space` under the sim model with these constants (None: none fits).

    `evaluator(cand) -> (rule ids, MemoryEstimate, StepTime)` replaces the sim model (the benchmark's truths);
    the decomposition stays exact as long as it keeps the structure above: gen time and the KV check depend
    on the rollout knobs only, each training phase's time and memory on the layout-and-flags point and its
    own micro-batch knobs."""
    ev = evaluator or _Evaluator(model, gpu, workload, gpus_per_node, nodes, constants)
    per_part = best_per_part(space, workload, ev)
    if not per_part:
        return None
    points = sum(p for _, _, p in per_part.values())
    _, cand, _ = min(per_part.values(), key=lambda v: v[0])
    _, _, step = ev(cand)
    return Optimum(tokens_per_s_per_gpu=step.tokens_per_s_per_gpu, candidate=cand, points=points)


def best_per_part(space: SearchSpace, workload: Workload, ev) -> dict:
    """(actor layout key, rollout setting key) (search/equivalence.LAYOUT, ROLLOUT_SETTING) -> (timed seconds,
    the pair's fastest feasible point, points covered): the exact optimum restricted to each pairing, by the
    decomposition above (issue 19's bound on a search that follows the model: benchmarks/layout_rank.py)."""
    rollout_names = [n for n in ROLLOUT_KNOBS if n in space.domains]
    gen_table = _rollout_table(space, rollout_names, ev)
    if not gen_table:
        return {}
    layout_names = [n for n in space.domains if n not in ROLLOUT_KNOBS and n not in PART_KNOBS]
    filler_rollout = {n: _values(space, n)[0] for n in rollout_names}
    best: dict = {}
    for layout_values in _product(space, layout_names):
        lv = _normalise(layout_values, space, workload)
        if lv is None:
            continue
        parts = _best_parts(space, lv, filler_rollout, ev, workload)
        if parts is None:
            continue
        train_s, part_values = parts
        lkey = layout_key(Candidate(**lv).as_params())
        for rtp, settings in gen_table.items():
            lowest_util = min(utils[0][0] for utils, _ in settings.values())
            probe = Candidate(**{**lv, **part_values, **filler_rollout, "rollout_tp": rtp,
                                 "gpu_memory_utilization": lowest_util})
            _, mem, step = ev(probe)
            # rollout-phase memory is what the trainer keeps resident plus vLLM's share (memory.py)
            other_gib = mem.phase_peak_gib["rollout"] - lowest_util * mem.capacity_gib
            util_max = (mem.capacity_gib - other_gib) / mem.capacity_gib
            for skey, (utils, best_gen) in settings.items():
                k = bisect.bisect_right([u for u, _ in utils], util_max + 1e-12)
                if k == 0:
                    continue
                gen_s, rv = best_gen[k - 1]
                total_s = train_s + gen_s + step.phase_s["update_weights"]
                seconds, cand, points = best.get((lkey, skey), (None, None, 0))
                if seconds is None or total_s < seconds:
                    seconds, cand = total_s, Candidate(**{**lv, **part_values, **rv})
                best[(lkey, skey)] = (seconds, cand, points + 1)
    return best


def _rollout_table(space: SearchSpace, names: list[str], ev: _Evaluator) -> dict:
    """rollout TP -> rollout setting key -> (ascending gpu_memory_utilization list, prefix-best (gen_s, rollout
    values)).

    gen time, the KV check and the rollout rules depend on the rollout knobs alone, so they are
    evaluated once, with the trainer at neutral values."""
    rows: dict = {}
    for rv in _product(space, names):
        rules, mem, step = ev(Candidate(**rv))
        if rules & _ROLLOUT_RULES or not mem.kv_cache_fits:
            continue
        skey = rollout_key(Candidate(**rv).as_params())
        rows.setdefault(rv["rollout_tp"], {}).setdefault(skey, []).append(
            (rv["gpu_memory_utilization"], step.phase_s["gen"], rv))
    table: dict = {}
    for rtp, settings in rows.items():
        for skey, entries in settings.items():
            entries.sort(key=lambda e: e[0])
            prefix, best = [], None
            for util, gen_s, rv in entries:
                if best is None or gen_s < best[0]:
                    best = (gen_s, rv)
                prefix.append(best)
            table.setdefault(rtp, {})[skey] = ([(u, None) for u, _, _ in entries], prefix)
    return table


def _owned() -> set:
    return set().union(*_PART_RULES.values()) | _ROLLOUT_RULES


def _normalise(values: dict, space: SearchSpace, workload: Workload) -> dict | None:
    """The candidate the sampler builds from these values, or None for a duplicate: a knob that does not
    apply (Megatron sizes under FSDP and the reverse) is counted once and set to its neutral value."""
    v = dict(values)
    megatron = v.get("actor_engine") == "megatron"
    inactive = [n for n in (FSDP_ONLY if megatron else MEGATRON_ONLY) if n in v]
    if not separate_reference(workload) and "ref_param_offload" in v:
        inactive.append("ref_param_offload")
    if any(v[n] != _values(space, n)[0] for n in inactive):
        return None
    neutral = Candidate()
    for name in inactive:
        v[name] = getattr(neutral, name)
    if not megatron:
        v["cuda_device_max_connections"] = 0
    return v


def _best_parts(space: SearchSpace, lv: dict, rv: dict, ev: _Evaluator, workload: Workload):
    """Fastest feasible choice of each micro-batch part for layout-and-flags `lv` (None: a phase never fits)."""
    dynamic = lv.get("use_dynamic_bsz", False)
    if dynamic:
        groups = {"update": ["ppo_max_token_len_per_gpu"], "old": ["log_prob_max_token_len_per_gpu"]}
        phases = {"update": ("update_actor",), "old": ("old_log_prob", "ref")}
    else:
        groups = {"update": ["ppo_micro_batch_size_per_gpu"], "old": ["log_prob_micro_batch_size_per_gpu"]}
        phases = {"update": ("update_actor",), "old": ("old_log_prob",)}
        if separate_reference(workload):
            groups["ref"] = ["ref_log_prob_micro_batch_size_per_gpu"]
            phases["ref"] = ("ref",)
    filler = {n: _values(space, n)[0] for names in groups.values() for n in names}
    chosen, train_s = {}, 0.0
    layout_rules_checked = False
    for part, names in groups.items():
        best = None
        for values in _product(space, names):
            cand = Candidate(**{**lv, **filler, **rv, **values})
            rules, mem, step = ev(cand)
            if not layout_rules_checked:
                if rules - _owned():
                    return None  # the layout itself breaks a rule
                layout_rules_checked = True
            part_rules = _PART_RULES[part] | (_PART_RULES["ref"] if dynamic and part == "old" else set())
            if rules & part_rules:
                continue
            if any(mem.phase_peak_gib.get(p, 0.0) > mem.capacity_gib for p in phases[part]):
                continue
            s = sum(step.phase_s.get(p, 0.0) for p in phases[part])
            if best is None or s < best[0]:
                best = (s, values)
        if best is None:
            return None
        train_s += best[0]
        chosen.update(best[1])
    return train_s, chosen
