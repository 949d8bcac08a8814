"""Can this model run on these GPUs at all? Checked before a study is created, so nothing is stored."""

from __future__ import annotations

import itertools

from autotune.errors import ConfigError
from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.model.memory import estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import default_domains
from autotune.workload import Workload
from autotune.verl.roles import separate_reference


def smallest_footprint(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int,
                       nodes: int, violations: dict | None = None) -> tuple[float, Candidate | None]:
    """Lowest predicted peak (GiB) over valid layouts with every memory saver on, and that candidate.
    `violations`, when given, collects verl's rule messages that ruled layouts out (rule id -> message)."""
    world = gpus_per_node * nodes
    dom = default_domains(model, workload, world=world, gpus_per_node=gpus_per_node)
    savers = dict(param_offload=True, optimizer_offload=True, ref_param_offload=separate_reference(workload),
                  gradient_checkpointing=True, use_dynamic_bsz=True,
                  ppo_max_token_len_per_gpu=workload.seq_len, log_prob_max_token_len_per_gpu=workload.seq_len,
                  max_num_seqs=64, max_num_batched_tokens=max(4096, 64))
    layouts = [Candidate(actor_engine="fsdp", ulysses_sp=sp, activation_offload=True, rollout_tp=rtp, **savers)
               for sp in dom["ulysses_sp"].choices for rtp in dom["rollout_tp"].choices]
    eps = dom["actor_ep"].choices if "actor_ep" in dom else (1,)
    for tp, pp, ep, rtp in itertools.product(dom["actor_tp"].choices, dom["actor_pp"].choices, eps,
                                             dom["rollout_tp"].choices):
        layouts.append(Candidate(actor_engine="megatron", actor_tp=tp, actor_pp=pp, actor_ep=ep, rollout_tp=rtp,
                                 cuda_device_max_connections=1, **savers))
    best: tuple[float, Candidate | None] = (float("inf"), None)
    for cand in layouts:
        layout = ParallelLayout.of(cand, workload, gpus_per_node=gpus_per_node, nodes=nodes)
        broken = check(model, workload, cand, layout)
        if broken:
            if violations is not None:
                for v in broken:
                    violations.setdefault(v.rule, v.message)
            continue
        kv_fits = False
        for util in (0.3, 0.5, 0.7, 0.9):
            trial = cand.with_(gpu_memory_utilization=util)
            mem = estimate_memory(model, gpu, workload, trial, layout)
            kv_fits = kv_fits or mem.kv_cache_fits
            if mem.kv_cache_fits and mem.peak_gib < best[0]:
                best = (mem.peak_gib, trial)
        if not kv_fits and violations is not None:
            violations.setdefault("kv_cache", "memory bound: the weights leave vLLM no room for the KV cache of one "
                                  f"{workload.seq_len}-token sequence at any gpu_memory_utilization up to 0.9")
    return best


def fits(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int, nodes: int) -> bool:
    peak_gib, cand = smallest_footprint(model, gpu, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    return cand is not None and peak_gib <= gpu.mem_gib


# GPUs in a node as sold (HGX/DGX H100, H200, B200: 8): a count past it is met with more nodes, not a larger node
NODE_GPUS = 8
MAX_HINT_NODES = 64


def working_gpu_counts(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int, nodes: int,
                       want: int = 3) -> list[int]:
    """Nearby GPUs-per-node counts (up to a node's NODE_GPUS, or the count given when larger; nearest first) on which
    some layout is valid and fits."""
    nearby = sorted((g for g in range(1, max(NODE_GPUS, gpus_per_node) + 1) if g != gpus_per_node),
                    key=lambda g: (abs(g - gpus_per_node), -g))
    found = []
    for g in nearby:
        if fits(model, gpu, workload, gpus_per_node=g, nodes=nodes):
            found.append(g)
            if len(found) == want:
                break
    return sorted(found)


def working_node_count(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int,
                       nodes: int) -> int | None:
    """The fewest nodes, more than `nodes`, of max(gpus_per_node, NODE_GPUS) GPUs each on which some layout fits
    (a model too large for one node's memory; doubling first, then the counts between)."""
    per_node = max(gpus_per_node, NODE_GPUS)
    n = nodes * 2
    while n <= MAX_HINT_NODES:
        if fits(model, gpu, workload, gpus_per_node=per_node, nodes=n):
            # the counts between the last doubling that did not fit and this one were not tried yet
            return next((m for m in range(max(nodes + 1, n // 2 + 1), n)
                         if fits(model, gpu, workload, gpus_per_node=per_node, nodes=m)), n)
        n *= 2
    return None


def require_fit(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int, nodes: int) -> None:
    """Say why nothing fits (verl's divisibility rules, or memory) and which GPU counts would."""
    context = model.max_position_embeddings
    if context and workload.rollout_max_model_len > context:  # no GPU count helps (vllm_async_server.py:1107-1111)
        raise ConfigError(f"rollout.max_model_len {workload.rollout_max_model_len} (prompt + response unless you set "
                          f"it) is above {model.model_path}'s max_position_embeddings {context}; verl refuses it")
    violations: dict = {}
    peak_gib, cand = smallest_footprint(model, gpu, workload, gpus_per_node=gpus_per_node, nodes=nodes,
                                        violations=violations)
    if cand is not None and peak_gib <= gpu.mem_gib:
        return
    if cand is None:
        why = "no valid layout (" + "; ".join(
            f"{rule}: {msg}" for rule, msg in list(violations.items())[:3]) + ")"
    else:
        why = f"needs at least {peak_gib:.0f} GiB per GPU with every memory saver on (memory bound)"
    counts = working_gpu_counts(model, gpu, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    if counts:
        hint = f"--gpus {' or '.join(map(str, counts))} would run" + (f" on {nodes} nodes" if nodes > 1 else "")
    else:  # more GPUs than a node holds: more nodes, as verl's own multi-node examples run (8 GPUs per node)
        more = working_node_count(model, gpu, workload, gpus_per_node=gpus_per_node, nodes=nodes)
        hint = (f"--gpus {max(gpus_per_node, NODE_GPUS)} --nodes {more} would run" if more
                else "use a GPU with more memory")
    raise ConfigError(f"{model.name} cannot run on {nodes} x {gpus_per_node} {gpu.name} ({gpu.mem_gib:.0f} GiB each): "
                      f"{why}; {hint}")
