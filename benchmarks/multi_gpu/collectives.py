"""Collective bandwidth and latency as PyTorch sees them, for the sim's communication constants (issue 22).

    torchrun --standalone --nproc-per-node 8 benchmarks/multi_gpu/collectives.py --out collectives_8.json
    torchrun --standalone --nproc-per-node 2 benchmarks/multi_gpu/collectives.py --backend gloo --sizes-kib 64,256 --out t.json

all_reduce, all_gather, reduce_scatter and all_to_all over payloads of 1 MiB to 1 GiB per rank (bf16). Each size:
`--warmup` untimed calls, then `--iters` timed calls between barriers; a call's time is the slowest rank's (MAX
all-reduce of the per-rank median). Bandwidths follow nccl-tests' definitions (PERFORMANCE.md): algbw = size / time,
busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n for all_gather, reduce_scatter and all_to_all, where `size` is
the per-rank buffer of all_reduce and the full (gathered / to-be-scattered) buffer of the others: busbw is what one
link carries, the quantity the sim's `_collective_s` divides by (autotune/model/cost.py). Rank 0 writes the JSON.

NVLink multicast stays off in every process (this workplace's rule; also harmless elsewhere): NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set before the process group starts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import warnings

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
DEFAULT_SIZES_MIB = (1, 4, 16, 64, 256, 1024)


def bus_factor(collective: str, world: int) -> float:
    """nccl-tests PERFORMANCE.md: the share of the payload that crosses each link."""
    return 2 * (world - 1) / world if collective == "all_reduce" else (world - 1) / world


def _timed(fn, sync, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def run(backend: str, sizes_bytes: list[int], warmup: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist

    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    # torch 2.13 deprecates all_gather_into_tensor for all_gather_single, which 2.11 (the GPU nodes) lacks
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    rows = []
    for size in sizes_bytes:
        n = max(size // elem // world * world, world)  # divisible by the world for the sharded collectives
        full = torch.ones(n, dtype=dtype, device=device)
        shard = torch.ones(n // world, dtype=dtype, device=device)
        calls = {"all_reduce": lambda: dist.all_reduce(full),
                 "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
                 "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full)}
        if backend == "gloo":  # gloo has no reduce_scatter_tensor: its all_to_all and all_gather stand in
            calls.pop("reduce_scatter")
        for name, fn in calls.items():
            _timed(fn, sync, warmup)
            median_s = statistics.median(_timed(fn, sync, iters))
            slowest = torch.tensor([median_s], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            time_s = float(slowest.item())
            nbytes = n * elem
            algbw = nbytes / time_s
            rows.append({"collective": name, "bytes": nbytes, "time_s": time_s, "algbw_bytes_per_s": algbw,
                         "busbw_bytes_per_s": algbw * bus_factor(name, world)})
    meta = {"world_size": world, "backend": backend, "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__, "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "env": {k: os.environ.get(k) for k in MULTICAST_OFF}, "warmup": warmup, "iters": iters}
    if device.type == "cuda":
        meta["device"] = torch.cuda.get_device_name(device)
        meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    dist.destroy_process_group()
    return {"meta": meta, "rows": rows} if rank == 0 else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--sizes-mib", default=",".join(map(str, DEFAULT_SIZES_MIB)))
    ap.add_argument("--sizes-kib", default=None, help="sizes in KiB instead (CPU smoke runs)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    sizes = ([int(s) << 10 for s in args.sizes_kib.split(",")] if args.sizes_kib
             else [int(s) << 20 for s in args.sizes_mib.split(",")])
    result = run(args.backend, sizes, args.warmup, args.iters)
    if result:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        for r in result["rows"]:
            print(f"{r['collective']:15s} {r['bytes'] / 2**20:9.2f} MiB {r['time_s'] * 1e3:9.3f} ms "
                  f"busbw {r['busbw_bytes_per_s'] / 1e9:8.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
