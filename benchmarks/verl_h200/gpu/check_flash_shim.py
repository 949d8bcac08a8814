#!/usr/bin/env python3
"""ON the GPU node, after the flash_attn shim is installed: is it right, and do transformers and verl take it?

1. flash_attn_varlen_func against SDPA run sequence by sequence (causal, GQA 12/2, head dim 128, bf16): outputs and
   the gradients of q, k, v, as max |difference| over max |SDPA value|.
2. transformers' own check (is_flash_attn_2_available) and verl's padding helpers import from it.
3. A random-weight Qwen2 (2 layers) on padded rows with SDPA against the same rows packed without padding through
   transformers' flash_attention_2 path (position_ids restart per sequence, as verl's remove-padding feeds it):
   the logits of the real tokens.
Prints one line per check and SHIM OK at the end; exits non-zero on a failed check.
"""
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
failed = []


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def check(name, value, limit):
    ok = value <= limit
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {value:.2e} (limit {limit:.0e})")
    if not ok:
        failed.append(name)


from flash_attn import flash_attn_varlen_func  # noqa: E402

lens = [5, 130, 77, 512]
heads, kv_heads, hd = 12, 2, 128
total = sum(lens)
q = torch.randn(total, heads, hd, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(total, kv_heads, hd, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(total, kv_heads, hd, device=dev, dtype=dt, requires_grad=True)
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
g = torch.randn_like(out)
dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
ref_parts = []
for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
    qs = q[s:e].transpose(0, 1).unsqueeze(0)
    ks = k[s:e].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1).unsqueeze(0)
    vs = v[s:e].repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1).unsqueeze(0)
    ref_parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1))
ref = torch.cat(ref_parts)
rq, rk, rv = torch.autograd.grad(ref, (q, k, v), g)
check("varlen output vs SDPA", rel(out, ref), 2e-2)
check("varlen dq vs SDPA", rel(dq, rq), 3e-2)
check("varlen dk vs SDPA", rel(dk, rk), 3e-2)
check("varlen dv vs SDPA", rel(dv, rv), 3e-2)

from transformers.utils import is_flash_attn_2_available  # noqa: E402

print(f"{'ok  ' if is_flash_attn_2_available() else 'FAIL'} transformers is_flash_attn_2_available: "
      f"{is_flash_attn_2_available()}")
if not is_flash_attn_2_available():
    failed.append("transformers availability")
try:
    from verl.utils.attention_utils import index_first_axis, pad_input, unpad_input  # noqa: F401

    index_first_axis(torch.zeros(3, 2, device=dev), torch.tensor([0, 2], device=dev))
    print("ok   verl.utils.attention_utils takes flash_attn.bert_padding")
except ImportError as exc:
    print(f"skip verl.utils.attention_utils: verl not installed here ({exc})")

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

cfg = Qwen2Config(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
model = Qwen2ForCausalLM(cfg).to(dev, dt).eval()


def set_attention(m, name):
    if hasattr(m, "set_attn_implementation"):   # transformers >= 4.56
        m.set_attn_implementation(name)
    else:
        m.config._attn_implementation = name


rows = [37, 200, 5]
batch, seqlen = len(rows), max(rows)
ids = torch.randint(0, 1000, (batch, seqlen), device=dev)
mask = torch.zeros(batch, seqlen, dtype=torch.long, device=dev)
for i, n in enumerate(rows):
    mask[i, seqlen - n:] = 1   # left padding, as verl's prompts+responses are laid out
pos = (mask.cumsum(-1) - 1).clamp_min(0)
with torch.no_grad():
    set_attention(model, "sdpa")
    padded = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    ids_rmpad = ids[mask.bool()].unsqueeze(0)
    pos_rmpad = pos[mask.bool()].unsqueeze(0)
    set_attention(model, "flash_attention_2")
    packed = model(input_ids=ids_rmpad, position_ids=pos_rmpad).logits[0]
check("Qwen2 logits: packed flash_attention_2 vs padded SDPA", rel(packed, padded[mask.bool()]), 3e-2)
print("SHIM OK" if not failed else f"SHIM FAILED: {', '.join(failed)}")
sys.exit(1 if failed else 0)
