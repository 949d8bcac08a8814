#!/usr/bin/env python3
"""Where a verl stage's seconds go, from the chrome traces verl's torch profiler writes (global_profiler.tool=torch,
actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda]); issue 29 item 1.

For each stage verl marks with record_function (verl 0.9.1 workers/engine_workers.py: actor_compute_log_prob,
ref_compute_log_prob, actor_update, and its mini_batchN inside the update): wall seconds on the host, seconds the
GPU was busy with kernels (union of kernel intervals launched from inside the stage), idle share (host-bound when
large), kernel launches, host seconds inside cudaLaunchKernel, and kernel time by family (matmul, attention,
softmax/log-softmax/entropy, elementwise, NCCL, memcpy/memset) with the top kernels. Traces are large; run it
where they are written and keep only the text.

usage: summarize_trace.py TRACE.json[.gz] [...]
"""
import collections
import gzip
import json
import re
import sys

STAGES = ("actor_compute_log_prob", "ref_compute_log_prob", "actor_update", "train_batch")
FAMILIES = (  # first match wins; names as cuBLAS/CUTLASS/PyTorch/NCCL kernels are printed in traces
    ("nccl", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|efficient_", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|sm90_|cublas|matmul|wgmma", re.I)),
    ("softmax/entropy", re.compile(r"softmax|logsumexp|log_softmax|cross_entropy|entropy", re.I)),
    ("reduce", re.compile(r"reduce|norm|sum_|mean", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|cat|index|gather|scatter|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|triton", re.I)),
)


def family(name):
    for fam, pattern in FAMILIES:
        if pattern.search(name):
            return fam
    return "other"


def union_s(intervals):
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total / 1e6


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def summarize(path):
    events = [e for e in load(path) if e.get("ph") == "X"]
    stages = [e for e in events if e.get("cat") == "user_annotation" and
              (e["name"] in STAGES or e["name"].startswith("mini_batch"))]
    # A kernel belongs to the stage that launched it: the runtime call (cudaLaunchKernel and kin) that carries
    # its correlation id falls inside the stage's host interval.
    runtime = {e["args"]["correlation"]: e for e in events
               if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    lines = [f"== {path.rsplit('/', 1)[-1]}"]
    for st in sorted(stages, key=lambda e: e["ts"]):
        s0, s1 = st["ts"], st["ts"] + st["dur"]
        mine, launches = [], []
        for k in kernels:
            r = runtime.get(k.get("args", {}).get("correlation"))
            if r is not None and s0 <= r["ts"] <= s1:
                mine.append(k)
                launches.append(r)
        if st["name"].startswith("mini_batch") and not mine:
            continue
        wall_s = st["dur"] / 1e6
        busy_s = union_s([(k["ts"], k["ts"] + k["dur"]) for k in mine])
        launch_host_s = sum(r["dur"] for r in launches) / 1e6
        by_family = collections.Counter()
        by_name = collections.Counter()
        count = collections.Counter()
        for k in mine:
            by_family[family(k["name"])] += k["dur"] / 1e6
            by_name[k["name"][:90]] += k["dur"] / 1e6
            count[k["name"][:90]] += 1
        lines.append(f"{st['name']}: wall {wall_s:.2f} s, GPU busy {busy_s:.2f} s (idle {1 - busy_s / wall_s:.0%}), "
                     f"{len(mine)} kernels, {launch_host_s:.2f} s host in launch calls")
        lines.append("  by family: " + ", ".join(f"{f} {t:.2f} s" for f, t in by_family.most_common()))
        for name, t in by_name.most_common(8):
            lines.append(f"    {t:7.3f} s  x{count[name]:<6d} {name}")
    return lines


if __name__ == "__main__":
    for p in sys.argv[1:]:
        try:
            print("\n".join(summarize(p)))
        except (OSError, ValueError, KeyError) as err:
            print(f"== {p}: unreadable trace ({err})")
