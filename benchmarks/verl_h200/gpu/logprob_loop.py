#!/usr/bin/env python3
"""ON the GPU node after setup.sh (verl on the path; no launch needed, about 30 s): does verl's log-prob take its
per-token loop here, and what does it cost?

verl 0.9.1 `utils/torch_functional.py`: `logprobs_from_logits` uses flash-attn's Triton cross-entropy when
`flash_attn.ops.triton.cross_entropy` imports (lines 34-39, 95), else `logprobs_from_logits_v2` (line 106), which
loops in Python over the rows of the (tokens, vocab) logits, one log_softmax (bf16) or logsumexp (fp32) per token
(lines 196-206). The FSDP engine calls it from both padding paths (workers/engine/fsdp/transformer_impl.py:1428,
:1522). issue 29's H100 run (benchmarks/results/h100-2026-12-06-explain) found verl's log-prob passes 5.7-6.0 s slower
than the same forward by hand over 74584 tokens: about 76-80 us per token, which this measures directly.

Prints which branch verl takes, then seconds for the job's token count through verl's function and through one
vectorised log_softmax + gather, forward only and forward + backward, in the dtypes verl's engine feeds it.
"""
import time

import torch
import torch.nn.functional as F
from verl.utils import torch_functional as tf

TOKENS = 74584  # the verl_h200 job's real tokens per step
MICRO = 4700  # about one log-prob micro-batch of 8 sequences
VOCAB = 151936


def timed(fn, *args, repeats=2):
    fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def vectorised(logits, labels):
    return F.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def with_backward(fn):
    def run(logits, labels):
        leaf = logits.detach().requires_grad_(True)
        fn(leaf, labels).sum().backward()
    return run


print("gpu", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
print("flash-attn Triton cross-entropy importable (verl's fast branch):", tf.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE)
torch.manual_seed(0)
labels = torch.randint(0, VOCAB, (MICRO,), device="cuda")
for dtype in (torch.bfloat16, torch.float32):
    logits = torch.randn(MICRO, VOCAB, device="cuda", dtype=dtype)
    for name, fn in (("verl logprobs_from_logits", tf.logprobs_from_logits), ("vectorised log_softmax", vectorised)):
        fwd = timed(torch.no_grad()(fn), logits, labels)
        both = timed(with_backward(fn), logits, labels)
        print(f"{str(dtype):15s} {name:26s} forward {fwd * 1e6 / MICRO:7.1f} us/token "
              f"({fwd * TOKENS / MICRO:5.2f} s for the job's {TOKENS} tokens); forward+backward "
              f"{both * 1e6 / MICRO:7.1f} us/token ({both * TOKENS / MICRO:5.2f} s)", flush=True)
    del logits
print("LOGPROB LOOP DONE")
