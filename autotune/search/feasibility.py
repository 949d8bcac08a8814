"""Can this model run on these GPUs at all? Checked before a study is created, so nothing is stored."""

from __future__ import annotations

import itertools

from autotune.errors import ConfigError
from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.objectives.memory import estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.verl.rules import check
from autotune.spaces.layout import ParallelLayout
from autotune.spaces.space import default_domains
from autotune.workload import Workload
from autotune.verl.roles import separate_reference


def smallest_footprint(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int,
                       nodes: int) -> tuple[float, Candidate | None]:
    """Lowest predicted peak (GiB) over valid layouts with every memory saver on, and that candidate."""
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
        if check(model, workload, cand, layout):
            continue
        for util in (0.3, 0.5, 0.7, 0.9):
            trial = cand.with_(gpu_memory_utilization=util)
            mem = estimate_memory(model, gpu, workload, trial, layout)
            if mem.kv_cache_fits and mem.peak_gib < best[0]:
                best = (mem.peak_gib, trial)
    return best


def require_fit(model: ModelSpec, gpu: GpuSpec, workload: Workload, *, gpus_per_node: int, nodes: int) -> None:
    peak_gib, cand = smallest_footprint(model, gpu, workload, gpus_per_node=gpus_per_node, nodes=nodes)
    if cand is not None and peak_gib <= gpu.mem_gib:
        return
    need = "no valid layout" if cand is None else f"at least {peak_gib:.0f} GiB per GPU with every memory saver on"
    raise ConfigError(f"{model.name} cannot run on {nodes} x {gpus_per_node} {gpu.name} ({gpu.mem_gib:.0f} GiB each): "
                      f"{need}; use more GPUs")
