"""Warm start: let the cost model rank the valid space and start the study from its best predictions.

The space is too large to enumerate in general (10^8+ points), so the ranking samples it uniformly
(respecting which knobs apply under which engine and batching mode), keeps the points verl's rules and
the memory gate accept, and polishes the best few by coordinate descent over every knob. Each trial
costs the model about 50 microseconds, so a few thousand samples take well under a second.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.config import TuneConfig
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.cost import estimate_step_time
from autotune.model.host_memory import estimate_host_memory
from autotune.model.memory import estimate_memory
from autotune.search.equivalence import layout_key, near_twins, rollout_key
from autotune.search.prescreen import MemoryGate, memory_ratio
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import SearchSpace
from autotune.workload import Workload


@dataclass(frozen=True)
class Ranked:
    predicted_tokens_per_s_per_gpu: float
    candidate: Candidate
    workload: Workload


def sample_point(space: SearchSpace, workload: Workload, rng: random.Random) -> tuple[Candidate, Workload]:
    values: dict = {}
    for gate in ("actor_engine", "use_dynamic_bsz"):
        values[gate] = space.fixed.get(gate, _draw(space, gate, rng))
    for name in space.active_knobs(values, workload):
        if name not in values:
            values[name] = space.fixed[name] if name in space.fixed else _draw(space, name, rng)
    if values.get("actor_engine") != "megatron":
        values["cuda_device_max_connections"] = 0
    changes = {n: rng.choice(d.choices) for n, d in space.workload_domains.items()}
    from dataclasses import replace
    return Candidate(**values), (replace(workload, **changes) if changes else workload)


def _draw(space: SearchSpace, name: str, rng: random.Random):
    dom = space.domains[name]
    if dom.choices:
        return rng.choice(dom.choices)
    steps = round((dom.high - dom.low) / dom.step)
    return round(dom.low + dom.step * rng.randint(0, steps), 6)


def predicted(cfg: TuneConfig, cand: Candidate, workload: Workload, gate: MemoryGate,
              constants: ModelConstants = DEFAULT_CONSTANTS, factors: Mapping[str, float] | None = None) -> float | None:
    """Predicted tokens/s/GPU, or None when verl's rules or the memory gate would reject it. `factors`: measured
    over predicted seconds per phase on this kind of node (its profile, search/node_prior.py)."""
    layout = ParallelLayout.of(cand, workload, gpus_per_node=cfg.gpus_per_node, nodes=cfg.nodes)
    if check(cfg.model, workload, cand, layout):
        return None
    mem = estimate_memory(cfg.model, cfg.gpu, workload, cand, layout, constants=constants)
    if not gate.admits(memory_ratio(mem)) or not mem.kv_cache_fits:
        return None
    if not estimate_host_memory(cfg.model, workload, cand, layout, gpus_per_node=cfg.gpus_per_node,
                                capacity_gib=cfg.host_mem_gib, constants=constants).fits:
        return None
    step = estimate_step_time(cfg.model, cfg.gpu, workload, cand, layout, constants=constants,
                              logprob_loop=cfg.logprob_loop, vllm_eager=cfg.vllm_eager)
    if not factors:
        return step.tokens_per_s_per_gpu
    step_s = step.step_s + sum(s * (factors.get(p, 1.0) - 1.0) for p, s in step.phase_s.items())
    return step.tokens_per_step / step_s / layout.world_size


def neighbours(space: SearchSpace, cand: Candidate, workload: Workload):
    params = cand.as_params()
    partial = {"actor_engine": params["actor_engine"], "use_dynamic_bsz": params["use_dynamic_bsz"]}
    for name in space.active_knobs(partial, workload):
        if name in space.fixed or name in ("actor_engine", "use_dynamic_bsz"):
            continue
        for value in space.domains[name].values():
            if value != params[name]:
                yield cand.with_(**{name: value})


def polish(cfg: TuneConfig, space: SearchSpace, start: Ranked, gate: MemoryGate, rounds: int = 3,
           factors: Mapping[str, float] | None = None) -> Ranked:
    """Coordinate descent from `start` over every applicable knob, on the model's prediction."""
    best = start
    for _ in range(rounds):
        improved = False
        for cand in neighbours(space, best.candidate, best.workload):
            score = predicted(cfg, cand, best.workload, gate, factors=factors)
            if score is not None and score > best.predicted_tokens_per_s_per_gpu * 1.0001:
                best, improved = Ranked(score, cand, best.workload), True
        if not improved:
            break
    return best


