"""The probe's plan: micro-batches as verl forms them and vLLM's KV arithmetic. Pure arithmetic, no tensors."""

from __future__ import annotations

import random
from collections.abc import Sequence

from autotune.hardware import GIB
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload


class ConfigRejected(ValueError):
    """A configuration verl itself refuses at its first step; reported as a rejection, not a crash."""


def local_trajectories(layout: ParallelLayout, scale_trajectories: int | None) -> int:
    """Trajectories one rank handles per step: train_batch_size*n / dp, or the probe's scale."""
    if scale_trajectories is not None:
        return max(1, int(scale_trajectories))
    if layout.dp < 1:
        raise ConfigRejected(f"the job's {layout.world_size} GPUs do not divide into data-parallel ranks "
                         f"(model_parallel={layout.model_parallel})")
    return max(1, int(layout.trajectories_per_rank))


def mini_batch_sizes(n_trajectories: int, layout: ParallelLayout) -> list[int]:
    """Per-rank mini-batches: ppo_mini_batch_size*n/dp each (engine_workers.py train_mini_batch).

    A scaled-down probe keeps the mini-batch size (so micro-batch shapes and gradient accumulation
    match the job) and runs fewer of them; a remainder becomes a last, smaller mini-batch.
    """
    per_rank = max(1, int(layout.mini_batch_per_rank))
    full, rest = divmod(n_trajectories, per_rank)
    return [per_rank] * full + ([rest] if rest else [])


def static_micro_batches(indices: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Fixed-count micro-batches (verl workers/engine/utils.py, static path)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro-batch size must be >= 1, but got {micro_batch_size=}")
    return [list(indices[i:i + micro_batch_size]) for i in range(0, len(indices), micro_batch_size)]


def seqlen_workload(length: int) -> int:
    """verl's balancing weight of one sequence (utils/seqlen_balancing.py calculate_workload)."""
    return 24576 * length + length * length


def pack_by_token_budget(lengths: dict[int, int], max_tokens: int, *, padded: bool = False) -> list[list[int]]:
    """use_dynamic_bsz micro-batches as verl 0.9.1 forms them (utils/seqlen_balancing.py
    rearrange_micro_batches): ceil(total / max_tokens) micro-batches, sequences balanced across them by
    workload, one more micro-batch until none is over the bound. So with 1.4 budgets of tokens, two
    micro-batches of 0.7 budgets each run, not one full and one small.

    verl balances with Karmarkar-Karp; this takes the longest-processing-time greedy, which balances
    as closely on GRPO's many similar lengths. Packed (use_remove_padding) micro-batches are bounded by
    their real tokens, verl's bound; padded ones by the tensor we build, rows x longest.
    """
    too_long = max(lengths.values(), default=0)
    if too_long > max_tokens:
        # verl utils/seqlen_balancing.py:384-386
        raise ConfigRejected(f"max_token_len must be greater than the sequence length. "
                             f"Got max_token_len={max_tokens} and max_seq_len={too_long}")
    if not lengths:
        return []

    def cost(batch: list[int]) -> int:
        return len(batch) * max(lengths[i] for i in batch) if padded else sum(lengths[i] for i in batch)

    order = sorted(lengths, key=lambda i: (-seqlen_workload(lengths[i]), i))
    count = min(len(lengths), -(-sum(lengths.values()) // max_tokens))
    while True:
        bins: list[list[int]] = [[] for _ in range(count)]
        loads = [0] * count
        for index in order:
            lightest = min(range(count), key=lambda b: (loads[b], b))
            bins[lightest].append(index)
            loads[lightest] += seqlen_workload(lengths[index])
        if all(cost(b) <= max_tokens for b in bins):
            return [sorted(b) for b in bins]
        count += 1


def micro_batches(indices: Sequence[int], lengths: dict[int, int], *, dynamic: bool, micro_batch_size: int,
                  max_tokens: int, padded: bool = False) -> list[list[int]]:
    """Micro-batches of one pass over `indices`: by count, or by token budget when dynamic."""
    if dynamic:
        return pack_by_token_budget({i: lengths[i] for i in indices}, max_tokens, padded=padded)
    return static_micro_batches(list(indices), micro_batch_size)  # in order, as verl splits a batch


def sample_prompt_lengths(rng: random.Random, count: int, workload: Workload) -> list[int]:
    """Prompt lengths uniform around prompt_fill*max_prompt_length (symmetric, so the mean holds)."""
    mean = workload.prompt_fill * workload.max_prompt_length
    half_width = min(mean - 1, workload.max_prompt_length - mean, 0.5 * mean)
    low, high = mean - half_width, mean + half_width
    return [max(1, min(workload.max_prompt_length, round(rng.uniform(low, high)))) for _ in range(count)]


class KvCacheTooSmall(Exception):
    """vLLM refuses to start: the KV budget cannot hold one sequence."""

    def __init__(self, message: str, *, over_gib: float | None) -> None:
        super().__init__(message)
        self.over_gib = over_gib


def kv_cache_budget_bytes(total_mem_bytes: float, gpu_memory_utilization: float, weights_bytes: float,
                          profile_peak_bytes: float) -> float:
    """KV cache memory on one GPU as vLLM sizes it (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory):
    requested_memory (gpu_memory_utilization x total, Worker.init_device) less non_kv_cache_memory, the weights and
    the peak its profile run added (vllm/utils memory_profiling). The two are measured by the probe (step.py)."""
    return gpu_memory_utilization * total_mem_bytes - weights_bytes - profile_peak_bytes


def check_kv_cache(budget_bytes: float, model: ModelSpec, candidate: Candidate, max_model_len: int) -> None:
    """vLLM's start-up check (v1/core/kv_cache_utils.py check_enough_kv_cache_memory), same words."""
    if budget_bytes <= 0:
        raise KvCacheTooSmall("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                              "when initializing the engine.", over_gib=-budget_bytes / GIB)
    needed = max_model_len * model.kv_cache_bytes_per_token(max(1, candidate.rollout_tp))
    if needed > budget_bytes:
        raise KvCacheTooSmall(
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({budget_bytes / GIB:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.", over_gib=(needed - budget_bytes) / GIB)


def rollout_concurrency(budget_bytes: float, model: ModelSpec, candidate: Candidate, workload: Workload) -> int:
    """Sequences decoded together on this GPU's share: min(max_num_seqs, KV capacity) / rollout_tp.

    A TP-k vLLM replica holds (budget / per-GPU KV bytes per sequence) sequences for k GPUs' share of
    the batch, so one GPU's share runs 1/k of them; KV per sequence uses the mean prompt length
    (vLLM allocates blocks as tokens arrive; every response runs to max_response_length here).
    """
    check_kv_cache(budget_bytes, model, candidate, workload.seq_len)
    per_seq_bytes = model.kv_cache_bytes_per_token(max(1, candidate.rollout_tp)) * workload.mean_seq_len
    replica_seqs = min(candidate.max_num_seqs, int(budget_bytes // per_seq_bytes))
    return max(1, replica_seqs // max(1, candidate.rollout_tp))
