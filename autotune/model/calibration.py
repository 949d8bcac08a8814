"""Every constant of the memory and cost model, in one place, with where it comes from.

"fitted" constants were fitted by `benchmarks/fit_calibration.py` to the H200 measurements in
`autotune/data/h200-*.json` (copied from ../shared/calibration/, measured 2026-12-02 on one H200,
PyTorch 2.11, transformers 5.17, sdpa attention, bf16 Qwen2.5 shapes with random weights). The fit
and its error on every row are printed by that script and checked by tests/model/test_calibration.py.
"prior" constants have no measurement behind them here (vLLM and multi-GPU communication could not be
measured on this machine); they come from the cited source and are labelled as such in docs/model.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ActivationConstants:
    # Bytes saved for backward per token per layer without checkpointing, bf16:
    # per_h * hidden + per_i * (MLP intermediate width). Korthikanti et al. 2022 (arXiv 2205.05198)
    # give 34*h for a GPT layer; Qwen2's SwiGLU MLP and fp32 RMSNorm upcasts change the split. fitted.
    per_h: float
    per_i: float
    # With checkpointing only the layer input is kept (2 bytes * hidden per layer), plus one layer's
    # activations during recompute.
    ckpt_per_h: float = 2.0
    # Logits: bf16 logits (2 B) + fp32 log-probs (4 B) held until backward finishes, and fp32 softmax
    # gradients (8 B) alive at the start of backward. fitted (train rows).
    logits_retained_bytes: float
    logits_transient_bytes: float
    # Forward-only log-prob pass: bf16 logits + fp32 upcast + fp32 log_softmax. fitted (logprob rows).
    logits_forward_bytes: float
    # verl's engine computes log-probs with flash-attn's fused cross-entropy (fp32 only inside the kernel)
    # and backward in place (verl/utils/torch_functional.py logprobs_from_logits, inplace_backward=True),
    # so training keeps the bf16 logits and their bf16 gradient; forward passes also compute the entropy
    # (softmax and product in bf16; workers/engine/fsdp/transformer_impl.py:1395-1407). From the code,
    # not fitted: the calibration rows ran the naive fp32 log-softmax above.
    verl_logits_retained_bytes: float = 2.0
    verl_logits_transient_bytes: float = 0.0  # the gradient overwrites the logits in place
    verl_logits_forward_bytes: float = 2.0
    verl_entropy_bytes: float = 4.0  # softmax and its product with the logits, bf16, when not compiled
    verl_entropy_compiled_bytes: float = 0.5  # torch.compile fuses them (use_torch_compile, on by default)
    # Without remove-padding (and no Ulysses) verl 0.9.1 takes the padded branch: the entropy is never compiled
    # there (verl_F.entropy_from_logits, transformer_impl.py:1484-1491, not self.compute_entropy_from_logits) and
    # runs on fp32 logits: logits, softmax and their product, 4 bytes each. Found on the H200 verl study
    # (benchmarks/results/h200-2026-12-03-verl/trial1-probe.log: a 43.83 GiB allocation = 128 x 605 x 151936 x 4 B
    # inside entropy_from_logits); not fitted.
    verl_padded_entropy_forward_bytes: float = 12.0
    # model.use_fused_kernels (impl_backend torch, verl's default): log-probs and entropy 512 tokens at a time from
    # the LM head's input, forward and (recomputed) backward (utils/experimental/torch_functional.py:36-58, 104,
    # 130, 183): per chunk token the bf16 logits, their fp32 copy, softmax and log_softmax, 2 + 4 + 4 + 4 bytes per
    # vocabulary entry; the whole logits never exist. From the code, not fitted.
    fused_chunk_tokens: int = 512
    fused_chunk_bytes: float = 14.0
    # model.use_liger, from the code: Liger's SwiGLU keeps gate and up and recomputes SiLU(gate) in backward
    # (liger_kernel/ops/swiglu.py): one MLP-wide bf16 tensor less, 2 bytes per MLP unit. Its RMSNorm keeps
    # the bf16 input and one fp32 rstd per row (ops/rms_norm.py) where HF's Qwen2RMSNorm keeps an fp32
    # upcast (4h) and the bf16 normalised tensor (2h): 4h bytes less per norm, two norms per layer.
    # Measured on the H200 (Qwen2.5-1.5B, 22k tokens per micro-batch, no checkpointing): 92.9 -> 75.3 GiB,
    # i.e. 28.4 kB per token per layer saved against 30.2 kB counted here (-6%);
    # benchmarks/results/h200-2026-12-02-torch-session3/profile_after_inplace_logprobs.txt.
    liger_saved_per_h: float = 8.0
    liger_saved_per_i: float = 2.0


@dataclass(frozen=True, kw_only=True)
class ThroughputConstants:
    # Training MFU (verl's FLOPs) vs tokens per micro-batch: mfu_max(h) * t / (t + t_half(h)), with
    # mfu_max and t_half log-linear in hidden size. fitted (train rows, no checkpointing).
    mfu_max_at_h2048: float
    mfu_max_log2_slope: float  # change of mfu_max per doubling of hidden size
    # hand-set, not fitted (benchmarks/fit_calibration.py does not vary it): it bounds the log-linear ceiling
    # for hidden sizes of 7B and up, where the fitted slope would pass it; below the ~0.8 of peak the
    # H200's GEMMs reach (torch.profiler on the probe)
    mfu_max_cap: float
    t_half_tokens_at_h2048: float
    t_half_log2_slope: float  # multiplicative change of t_half per doubling of hidden size
    ckpt_throughput_factor: float  # full recompute (fitted on the ckpt rows)
    forward_mfu_factor: float  # forward-only MFU relative to training MFU at the same tokens (fitted)
    # model.use_liger: fused RMSNorm/SwiGLU/RoPE kernels replace HF's eager elementwise chains. Measured on the
    # H200 (Qwen2.5-1.5B update, 44k tokens, micro 64): MFU 0.452 -> 0.560 (x1.239) without checkpointing and
    # 0.367 -> 0.452 (x1.232) with it. Applied to forward-only passes too (assumed, not measured).
    liger_throughput_factor: float = 1.235
    # Host time per decoder layer per pass (forward = 1, backward = 2, recompute = 1) that bounds a micro-batch
    # from below: HF eager modules under FSDP issue their kernels from Python one layer at a time. Measured on
    # the torch probe (FSDP2, one H200, Qwen2.5-1.5B, 28 layers), where the GPU work is far shorter:
    # micro 4 with checkpointing 405 ms per training micro-batch (3.6 ms), micro 16 without 267 ms (3.2 ms),
    # forward-only micro 8 68-80 ms (2.4-2.9 ms). FSDP engines only (Megatron's fused kernels: no data).
    host_s_per_layer_pass: float = 0.003
    # Other GPU types (not measured here): the curve above was fitted on the H200 (989e12 FLOP/s, 4.8e12 B/s).
    # Tokens to half-peak scale with the ridge point, peak / HBM bandwidth (the FLOP per byte at which a GEMM
    # stops being bandwidth-bound: Williams et al. 2009, roofline). The ceiling is a matmul rate plus
    # bandwidth-bound elementwise work: 1/mfu_max = 1/matmul_peak_fraction + x * ridge, with x set so the
    # H200 gives the hand-set cap; matmul_peak_fraction 0.8 is the GEMM rate torch.profiler showed on the
    # probe (~790 of 989 TFLOP/s). H20 (ridge 37 FLOP/B against the H200's 206): tokens to half-peak x0.18,
    # ceiling 0.62 -> 0.76; H100 (295 FLOP/B): x1.43, 0.56.
    fit_peak_flops: float = 989e12
    fit_hbm_bytes_per_s: float = 4.8e12
    matmul_peak_fraction: float = 0.8
    # MoE (Qwen3-MoE): the routed experts are grouped GEMMs over the tokens routed to each expert
    # (tokens x top-k / experts per micro-batch, times EP: the all-to-all gathers the EP group's tokens), priced
    # on the same curve at that token count; permuting tokens to experts and back is bandwidth-bound: 4 copies
    # of top-k x hidden bf16 per token per layer per pass (Megatron's moe_permute/unpermute, forward; twice in
    # backward). From the shapes, not fitted: no MoE measurement here.
    moe_permute_copies: float = 4.0
    # LoRA (peft adapters, FSDP2, H200): the base's weight-gradient matmuls are skipped (4N instead of 6N FLOPs
    # per token), but the measured update was no faster per token than full fine-tuning's: Qwen2.5-7B rank 32,
    # 32 x 4 trajectories, micro 32, checkpointing: update 4.38 s, verl MFU 0.445 (6N counted;
    # benchmarks/results/h200-2026-12-02-torch-session2/probe_7b_lora.txt). Time of a LoRA update relative to
    # the 4N FLOPs at the full-fine-tune MFU: the model gave 2.84 s with the 4N saving alone, so 4.38 / 2.84 =
    # 1.54 (fitted on that one row, so it predicts that probe by construction; no other LoRA timing here).
    lora_time_factor: float = 1.54


@dataclass(frozen=True, kw_only=True)
class RolloutConstants:
    """vLLM decode/prefill: priors, not measured here (vLLM cannot be installed on the GPU machine)."""

    # Fraction of HBM bandwidth a decode step reaches (weights + KV reads). fitted: 0.35 by
    # benchmarks/sim_vs_published.py on its 13 published NeMo-RL GRPO runs (H100 and GB200, dense and MoE; grid
    # 0.3-0.75, least squared log ratio of step time; the prior was 0.75). Leave-one-source-out refits: 0.3-0.75.
    decode_hbm_efficiency: float = 0.35
    decode_step_overhead_s: float = 0.004  # scheduler + sampling + launch per step with CUDA graphs
    # rollout.enforce_eager=True: vLLM launches each layer's kernels from Python at every decode step instead of
    # replaying a CUDA graph, so a step costs host time per layer on top of the GPU's. Fitted by
    # benchmarks/fit_eager_decode.py on the 18 configurations of the 2026-12-05 H200 shared study (verl 0.9.1, vLLM
    # 0.24, Qwen2.5-1.5B shapes, 28 layers, 128 responses of up to 512 tokens, eager): the median of (measured gen
    # - the model's gen with CUDA graphs, verl's mean poll wait below included) / (decode steps x layers): 0.527 ms
    # (range 0.386-0.670: the poll's 2-s steps). benchmarks/results/fit_eager_decode.txt.
    eager_decode_s_per_layer: float = 0.527e-3
    # verl 0.9.1's trainer learns that the rollout is done from its replay buffer, polled every 2 s
    # (trainer/ppo/v1/replay_buffer.py:144, 409; trainer_base.py:565-574): gen ends on that grid, 1 s late on average
    verl_poll_wait_s: float = 1.0
    prefill_mfu: float = 0.45  # compute-bound prefill, 2N FLOPs per token
    tp_allreduce_latency_s: float = 8e-6  # per all-reduce, NVLink, small messages (NCCL tests)
    # vLLM's profile run (v1 gpu_worker.determine_available_memory) before sizing the KV cache: a forward of
    # max_num_batched_tokens tokens; per token the widest transient tensors of one layer (q/k/v/o ~ 6h and
    # gate/up/act ~ 3 x MLP width, bf16), split by TP, plus a fixed part (CUDA graphs' pool, workspaces).
    activation_base_gib: float = 0.25
    activation_bytes_per_token_h: float = 12.0  # 6 hidden-wide bf16 tensors
    activation_bytes_per_token_i: float = 6.0  # 3 MLP-wide bf16 tensors
    sampler_logits_bytes: float = 4.0  # fp32 logits per sampled sequence per vocab entry
    sleep_residual_gib: float = 1.0  # CUDA graphs + allocator pool kept while vLLM sleeps (free_cache_engine)
    unchunked_prefill_stall: float = 1.0  # share of prefill time not overlapped with decode without chunking
    chunked_prefill_stall: float = 0.35


@dataclass(frozen=True, kw_only=True)
class SystemConstants:
    """Overheads and communication efficiency: priors."""

    cuda_context_gib: float = 0.6  # CUDA context + cuBLAS workspace, outside max_memory_allocated
    nccl_buffers_gib: float = 0.8  # NCCL channels when world > 1
    allocator_fragmentation: float = 1.06  # reserved / allocated at peak in PyTorch's caching allocator
    collective_efficiency: float = 0.7  # achieved / link bandwidth for large NCCL collectives
    comm_overlap: float = 0.7  # share of FSDP/DP communication hidden behind compute
    step_fixed_s: float = 2.0  # reward, advantage, data loading, Ray dispatch per step
    # update_weights per-call latency (bucketing, IPC handles). Measured on the one real verl point (verl 0.9.1,
    # one H200, Qwen2.5-1.5B shapes: timing_s/update_weights 0.33 s at step 2, of which the 3 GiB transfer is
    # ~0.005 s; benchmarks/results/h200-2026-12-03-verl/trial0-metrics.jsonl). The prior was 0.5 s.
    weight_sync_fixed_s: float = 0.3
    host_link_efficiency: float = 0.8  # pinned-memory H2D/D2H of offloaded states
    host_process_gib: float = 4.0  # a worker's own host memory (CUDA context, libraries, batches)
    # FSDP2 vs FSDP1 in verl's docs (docs/perf/perf_tuning.rst, citing TorchTitan): -7% memory,
    # +1.5% throughput. Applied to the actor update only.
    fsdp2_memory_factor: float = 0.93
    fsdp2_throughput_factor: float = 1.015
    # verl's per-token log-prob loop where flash-attn's Triton cross-entropy is missing (autotune/verl/logprob_path.py:
    # utils/torch_functional.py:180-206), seconds per real token of a rank's pass. It is host-bound (a few kernel
    # launches per token), so it is the same for every micro-batch size and model width. Measured in verl itself as
    # the drop from turning `model.use_fused_kernels` on (which skips the loop) on one H200, the job's 75084 tokens
    # per step at step 2: old_log_prob 5.61 -> 2.19 s (45.5 us/token), ref 7.04 -> 2.86 s (55.7), update
    # 21.91 -> 11.44 s (139.4) (benchmarks/results/h200-2026-12-06-fused). The loop by itself in that node's
    # worker-less process: 31.6 us forward, 88.6 us forward + backward per token (bf16 logits, logprob_loop.txt).
    logprob_loop_forward_s: float = 50.6e-6  # mean of old_log_prob's and ref's
    logprob_loop_train_s: float = 139.4e-6  # forward + backward in the update, per PPO epoch


# Fitted by `python benchmarks/fit_calibration.py` on 2026-12-02 (H200 rows; errors in docs/model.md).
# Priors before the fit were per_h=16, per_i=8 (Korthikanti-style count for a SwiGLU layer),
# 6/8/10 bytes of logits per vocabulary entry (bf16 logits + fp32 copies), which the fit kept close to.
ACTIVATIONS = ActivationConstants(per_h=25.344, per_i=8.0, logits_retained_bytes=4.8,
                                  logits_transient_bytes=8.0, logits_forward_bytes=9.2718)
THROUGHPUT = ThroughputConstants(mfu_max_at_h2048=0.576, mfu_max_log2_slope=0.1593, mfu_max_cap=0.62,
                                 t_half_tokens_at_h2048=987.15, t_half_log2_slope=0.6304,
                                 ckpt_throughput_factor=0.784, forward_mfu_factor=0.9411)
ROLLOUT = RolloutConstants()
SYSTEM = SystemConstants()


@dataclass(frozen=True, kw_only=True)
class ModelConstants:
    """All constants of one model instance (the benchmark perturbs them to play an imperfect model)."""

    activations: ActivationConstants = ACTIVATIONS
    throughput: ThroughputConstants = THROUGHPUT
    rollout: RolloutConstants = ROLLOUT
    system: SystemConstants = SYSTEM


DEFAULT_CONSTANTS = ModelConstants()
