"""Derived parallel sizes of a candidate, computed once (torchtitan's ParallelDims pattern).

Everything downstream (rules, memory model, cost model, export) reads these instead of re-deriving.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.spaces.candidate import Candidate
from autotune.workload import Workload


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    world_size: int  # GPUs in the job
    gpus_per_node: int
    model_parallel: int  # GPUs that hold one copy of the actor (TP*PP*CP for Megatron, SP for FSDP)
    dp: int  # actor data-parallel size; 0 when world_size is not divisible (a rule reports it)
    rollout_replicas: int  # vLLM engines; 0 when not divisible
    expert_dp: int  # ranks sharing one expert shard (Megatron MoE)
    trajectories_per_rank: float  # per step, per actor DP rank
    mini_batch_per_rank: float  # trajectories per optimizer step per DP rank
    micro_batches_per_mini: float  # static mode: gradient-accumulation steps

    @property
    def multi_node(self) -> bool:
        return self.world_size > self.gpus_per_node

    @classmethod
    def of(cls, candidate: Candidate, workload: Workload, *, gpus_per_node: int, nodes: int) -> "ParallelLayout":
        world = gpus_per_node * nodes
        if candidate.is_megatron:
            model_parallel = candidate.actor_tp * candidate.actor_pp * candidate.actor_cp
        else:
            model_parallel = candidate.ulysses_sp
        dp = world // model_parallel if world % model_parallel == 0 else 0
        replicas = world // candidate.rollout_tp if world % candidate.rollout_tp == 0 else 0
        expert_group = candidate.actor_ep * candidate.actor_etp * candidate.actor_pp
        expert_dp = world // expert_group if candidate.is_megatron and world % expert_group == 0 else 0
        traj_per_rank = workload.trajectories_per_step / dp if dp else 0.0
        mini_per_rank = workload.trajectories_per_mini_batch / dp if dp else 0.0
        micro = candidate.ppo_micro_batch_size_per_gpu
        return cls(world_size=world, gpus_per_node=gpus_per_node, model_parallel=model_parallel, dp=dp,
                   rollout_replicas=replicas, expert_dp=expert_dp, trajectories_per_rank=traj_per_rank,
                   mini_batch_per_rank=mini_per_rank,
                   micro_batches_per_mini=mini_per_rank / micro if micro else 0.0)
