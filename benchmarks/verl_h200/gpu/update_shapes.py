#!/usr/bin/env python3
"""ON a GPU node with torch and transformers only (no verl, no vLLM): the compute of verl's update and log-prob
passes at the shapes of the two verl_h200 jobs, to tell whether the time per token that the other job's update
spends beyond the model (issue 29: update_actor 1.20-1.32x slower than predicted on run_other_grpo.sh, 0.84-1.07
on run_tiny_grpo.sh, on one H100) is compute that grows with the sequence, and which kernels.

The jobs (Qwen2.5-1.5B shapes, random bf16 weights, 128 sequences, prompts left to right as verl's no-padding path
hands them to the model: each micro-batch right-padded to its longest sequence, SDPA with the padding mask, as
transformers builds it):
  tiny:  prompts of 60-100 tokens, responses 512 (a random-weight model runs to the cap); micro-batches of 4, 16, 32
  other: prompts of 60-145 tokens (mean about 102, as the study's 1126-token mean sequence), responses 1024; dynamic
         batching by real tokens, 4096 and 40960 per micro-batch (verl's rearrange_micro_batches: as few balanced
         micro-batches as the budget allows)
Update: forward and backward with gradient checkpointing, next-token cross-entropy in bf16 over the response
(the compute; verl's per-token log-prob loop is priced apart and not run here). Also each shape without a mask
(every row its full length, causal): what the padding mask costs SDPA. Prints seconds per 128-sequence pass, per
real and per padded token, and one micro-batch's kernel time by kind (GEMM, attention, the rest).
"""
import os
import sys
import time

import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

torch.manual_seed(0)
SMOKE = os.environ.get("SMOKE") == "1"  # a CPU check of the script itself: a tiny model, 8 sequences
dev = "cpu" if SMOKE else "cuda"
cfg = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, rope_theta=1e6)
if SMOKE:
    cfg = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
model = Qwen2ForCausalLM(cfg).to(dev, torch.bfloat16)
if hasattr(model, "set_attn_implementation"):
    model.set_attn_implementation("sdpa")
else:
    model.config._attn_implementation = "sdpa"
model.gradient_checkpointing_enable()
model.train()
import transformers  # noqa: E402
print("gpu", "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0), "torch", torch.__version__, "transformers", transformers.__version__,
      flush=True)
B = 8 if SMOKE else 128


def job(prompt_lo, prompt_hi, response):
    prompts = torch.randint(prompt_lo, prompt_hi + 1, (B,)).tolist()
    return [p + response for p in prompts], response


def micro_batches(lengths, per_micro=None, token_budget=None):
    """Index lists: fixed counts, or verl's dynamic batching (as few micro-batches as the real-token budget allows,
    balanced by length: longest first into the lightest)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if per_micro:
        return [list(range(s, min(s + per_micro, len(lengths)))) for s in range(0, len(lengths), per_micro)]
    n = -(-sum(lengths) // token_budget)
    while True:
        bins, loads = [[] for _ in range(n)], [0] * n
        for i in order:
            k = loads.index(min(loads))
            bins[k].append(i)
            loads[k] += lengths[i]
        if max(loads) <= token_budget:
            return bins
        n += 1


def batch(lengths, idx, masked):
    longest = max(lengths[i] for i in idx)
    ids = torch.randint(0, 151000, (len(idx), longest), device=dev)
    if not masked:  # every row its full padded length: causal, no mask
        return ids, None, None
    mask = torch.zeros(len(idx), longest, dtype=torch.long, device=dev)
    for r, i in enumerate(idx):
        mask[r, :lengths[i]] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    return ids, mask, pos


def step(lengths, idx, response, masked, grad):
    ids, mask, pos = batch(lengths, idx, masked)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        # the response's next-token predictions (as verl keeps them); the padding positions are cheap to include
        tail = logits[:, -response - 1:-1]
        loss = F.cross_entropy(tail.reshape(-1, tail.shape[-1]), ids[:, -response:].reshape(-1))
        if grad:
            loss.backward()
    del logits, tail, loss


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


def run(lengths, groups, response, masked, grad):
    sync()
    t = time.perf_counter()
    for idx in groups:
        step(lengths, idx, response, masked, grad)
    sync()
    if grad:
        model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def kernel_split(lengths, idx, response, masked, grad):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU if SMOKE else ProfilerActivity.CUDA]) as prof:
        step(lengths, idx, response, masked, grad)
        sync()
    split = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for e in prof.key_averages():
        us = (e.self_cpu_time_total if SMOKE else getattr(e, "self_device_time_total", 0)) or 0
        name = e.key.lower()
        if any(k in name for k in ("fmha", "attention", "flash", "attn", "cudnn_generated_fort_native_sdpa")):
            split["attention"] += us
        elif any(k in name for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "matmul")):
            split["gemm"] += us
        else:
            split["other"] += us
    if grad:
        model.zero_grad(set_to_none=True)
    total = sum(split.values()) or 1.0
    return total / 1e6, {k: v / total for k, v in split.items()}


CASES = [
    ("tiny", job(60, 100, 512), [("micro 4", dict(per_micro=4)), ("micro 16", dict(per_micro=16)),
                                  ("micro 32", dict(per_micro=32))]),
    ("other", job(60, 145, 1024), [("dyn 4096", dict(token_budget=4096)), ("dyn 40960", dict(token_budget=40960))]),
]
for name, (lengths, response), settings in CASES:
    real = sum(lengths)
    for label, how in settings:
        groups = micro_batches(lengths, **how)
        padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
        for masked in (True, False):
            try:
                run(lengths, groups, response, masked, grad=True)  # warm-up
                up = min(run(lengths, groups, response, masked, grad=True) for _ in range(2))
                lp = min(run(lengths, groups, response, masked, grad=False) for _ in range(2))
                k_s, k = kernel_split(lengths, groups[0], response, masked, grad=True)
                print(f"{name:5s} {label:9s} {'mask' if masked else 'none'}: {len(groups):3d} micro-batches, "
                      f"real {real} padded {padded} tokens; update {up:6.2f} s ({up / real * 1e6:5.1f} us/real, "
                      f"{up / padded * 1e6:5.1f} us/padded token); forward {lp:5.2f} s ({lp / real * 1e6:5.1f} us/real); "
                      f"one update micro-batch's kernels {k_s:.3f} s: gemm {k['gemm']:.0%} attention "
                      f"{k['attention']:.0%} other {k['other']:.0%}; peak "
                      f"{0 if SMOKE else torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
            except torch.OutOfMemoryError:
                print(f"{name:5s} {label:9s} {'mask' if masked else 'none'}: OOM", flush=True)
                model.zero_grad(set_to_none=True)
            if not SMOKE:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
print("UPDATE SHAPES DONE")
sys.exit(0)
