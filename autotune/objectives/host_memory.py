"""Host (CPU) memory of one verl node: what offload moves off the GPUs has to fit in the node's RAM.

verl runs one worker process per GPU; each holds, at its worst moment, its process baseline plus every
offloaded state. The states and where they go:
- optimizer_offload: Adam moments, `.to("cpu", non_blocking=True)` per tensor (verl's
  offload_fsdp_optimizer). A non-blocking copy to the CPU lands in pinned memory from PyTorch's
  CachingHostAllocator, which rounds each block up to a power of two and keeps it cached: 7B moments
  of 57 GiB take 104 GiB of pinned memory (the 7B study on a 125 GiB host was killed by the kernel).
- param_offload: fp32 master weights (offload_fsdp_model_to_cpu), pageable.
- ref_param_offload: the bf16 reference weights, pageable.
- activation_offload: the saved activations of one micro-batch, pinned, one block per saved tensor.
- vLLM's sleep (free_cache_engine, level 1): its bf16 weights wait on the CPU while the trainer runs.
The Ray object store and the page cache are not counted; the gate keeps HOST_HEADROOM for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.hardware import GIB
from autotune.models import ModelSpec
from autotune.objectives.calibration import DEFAULT_CONSTANTS, ModelConstants
from autotune.objectives.memory import (BF16, FP32, _vllm_weights_bytes, actor_state_bytes, ref_weight_bytes,
                                        tokens_per_micro_batch, train_activation_bytes)
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

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


def pinned_optimizer_bytes(model: ModelSpec, cand: Candidate, layout: ParallelLayout,
                           workload: Workload | None = None) -> float:
    """Adam's two fp32 moments once offloaded, per GPU, with the pinned allocator's rounding.

    FSDP2 shards each parameter along dim 0 (one block per parameter shard); FSDP1 keeps one flat
    parameter per wrapped decoder layer (one block per layer). LoRA moments and Megatron's distributed
    optimizer buffers are counted unrounded."""
    exact = actor_state_bytes(model, cand, layout, workload).optimizer
    if cand.is_megatron or (workload is not None and workload.lora_rank):
        return exact
    shard = layout.world_size
    if cand.actor_engine == "fsdp2":
        rounded = sum(count * pinned_block_bytes(FP32 * n / shard) for n, count in _param_tensor_sizes(model))
    else:
        per_layer = model.attn_params_per_layer() + model.mlp_params_per_layer() + 2 * model.hidden_size
        embeddings = model.embedding_params()
        rounded = model.num_layers * pinned_block_bytes(FP32 * per_layer / shard) + pinned_block_bytes(
            FP32 * embeddings / shard)
    return 2 * max(rounded, exact / 2)


def estimate_host_memory(model: ModelSpec, workload: Workload, cand: Candidate, layout: ParallelLayout, *,
                         gpus_per_node: int, capacity_gib: float | None,
                         constants: ModelConstants = DEFAULT_CONSTANTS) -> HostMemoryEstimate:
    k = constants
    state = actor_state_bytes(model, cand, layout, workload)
    per_gpu = {"process": k.system.host_process_gib * GIB,
               "optimizer": pinned_optimizer_bytes(model, cand, layout, workload) if cand.optimizer_offload else 0.0,
               "weights": state.weights if cand.param_offload else 0.0,
               "reference": (ref_weight_bytes(model, cand, layout)
                             if cand.ref_param_offload and workload.use_kl_loss and not workload.lora_rank else 0.0),
               "vllm_sleep": _vllm_weights_bytes(model, cand.rollout_tp),
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