def rank_space(cfg: TuneConfig, space: SearchSpace, gate: MemoryGate, *, samples: int = 3000, keep: int = 3,
               seed: int | None = None, starts: list[Ranked] = (),
               factors: Mapping[str, float] | None = None) -> list[Ranked]:
    """The model's `keep` best distinct candidates (different layouts or batching modes first).

    `starts` (e.g. the best measured configurations) are polished along with the best samples."""
    rng = random.Random(seed)
    scored: list[Ranked] = list(starts)
    for _ in range(samples):
        cand, workload = sample_point(space, cfg.workload, rng)
        score = predicted(cfg, cand, workload, gate, factors=factors)
        if score is not None:
            scored.append(Ranked(score, cand, workload))
    scored.sort(key=lambda r: r.predicted_tokens_per_s_per_gpu, reverse=True)
    picked: list[Ranked] = []
    seen: set = set()
    for r in scored:
        if len(picked) >= keep * 3:
            break
        shape = _shape(r.candidate.as_params())
        if shape in seen:
            continue
        seen.add(shape)
        picked.append(polish(cfg, space, r, gate, factors=factors))
    picked.sort(key=lambda r: r.predicted_tokens_per_s_per_gpu, reverse=True)
    return _spread(picked, keep)


def expert_parallel_start(cfg: TuneConfig, space: SearchSpace, gate: MemoryGate, *, samples: int = 1500,
                          seed: int | None = None, factors: Mapping[str, float] | None = None) -> Ranked | None:
    """For an MoE model: the model's best Megatron point with experts spread over the most GPUs the space allows
    (the largest EP verl's rules and memory admit), whatever the model ranks it.

    verl's own recipes for MoE spread the experts wide: Qwen3-30B-A3B on 8 GPUs at TP1 PP1 EP8 (MFU 0.40),
    Qwen3-235B-A22B at EP4, DeepSeek-V3 at EP8-32 (docs/perf/dpsk.md). The cost model has no MoE measurement
    yet and ranks expert parallelism low, so without this seed a study rarely reaches it (none in 40 trials of
    Qwen3-30B-A3B on 8 GPUs). One probe settles what the prediction cannot.
    """
    from dataclasses import replace

    ep = space.domains.get("actor_ep")
    engines = space.domains["actor_engine"]
    if ep is None or not cfg.model.is_moe or "actor_ep" in space.fixed or not engines.contains("megatron") \
            or space.fixed.get("actor_engine", "megatron") != "megatron":
        return None
    for size in sorted((e for e in ep.values() if e > 1), reverse=True):
        pinned = replace(space, fixed={**space.fixed, "actor_engine": "megatron", "actor_ep": size})
        ranked = rank_space(cfg, pinned, gate, samples=samples, keep=1, seed=seed, factors=factors)
        if ranked:
            return ranked[0]
    return None


def _spread(ranked: list[Ranked], keep: int) -> list[Ranked]:
    """The best `keep`, each with an actor layout and a rollout setting no better one has while such remain
    (then one of the two new, then any point that is not a near-twin of a pick: search/equivalence.near_twins).
    Polishing pulls the best samples to nearly one point;
    probes of near-twins teach the phase corrections (search/learned.py) little, one of each part a lot."""
    chosen: list[Ranked] = []
    layouts, rollouts = set(), set()
    parts = [(layout_key(p), rollout_key(p)) for p in (r.candidate.as_params() for r in ranked)]
    for need in (2, 1, 0):
        for r, (layout, rollout) in zip(ranked, parts):
            if len(chosen) >= keep:
                return chosen
            params = r.candidate.as_params()
            if any(near_twins(params, c.candidate.as_params()) for c in chosen):
                continue
            if (layout not in layouts) + (rollout not in rollouts) >= need:
                chosen.append(r)
                layouts.add(layout)
                rollouts.add(rollout)
    return chosen


def _shape(params: Mapping) -> tuple:
    return (params["actor_engine"], params["actor_tp"], params["actor_pp"], params["ulysses_sp"],
            params["rollout_tp"], params["use_dynamic_bsz"])
