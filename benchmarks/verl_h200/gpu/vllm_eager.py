#!/usr/bin/env python3
"""ON the GPU node: the job's rollout alone in vLLM, eager against CUDA graphs (issue 29: gen was 3.4x the model on
the H200 job, which runs vLLM with enforce_eager=True). 32 prompts x n=4 of 512 response tokens (ignore_eos, as a
random-weight model almost never samples EOS), vLLM share 0.5, max_model_len 768, as run_tiny_grpo.sh.

usage: vllm_eager.py MODEL_DIR {eager,graphs}
"""
import sys
import time

from vllm import LLM, SamplingParams

model, mode = sys.argv[1], sys.argv[2]
t0 = time.time()
llm = LLM(model=model, enforce_eager=(mode == "eager"), gpu_memory_utilization=0.5, max_model_len=768,
          max_num_seqs=256, seed=0)
ready_s = time.time() - t0
prompts = [{"prompt_token_ids": [100 + (i * 7 + j) % 900 for j in range(120)]} for i in range(32)]
params = SamplingParams(n=4, max_tokens=512, ignore_eos=True, temperature=1.0)
llm.generate(prompts[:4], SamplingParams(max_tokens=8, ignore_eos=True))   # warm-up
t1 = time.time()
outs = llm.generate(prompts, params)
gen_s = time.time() - t1
tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
print(f"VLLM {mode}: engine ready {ready_s:.1f} s, generate {gen_s:.2f} s for {tokens} tokens "
      f"({tokens / gen_s:.0f} tokens/s), {tokens / 128:.0f} per sequence")
