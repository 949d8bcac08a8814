"""Which layers each Megatron pipeline stage holds: megatron-core's even split, a user's uneven split
(`num_layers_in_first/last_pipeline_stage`, `account_for_embedding/loss_in_pipeline_split`), or the uneven split
autotune derives where the layers do not divide by the pipeline size.

Megatron's checks, as megatron-core's TransformerConfig.__post_init__ ("Uneven PP") and verl's own copy of its
layer count (utils/megatron/router_replay_utils.py:84-130) apply them: the first and last stages take their given
layer counts (> 0, and divisible by VPP), the middle stages share the rest evenly; the uneven keys cannot be mixed
with the account_for_* keys, which instead count the embedding and the loss as one layer each.
"""

from __future__ import annotations

from typing import NamedTuple


class Split(NamedTuple):
    first: int | None = None  # num_layers_in_first_pipeline_stage (None: not set)
    last: int | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False

    @property
    def uneven(self) -> bool:
        return self.first is not None or self.last is not None


def split_error(num_layers: int, pp: int, vpp: int, split: Split) -> str | None:
    """None when Megatron builds this split; otherwise its reason."""
    vpp_set = vpp > 1
    if split.uneven:
        if split.account_for_embedding or split.account_for_loss:
            return "num_layers_in_first/last_pipeline_stage cannot be mixed with account_for_*_in_pipeline_split"
        if pp < 2:
            return "an uneven pipeline split needs pipeline_model_parallel_size > 1"
        layers, middle = num_layers, pp
        for name, edge in (("first", split.first), ("last", split.last)):
            if edge is None:
                continue
            if edge <= 0:
                return f"num_layers_in_{name}_pipeline_stage must be larger than 0"
            if vpp_set and edge % vpp:
                return f"number of layers at {name} stage: {edge} must be divisible by virtual pipeline parallel " \
                       f"degree {vpp}"
            layers, middle = layers - edge, middle - 1
        if layers < 0 or bool(layers) != bool(middle):
            return f"{layers} middle layers remaining for {middle} middle pipeline stages"
        if middle and layers % middle:
            return f"number of layers at middle stage: {layers} must be divisible by the middle pipeline model " \
                   f"parallel size {middle}"
        if middle and vpp_set and (layers // middle) % vpp:
            return f"number of layers on each middle pipeline rank: {layers // middle} must be divisible by " \
                   f"virtual pipeline parallel degree {vpp}"
        return None
    layers = num_layers + split.account_for_embedding + split.account_for_loss
    if layers % pp:
        return f"num_layers ({layers}) should be divisible by pipeline_model_parallel_size ({pp})"
    if vpp_set and (layers // pp) % vpp:
        return f"layers per pipeline rank ({layers // pp}) must be divisible by virtual_pipeline_model_parallel_size " \
               f"({vpp})"
    return None


def derived_split(num_layers: int, pp: int) -> Split | None:
    """autotune's split where the layers do not divide by `pp` (no VPP): middle stages of ceil(L/PP) layers (or
    floor, when the edges would be left empty), the rest shared by the first and last stages, which also hold the
    embedding and the loss. None when the even split applies or none exists."""
    if pp < 2 or num_layers % pp == 0 or num_layers < pp:
        return None
    if pp == 2:
        return Split(first=num_layers // 2, last=num_layers - num_layers // 2)
    for per_stage in (-(-num_layers // pp), num_layers // pp):
        rest = num_layers - (pp - 2) * per_stage
        if rest >= 2:
            return Split(first=rest // 2, last=rest - rest // 2)
    return None


def stage_layers(num_layers: int, pp: int) -> list[float]:
    """Transformer layers on each pipeline stage, first to last: L/PP evenly, else autotune's split."""
    split = derived_split(num_layers, pp)
    if split is None:
        return [num_layers / pp] * pp
    middle = (num_layers - split.first - split.last) / (pp - 2) if pp > 2 else 0.0
    return [float(split.first), *([middle] * (pp - 2)), float(split.last)]


def largest_stage_layers(num_layers: int, pp: int) -> float:
    """Layers on the fullest pipeline stage: L/PP evenly, else the largest stage of autotune's split."""
    return max(stage_layers(num_layers, pp))


def in_flight_layers(num_layers: int, pp: int, micro_batches: int) -> float:
    """Layer-micro-batches whose activations the fullest stage holds at once under 1F1B without interleaving.

    Stage r runs min(pp - r - 1, m) warm-up forwards and holds one more in the steady state, so min(pp - r, m)
    micro-batches of its own layers (megatron-core pipeline_parallel/schedules.py,
    forward_backward_pipelining_without_interleaving: num_warmup_microbatches = pipeline_parallel_size -
    pipeline_parallel_rank - 1). The first stage holds the most micro-batches; with an uneven split a middle stage
    can hold more layers, so the peak is the largest product, not PP times the largest stage."""
    m = max(micro_batches, 1)
    return max(min(pp - r, m) * layers for r, layers in enumerate(stage_layers(num_layers, pp)))
