#!/usr/bin/env python3
"""ON a GPU node with torch only: how fast attention runs against the GEMMs around it, by the path verl takes.

verl's FLOP counter (and autotune's time model, model/cost.py) counts attention as 6 x seqlen x head_dim x heads
FLOPs per token per layer (forward and backward, causal) and the model priced them at the GEMMs' rate. This
measures, per path, forward + backward of one layer's attention over a micro-batch, against the same tokens
through one layer's GEMMs (q/k/v/o and the MLP at the model's shapes):
  sdpa_mask:   SDPA with a padding mask (remove-padding off: transformers hands SDPA a boolean 4-D mask, so no
               FlashAttention kernel; the whole square is computed)
  sdpa_causal: SDPA with is_causal and no mask (every row its full length)
  varlen:      torch.nn.attention.varlen.varlen_attn (FlashAttention; the remove-padding path through the shim)
Shapes: Qwen2.5-1.5B (12 query heads, 2 KV heads, head_dim 128, hidden 1536, MLP 8960) and Qwen2.5-7B (28/4, 128,
3584, 18944), sequences of 768 to 16384 tokens, 16384-49152 tokens per micro-batch. Prints each path's achieved
TFLOP/s in verl's count and as a share of the GEMMs' TFLOP/s at the same tokens.
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

SMOKE = os.environ.get("SMOKE") == "1"  # a CPU check of the script itself
dev = "cpu" if SMOKE else "cuda"
dt = torch.float32 if SMOKE else torch.bfloat16
print("gpu", "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


def timed(fn, reps=3):
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def gemm_layer_s(tokens, hidden, heads, kv_heads, d, mlp):
    """Forward + backward of one decoder layer's linear layers on `tokens` tokens."""
    x = torch.randn(tokens, hidden, device=dev, dtype=dt, requires_grad=True)
    ws = [(torch.randn(hidden, n, device=dev, dtype=dt) * 0.02).requires_grad_()
          for n in ((heads + 2 * kv_heads) * d, 2 * mlp)]
    w_o = (torch.randn(heads * d, hidden, device=dev, dtype=dt) * 0.02).requires_grad_()
    w_down = (torch.randn(mlp, hidden, device=dev, dtype=dt) * 0.02).requires_grad_()

    def run():
        qkv = x @ ws[0]
        a = qkv[:, :heads * d] @ w_o
        up = x @ ws[1]
        m = up[:, :mlp] * up[:, mlp:]
        (a.sum() + (m @ w_down).sum()).backward()
    flops = 6 * tokens * hidden * ((heads + 2 * kv_heads) * d + heads * d + 3 * mlp)
    return timed(run), flops


def attn_s(path, seqs, seqlen, heads, kv_heads, d):
    """Forward + backward of one layer's attention over `seqs` sequences of `seqlen` (with padding: real lengths
    uniform in [seqlen/2, seqlen], as responses are)."""
    lengths = [seqlen] * seqs if path != "sdpa_mask" and path != "varlen" else \
        [int(seqlen * (0.5 + 0.5 * (i + 0.5) / seqs)) for i in range(seqs)]
    if path == "varlen":
        from torch.nn.attention.varlen import varlen_attn
        total = sum(lengths)
        q = torch.randn(total, heads, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(total, kv_heads, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(total, kv_heads, d, device=dev, dtype=dt, requires_grad=True)
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=dev, dtype=torch.int32)
        rep = heads // kv_heads
        import inspect
        # causal as the shim says it (benchmarks/verl_h200/flash_attn_shim): is_causal where this torch has it,
        # else window_size (-1, 0) (PyTorch 2.11's varlen_attn docstring)
        causal = ({"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters
                  else {"window_size": (-1, 0)})

        def run():
            # the shim repeats K and V per query head
            out = varlen_attn(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), cu, cu, max(lengths),
                              max(lengths), **causal)
            out.sum().backward()
    else:
        q = torch.randn(seqs, heads, seqlen, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(seqs, kv_heads, seqlen, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(seqs, kv_heads, seqlen, d, device=dev, dtype=dt, requires_grad=True)
        mask = None
        if path == "sdpa_mask":  # as transformers builds it for SDPA: causal and padding, boolean, 4-D
            idx = torch.arange(seqlen, device=dev)
            causal = idx[None, :] <= idx[:, None]
            real = torch.tensor(lengths, device=dev)[:, None] > idx[None, :]
            mask = (causal[None] & real[:, None, :])[:, None]
        rep = heads // kv_heads

        def run():
            # transformers' sdpa_attention_forward repeats K and V (repeat_kv) unless SDPA's enable_gqa is used
            out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                 attn_mask=mask, is_causal=mask is None)
            out.sum().backward()
    # verl's count per token: 6 x seqlen x head_dim x heads (its own length per sequence)
    flops = sum(6 * n * n * d * heads for n in lengths)
    return timed(run), flops, sum(lengths)


MODELS = {"1.5b": (1536, 12, 2, 128, 8960), "7b": (3584, 28, 4, 128, 18944)}
SHAPES = [(768, 32), (1280, 24), (4096, 8), (16384, 2)] if not SMOKE else [(64, 2)]
for name, (hidden, heads, kv, d, mlp) in MODELS.items():
    if SMOKE:
        hidden, heads, kv, d, mlp = 64, 4, 2, 16, 128
    for seqlen, seqs in SHAPES:
        try:
            g_s, g_flops = gemm_layer_s(seqs * seqlen, hidden, heads, kv, d, mlp)
            gemm_rate = g_flops / g_s
            row = [f"{name} seq {seqlen:5d} x{seqs:2d}: GEMMs {gemm_rate / 1e12:6.1f} TFLOP/s"]
            for path in ("sdpa_mask", "sdpa_causal", "varlen"):
                try:
                    a_s, a_flops, tokens = attn_s(path, seqs, seqlen, heads, kv, d)
                    rate = a_flops / a_s
                    row.append(f"{path} {rate / 1e12:6.1f} ({rate / gemm_rate:.2f} of GEMM, "
                               f"{a_s / tokens * 1e6:.2f} us/token/layer)")
                except Exception as exc:  # the report is what ran
                    row.append(f"{path} failed: {type(exc).__name__} {str(exc)[:80]}")
                if not SMOKE:
                    torch.cuda.empty_cache()
            print("; ".join(row), flush=True)
        except torch.OutOfMemoryError:
            print(f"{name} seq {seqlen} x{seqs}: OOM", flush=True)
print("ATTN RATE DONE")
sys.exit(0)
