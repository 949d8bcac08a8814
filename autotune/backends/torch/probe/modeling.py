"""The probe's models: random-weight transformers modules from the model table, FSDP2 as verl wraps them,
peft LoRA, and the policy head that turns a micro-batch into response log-probs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from autotune.backends.torch.probe.kernels import (PACKED_ATTENTION, chunked_entropy, entropy_from_logits,
                                                   fused_log_probs, register_packed_attention, token_log_probs)
from autotune.models import ModelSpec
from autotune.spaces.candidate import Candidate


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build weights directly in `dtype`; `from_config`'s dtype keyword is torch_dtype in 4.x, dtype in 5.x."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_causal_lm(model: ModelSpec, *, dtype: torch.dtype, device: torch.device, max_len: int,
                    attention: str = "sdpa"):
    """The model's transformers class from the model table, random weights."""
    import transformers

    transformers.logging.set_verbosity_error()
    if attention == PACKED_ATTENTION:
        register_packed_attention()
    cls = getattr(transformers, model.architecture)
    config = cls.config_class(**model.hf_config(), attn_implementation=attention,
                              max_position_embeddings=max(max_len, 32768), use_cache=False)
    with _default_dtype(dtype), torch.device(device):
        return cls(config)


def apply_liger(lm) -> None:
    """Liger's RMSNorm, SwiGLU and RoPE Triton kernels on this instance, exactly as verl applies them
    (engine/fsdp/transformer_impl.py:307-316: fused_linear_cross_entropy=False, swiglu=True)."""
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=lm, fused_linear_cross_entropy=False, swiglu=True)


def enable_gradient_checkpointing(lm) -> None:
    """Non-reentrant, as verl (engine/fsdp/transformer_impl.py); transformers 5.2x renamed the method."""
    if hasattr(lm, "activation_checkpointing_enable"):
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def cache_kwarg(decoder) -> str:
    """transformers 5.2x renamed the decoder's `past_key_values` argument to `cache`."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


@dataclass(frozen=True)
class MicroBatch:
    """One forward's input. Packed: input_ids [1, sum of lengths] with per-sequence position ids and
    cu_seqlens. Padded: [B, T] right-padded rows. `targets` [B, R] index the flattened [B*T] logits
    at the positions that predict each response token."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0

    def decoder_kwargs(self) -> dict:
        if self.cu_seqlens is None:
            return {}
        return {"position_ids": self.position_ids, "cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_seqlen, "max_length_k": self.max_seqlen}


def packed_micro_batch(sequences: Sequence[torch.Tensor], prompt_lengths: Sequence[int], response_length: int,
                       device: torch.device) -> MicroBatch:
    """Concatenate sequences into one row (verl's remove-padding layout)."""
    lengths = [seq.numel() for seq in sequences]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    ids = torch.cat(list(sequences)).to(device)[None, :]
    position_ids = torch.cat([torch.arange(length, device=device) for length in lengths])[None, :]
    starts = torch.tensor([o + p - 1 for o, p in zip(offsets, prompt_lengths)], device=device)
    targets = starts[:, None] + torch.arange(response_length, device=device)[None, :]
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=device)
    return MicroBatch(ids, targets, position_ids, cu_seqlens, max(lengths))


def padded_micro_batch(sequences: Sequence[torch.Tensor], prompt_lengths: Sequence[int], response_length: int,
                       width: int, device: torch.device) -> MicroBatch:
    """Right-padded rows of `width` tokens; causal attention never looks ahead, so no mask is needed."""
    ids = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, :seq.numel()] = seq
    starts = torch.tensor(prompt_lengths, device=device) - 1 + torch.arange(len(sequences), device=device) * width
    targets = starts[:, None] + torch.arange(response_length, device=device)[None, :]
    return MicroBatch(ids, targets)


