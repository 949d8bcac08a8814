"""Host (CPU) memory of one verl node: what offload moves off the GPUs has to fit in the node's RAM.

verl runs one worker process per GPU; each holds, at its worst moment, its process baseline plus every
offloaded state. verl offloads with `.to("cpu", non_blocking=True)` (utils/fsdp_utils.py:
offload_fsdp_optimizer, offload_fsdp2_model_to_cpu, FSDP1's flat_param_to), which "allocates pinned host
storage" (verl's own comment there): blocks of PyTorch's CachingHostAllocator, each rounded up to a power
of two and kept cached. So a state takes more host memory than its size:
- optimizer_offload: the fp32 Adam moments. Qwen2.5-7B's 57 GiB take 108 GiB as FSDP2's per-parameter
  shards, 72 GiB as FSDP1's one flat parameter per layer (the 7B study on a 125 GiB host was killed);
- param_offload: the fp32 master weights, blocked the same way;
- ref_param_offload: the bf16 reference weights, blocked the same way;
- activation_offload: the saved activations of one micro-batch, one pinned block per saved tensor;
- vLLM's sleep (free_cache_engine, level 1): its bf16 weights wait on the CPU, counted at their size.
The Ray object store and the page cache are not counted; the gate keeps HOST_HEADROOM for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.hardware import GIB
from autotune.models import ModelSpec
from autotune.model.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.model.memory import (BF16, FP32, actor_state_bytes, ref_weight_bytes, tokens_per_micro_batch,
                                        train_activation_bytes, vllm_weights_bytes)
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload
from autotune.verl.roles import separate_reference

HOST_HEADROOM = 0.9  # share of the node's RAM the workers may plan for


@dataclass(frozen=True, kw_only=True)
class HostMemoryEstimate:
    per_gpu_gib: dict[str, float]  # one worker process's host memory by component
    gpus_per_node: int
    capacity_gib: float | None  # the node's RAM; None when unknown (nothing is checked)

    @property
    def node_gib(self) -> float:
        return self.gpus_per_node * sum(self.per_gpu_gib.values())

    @property
    def fits(self) -> bool:
        return self.capacity_gib is None or self.node_gib <= HOST_HEADROOM * self.capacity_gib

    @property
    def over_gib(self) -> float:
        return 0.0 if self.capacity_gib is None else max(self.node_gib - HOST_HEADROOM * self.capacity_gib, 0.0)

    def describe(self) -> str:
        parts = ", ".join(f"{name} {gib:.1f}" for name, gib in self.per_gpu_gib.items() if gib >= 0.05)
        return f"{self.node_gib:.1f} GiB on the host ({self.gpus_per_node} x [{parts}])"


def pinned_block_bytes(nbytes: float) -> float:
    """PyTorch's CachingHostAllocator hands out power-of-two blocks (aten/src/ATen/core/CachingHostAllocator.h)."""
    return 0.0 if nbytes <= 0 else float(2 ** math.ceil(math.log2(nbytes)))


def _param_tensor_sizes(model: ModelSpec) -> list[tuple[int, int]]:
    """(elements, count) for the model's large weight tensors; norms and biases are left out (< 0.1%)."""
    h = model.hidden_size
    sizes = [(model.vocab_size * h, 1 if model.tie_word_embeddings else 2)]
    sizes += [(h * model.q_dim, 2 * model.num_layers), (h * model.kv_dim, 2 * model.num_layers)]
    if model.is_moe:
        sizes.append((h * model.moe_intermediate_size, 3 * model.num_experts * model.num_layers))
    else:
        sizes.append((h * model.intermediate_size, 3 * model.num_layers))
    return sizes


def pinned_state_bytes(model: ModelSpec, cand: Candidate, layout: ParallelLayout, *, bytes_per_param: int,
                       exact: float, unrounded: bool = False) -> float:
    """One copy of per-parameter state (`bytes_per_param` each) offloaded per GPU, in pinned blocks.

    FSDP2 shards each parameter along dim 0 (one block per parameter shard); FSDP1 keeps one flat
    parameter per wrapped decoder layer plus the root's (one block each). Never less than `exact`, the
    state's own size; `unrounded` (LoRA adapters, Megatron's buffers) returns `exact`."""
    if unrounded or cand.is_megatron:
        return exact
    shard = layout.world_size
    b = bytes_per_param
    if cand.actor_engine == "fsdp2":
        rounded = sum(count * pinned_block_bytes(b * n / shard) for n, count in _param_tensor_sizes(model))
    else:
        per_layer = model.attn_params_per_layer() + model.mlp_params_per_layer() + 2 * model.hidden_size
        rounded = (model.num_layers * pinned_block_bytes(b * per_layer / shard)
                   + pinned_block_bytes(b * model.embedding_params() / shard))
    return max(rounded, exact)


def pinned_optimizer_bytes(model: ModelSpec, cand: Candidate, layout: ParallelLayout,
                           workload: Workload | None = None) -> float:
    """Adam's two fp32 moments once offloaded, per GPU (LoRA moments counted unrounded)."""
    exact = actor_state_bytes(model, cand, layout, workload).optimizer
    lora = workload is not None and bool(workload.lora_rank)
    return 2 * pinned_state_bytes(model, cand, layout, bytes_per_param=FP32, exact=exact / 2, unrounded=lora)


def estimate_host_memory(model: ModelSpec, workload: Workload, cand: Candidate, layout: ParallelLayout, *,
                         gpus_per_node: int, capacity_gib: float | None,
                         constants: ModelConstants = DEFAULT_CONSTANTS) -> HostMemoryEstimate:
    """One worker's host memory by component at its worst moment (every offloaded state at once: verl
    keeps pinned blocks cached between phases), and the node's total over `capacity_gib`."""
    k = constants
    state = actor_state_bytes(model, cand, layout, workload)
    per_gpu = {"process": k.system.host_process_gib * GIB,
               "optimizer": ((pinned_optimizer_bytes(model, cand, layout, workload) if cand.optimizer_offload else 0.0)
                             + state.optimizer_on_host),
               "weights": (pinned_state_bytes(model, cand, layout, bytes_per_param=FP32, exact=state.weights,
                                              unrounded=bool(workload.lora_rank)) if cand.param_offload else 0.0),
               "reference": (pinned_state_bytes(model, cand, layout, bytes_per_param=BF16,
                                                exact=ref_weight_bytes(model, cand, layout))
                             if cand.ref_param_offload and separate_reference(workload) else 0.0),
               "vllm_sleep": vllm_weights_bytes(model, cand.rollout_tp),
               "activations": 0.0}
    if cand.activation_offload:
        tok = tokens_per_micro_batch(cand, workload, forward_only=False, layout=layout)
        saved = train_activation_bytes(model, tok, layers=model.num_layers, checkpointing=cand.gradient_checkpointing,
                                       c=k.activations, liger=cand.use_liger)
        # one pinned block per saved tensor; the typical tensor is one bf16 row of hidden width per token
        typical = BF16 * model.hidden_size * tok
        per_gpu["activations"] = saved * pinned_block_bytes(typical) / typical
    return HostMemoryEstimate(per_gpu_gib={name: b / GIB for name, b in per_gpu.items()},
                              gpus_per_node=gpus_per_node, capacity_gib=capacity_gib)
