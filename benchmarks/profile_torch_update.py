"""Where the torch probe's update phase spends its time on a GPU, and its MFU by micro-batch plan.

    python benchmarks/profile_torch_update.py --model qwen2.5-1.5b --out benchmarks/results/

Runs the probe's own update_actor (probe/step.py GrpoProbe, FSDP2 over one GPU, packed micro-batches)
on synthetic trajectories of the torch study's workload shape, so rollout time is skipped. For each
micro-batch plan it prints tokens, update seconds and verl's update MFU; for the first plan it also
prints the top CUDA kernels (torch.profiler) and how much of the wall time the GPU was busy. A variant
without remove-padding and variants with Liger's kernels (verl's model.use_liger)
are measured for comparison. Writes OUT/profile_torch_update_<model>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from autotune.hardware import get_gpu, match_device_name
from autotune.models import get_model
from autotune.backends.torch.probe.device import PhaseClock, init_dist
from autotune.backends.torch.probe.kernels import grpo_advantages
from autotune.backends.torch.probe.plan import sample_prompt_lengths
from autotune.backends.torch.probe.request import WorkloadRequest
from autotune.backends.torch.probe.step import GrpoProbe, Trajectories
from autotune.verl.flops import mfu
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

sys.path.insert(0, str(Path(__file__).parent))
from torch_update_plans import update_plans  # noqa: E402


def synthetic_trajectories(probe: GrpoProbe) -> Trajectories:
    lengths = sample_prompt_lengths(probe.rng, probe.n_trajectories, probe.work)
    vocab = probe.req.model.vocab_size
    tokens = [torch.randint(0, vocab, (p + probe.work.max_response_length,), device=probe.device) for p in lengths]
    return Trajectories(prompt_lengths=lengths, tokens=tokens, response_length=probe.work.max_response_length)


def measure(model_name: str, workload: Workload, candidate: Candidate, peak_flops: float, repeats: int,
            profile: bool) -> dict:
    req = WorkloadRequest(model=get_model(model_name), workload=workload, candidate=candidate, gpus_per_node=1,
                          nodes=1, warmup_steps=1, timed_steps=repeats, device="cuda", peak_flops_per_gpu=peak_flops,
                          seed=0, scale_trajectories=None, device_mem_gib=None, test_raise_oom_in=None)
    dist = init_dist("cuda")
    probe = GrpoProbe(req, dist, PhaseClock(dist.device))
    # vLLM sleeps through training (free_cache_engine), as the probe's step does after generation; results
    # before 2026-12-02's third session kept this bf16 copy on the GPU during the update
    probe.rollout.to("cpu")
    traj = synthetic_trajectories(probe)
    rewards = torch.randint(0, 2, (len(traj.tokens),), device=probe.device)
    advantages = grpo_advantages(rewards, workload.rollout_n)
    old_lp = probe.old_log_prob(traj)
    ref_lp = probe.ref_log_prob(traj) if workload.use_kl_loss else None
    seconds, flops = [], 0.0
    torch.cuda.reset_peak_memory_stats()
    for i in range(1 + repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        flops = probe.update_actor(traj, old_lp, ref_lp, advantages)
        torch.cuda.synchronize()
        if i:
            seconds.append(time.perf_counter() - start)
    update_s = statistics.median(seconds)
    out = {"candidate": {k: v for k, v in candidate.__dict__.items()}, "tokens": sum(traj.seq_lengths.values()),
           "update_s": update_s, "mfu_update": mfu(flops, update_s, 1, peak_flops),
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    if profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda.synchronize()
            start = time.perf_counter()
            probe.update_actor(traj, old_lp, ref_lp, advantages)
            torch.cuda.synchronize()
            wall_s = time.perf_counter() - start
        events = prof.key_averages()
        cuda_total_us = sum(e.self_device_time_total for e in events)
        top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:25]
        out["profile"] = {"wall_s": wall_s, "gpu_busy_s": cuda_total_us / 1e6,
                          "top": [{"name": e.key[:90], "cuda_s": e.self_device_time_total / 1e6, "calls": e.count}
                                  for e in top]}
    del probe, traj, old_lp, ref_lp
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--only", help="run only the plans whose name contains one of these comma-separated texts")
    args = parser.parse_args()
    gpu = match_device_name(torch.cuda.get_device_name(0)) or get_gpu("H200")
    peak = gpu.peak_bf16_flops
    from torch.nn.attention.varlen import varlen_attn
    import inspect
    print("varlen_attn", inspect.signature(varlen_attn), flush=True)
    plans = update_plans()
    if args.only:
        plans = [p for p in plans if any(part in p[0] for part in args.only.split(","))]
    results = []
    for name, workload, cand, prof in plans:
        try:
            r = measure(args.model, workload, cand, peak, args.repeats, prof)
        except torch.OutOfMemoryError:
            gc.collect()
            torch.cuda.empty_cache()
            print(f"{name:45s} out of memory", flush=True)
            continue
        r["plan"] = name
        r["workload"] = workload.__dict__
        results.append(r)
        print(f"{name:45s} tokens {r['tokens']:6d}  update {r['update_s']:.3f} s  MFU {r['mfu_update']:.3f}  "
              f"peak {r['peak_mem_gib']:.1f} GiB", flush=True)
        if prof:
            p = r["profile"]
            print(f"  profiled: wall {p['wall_s']:.3f} s, GPU busy {p['gpu_busy_s']:.3f} s")
            for e in p["top"]:
                print(f"  {e['cuda_s']*1e3:8.1f} ms {e['calls']:5d}x  {e['name']}")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d"), "model": args.model, "results": results}
    (args.out / f"profile_torch_update_{args.model}.json").write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