class PolicyHead(torch.nn.Module):
    """Decoder + LM head -> log-probs (and entropy) of the response tokens, one module so FSDP2 can shard it.

    Logits are computed for every position as verl's forward does (the LM head FLOPs verl counts),
    in bf16; only the fp32 log-softmax is chunked. `fused` (model.use_fused_kernels): verl's fused log-prob
    instead, 512 positions at a time from the hidden states (kernels.fused_log_probs).
    """

    def __init__(self, lm, entropy_fn: Callable, fused: bool = False) -> None:
        super().__init__()
        self.lm = lm
        self.entropy_fn = entropy_fn
        self.fused = fused

    def forward(self, batch: MicroBatch, with_entropy: bool = False):
        hidden = self.lm.get_decoder()(input_ids=batch.input_ids, use_cache=False,
                                       **batch.decoder_kwargs()).last_hidden_state
        # next token of each position; a sequence's last position (unused) reads its neighbour's first
        labels = torch.roll(batch.input_ids, shifts=-1, dims=1).reshape(-1)
        if self.fused:
            log_probs, entropy = fused_log_probs(hidden.reshape(-1, hidden.shape[-1]), self.lm.get_output_embeddings(),
                                                 labels, self.entropy_fn if with_entropy else None)
            return log_probs[batch.targets], (entropy[batch.targets] if with_entropy else None)
        logits = self.lm.get_output_embeddings()(hidden)
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        log_probs = token_log_probs(flat, labels)[batch.targets]
        if not with_entropy:
            return log_probs, None
        return log_probs, chunked_entropy(flat, self.entropy_fn)[batch.targets]


def make_entropy_fn(candidate: Candidate) -> Callable:
    # verl 0.9.1 reads fsdp_config.use_torch_compile and compiles only entropy_from_logits
    # (engine/fsdp/transformer_impl.py:183-187, torch.compile(..., dynamic=True)); the model is eager.
    if candidate.use_torch_compile:
        return torch.compile(entropy_from_logits, dynamic=True)
    return entropy_from_logits


def fsdp2_shard(policy: PolicyHead, *, param_dtype: torch.dtype) -> None:
    """FSDP2 as verl's fsdp2 strategy: one unit per decoder layer, the root holds embed/norm/head.

    bf16 compute with fp32 gradient reduction (verl engine/fsdp MixedPrecisionPolicy defaults).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in policy.lm.get_decoder().layers:
        fully_shard(layer, mp_policy=mp_policy)
    fully_shard(policy, mp_policy=mp_policy)


def full_param(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter: FSDP2 holds DTensor shards, gathered for the rollout copy."""
    return param.full_tensor() if hasattr(param, "full_tensor") else param


# verl 0.9.1 model/hf_model.yaml defaults: lora_alpha 16, target_modules all-linear (peft then skips
# the LM head); the sim's lora_params counts the same projections (workload.lora_target_modules).
LORA_ALPHA = 16
LORA_TARGET_MODULES = "all-linear"


def apply_lora(lm, rank: int, target_modules: str | list | tuple = LORA_TARGET_MODULES):
    """Frozen base, trainable rank-r adapters (peft.get_peft_model, as verl's FSDP engine does)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("LoRA in the torch backend needs peft: pip install peft") from exc
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=LORA_ALPHA, target_modules=targets, bias="none",
                        task_type="CAUSAL_LM")
    return get_peft_model(lm, config)


def _base_name(peft_name: str) -> str:
    """peft's parameter name -> the plain model's ("base_model.model.X.base_layer.weight" -> "X.weight")."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def lora_merged_weights(peft_lm) -> Iterator[tuple[str, torch.Tensor]]:
    """(plain name, W + scaling * B @ A) for every weight of a peft model: what a merged rollout holds.

    verl can also hand vLLM the adapters alone; copying merged weights is the upper bound of that sync.
    """
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in peft_lm.named_modules():
        if isinstance(module, LoraLayer) and module.lora_A:
            adapter = module.active_adapters[0]
            a = full_param(module.lora_A[adapter].weight)
            b = full_param(module.lora_B[adapter].weight)
            deltas[_base_name(name + ".base_layer.weight")] = module.scaling[adapter] * (b @ a)
    for name, param in peft_lm.named_parameters():
        if "lora_" in name:
            continue
        plain = _base_name(name)
        weight = full_param(param)
        yield plain, (weight + deltas[plain] if plain in deltas else weight)
