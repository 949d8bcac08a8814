"""One GRPO-shaped step loop on real transformers modules: the measuring half of `--backend torch`.

Run as `python -m autotune.backends.torch.probe --request request.json --out result.json`
(under `torchrun` for several GPUs). `TorchRunner` (backends/torch/runner.py) writes the request, reads one
JSON line per finished step from stdout, and turns the result file or the exit code into a
ProbeResult or a ProbeError. The file protocol and exit codes live in runner.py so the parent
never imports torch.

A step mirrors verl 0.9.1's sync trainer (`trainer/ppo/v1/trainer_base.py`), phase names as its
`timing_s/<name>` metrics:
  gen             batched sampling with a KV cache whose size follows vLLM's block budget
  old_log_prob    actor forward only, log-probs and entropy of the response tokens
  ref             reference model forward only (only when workload.use_kl_loss)
  update_actor    GRPO clipped policy-gradient loss + low_var_kl, grad accumulation, AdamW
  update_weights  actor -> rollout weight copy
Weights are random (speed and memory do not depend on them); nothing is downloaded. The maths is
GRPO's, but its numbers are not the point: shapes, memory and FLOPs are.

Choices that differ from verl, each because the real thing needs a package we do not assume:
- Packing as verl's `use_remove_padding`: a micro-batch is one row of concatenated sequences with
  position ids restarting per sequence, and attention runs PyTorch's flash-attention varlen kernel
  (`torch.nn.attention.varlen.varlen_attn`, registered with transformers as an attention function)
  over the sequence boundaries, as verl's flash-attn `unpad_input` path does. FLOPs and activation
  memory follow the real tokens, not a padded width. On the CPU (tests) the same function runs one
  causal sdpa per sequence. `use_remove_padding=False` pads every row to prompt+response max like verl.
- Log-probs: verl uses flash-attn's Triton cross-entropy kernel when flash-attn is installed
  (verl/utils/torch_functional.py `logprobs_from_logits`): one fused pass over the bf16 logits in
  fp32 arithmetic forward and one backward that writes the gradient over the logits in place, so no
  fp32 copy and no second logits-sized tensor exist. On CUDA the same maths is compiled by Inductor
  into fused Triton kernels (compiled once per probe, in its untimed warm-up step), with the same
  in-place backward. On the CPU it runs eagerly a chunk of tokens at a time, with the same result.
- Rollout uses HF modules, not vLLM, so decode is far slower than vLLM (calibration README); the KV
  budget, concurrency limit, chunked prefill and the "no cache blocks" failure follow vLLM. Prompts
  of a wave are left-padded to the wave's longest. rollout_tp > 1 is emulated in memory (weights
  and KV heads split, one GPU's share of the replica's sequences), not in time: decode here reads
  all the weights on one GPU.
- One process stands for one GPU of an N-GPU job: it does 1/dp of the step's trajectories but holds
  a whole actor (FSDP2 over a world of one, as verl wraps even one GPU), so its memory is an upper
  bound on FSDP's unless it runs under torchrun with the job's real GPU count, where the actor is
  sharded over every rank.

Modules, one concern each: request (request.json parsed), plan (micro-batches and vLLM's KV arithmetic:
no tensors), kernels (GRPO maths, log-prob/entropy kernels, packed attention), modeling (random-weight HF
models, FSDP2, LoRA), device (clocks, memory, OOMs, the process group), step (one GRPO step, timed),
__main__ (the entry point and its exit codes). The probe imports nothing of autotune.model: it is the
instrument the model is checked against.
"""
