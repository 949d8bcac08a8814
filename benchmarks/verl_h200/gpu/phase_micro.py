#!/usr/bin/env python3
"""ON a GPU node with only torch and transformers (no verl, no vLLM): the verl_h200 job's log-prob and update
compute, by hand, padded with SDPA (as the job runs) against remove-padding through flash varlen (the flash_attn
shim in /tmp/shim or on the path). Issue 29 items 1 and 3 when a full verl launch does not fit the device time.

The job: Qwen2.5-1.5B shapes (random weights, bf16), 32 prompts x 4 = 128 sequences, prompt <= 256 (left padded,
60-100 real tokens, as the synthetic GSM8K prompts with the chat template), responses 512 (a random-weight model
runs to the cap). old_log_prob: 16 micro-batches of 8, log-softmax + entropy in fp32 over the logits (verl 0.9.1
computes the entropy on the full padded logits when remove-padding is off: workers/engine/fsdp/transformer_impl.py).
update: 2 mini-batches of 64, micro 4, gradient checkpointing, forward + backward (no optimizer step, no FSDP).
Prints seconds per pass and the top CUDA kernels of one micro-batch (torch.profiler).
"""
import sys
import time

import torch
import torch.nn.functional as F
from transformers import Qwen2Config, Qwen2ForCausalLM

torch.manual_seed(0)
dev = "cuda"
cfg = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  tie_word_embeddings=True, rope_theta=1e6)
model = Qwen2ForCausalLM(cfg).to(dev, torch.bfloat16)
print("gpu", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
B, P, R = 128, 256, 512
L = P + R
real_prompt = torch.randint(60, 101, (B,))
ids = torch.randint(0, 151000, (B, L), device=dev)
mask = torch.zeros(B, L, dtype=torch.long, device=dev)
for i in range(B):
    mask[i, P - int(real_prompt[i]):] = 1
pos = (mask.cumsum(-1) - 1).clamp_min(0)
print(f"real tokens {int(mask.sum())} of {B * L} ({mask.float().mean():.0%})", flush=True)


def set_attn(name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def logprob_entropy(logits, labels):
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


def micro_padded(sl, grad=False):
    out = model(input_ids=ids[sl], attention_mask=mask[sl], position_ids=pos[sl]).logits
    lp, ent = logprob_entropy(out[:, P - 1:-1], ids[sl, P:])
    return lp.sum() + ent.sum() if grad else None


def micro_rmpad(sl, grad=False):
    m = mask[sl].bool()
    out = model(input_ids=ids[sl][m].unsqueeze(0), position_ids=pos[sl][m].unsqueeze(0)).logits[0]
    # next-token labels inside each packed row; the response part is what verl keeps
    labels = torch.roll(ids[sl][m], -1)
    lp, ent = logprob_entropy(out, labels)
    return lp.sum() + ent.sum() if grad else None


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def logprob_pass(micro_fn, micro=8):
    with torch.no_grad():
        for s in range(0, B, micro):
            micro_fn(slice(s, s + micro))


def update_pass(micro_fn, micro=4):
    model.train()
    model.gradient_checkpointing_enable()
    for s in range(0, B, micro):
        micro_fn(slice(s, s + micro), grad=True).backward()
    model.zero_grad(set_to_none=True)
    model.eval()


def top_kernels(fn, n=10):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
    total = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    rows = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0))[:n]
    print(f"    GPU kernel time {total / 1e6:.3f} s in one micro-batch; top kernels:")
    for e in rows:
        print(f"      {e.self_device_time_total / 1e6:7.4f} s  x{e.count:<5d} {e.key[:90]}")


results = {}
for mode, fn, attn in (("padded SDPA", micro_padded, "sdpa"), ("remove-padding flash varlen", micro_rmpad,
                                                                "flash_attention_2")):
    try:
        set_attn(attn)
        logprob_pass(fn)  # warm-up
        lp = [timed(lambda: logprob_pass(fn)) for _ in range(2)]
        update_pass(fn)
        up = [timed(lambda: update_pass(fn)) for _ in range(1)]
        print(f"{mode}: old_log_prob pass {min(lp):.2f} s (16 micro-batches of 8), update fwd+bwd {min(up):.2f} s "
              f"(32 micro-batches of 4, checkpointing), peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
              flush=True)
        with torch.no_grad():
            top_kernels(lambda: fn(slice(0, 8)))
        results[mode] = (min(lp), min(up))
    except Exception as exc:  # the report is what ran
        print(f"{mode}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    torch.cuda.reset_peak_memory_stats()
if len(results) == 2:
    (a_lp, a_up), (b_lp, b_up) = results.values()
    print(f"remove-padding against padded, time padded over time rmpad (above 1: remove-padding is faster): "
          f"old_log_prob x{a_lp / b_lp:.2f}, update x{a_up / b_up:.2f}")
print("PHASE MICRO DONE")
sys.exit(0)
