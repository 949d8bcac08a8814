"""Refit the sim's collective efficiency from measured collectives (benchmarks/multi_gpu/collectives.py output).

    python benchmarks/multi_gpu/fit_comm.py RESULTS.json [...] --gpu H200

The sim prices a ring collective as payload x (g-1)/g / (link bandwidth x collective_efficiency)
(autotune/model/cost.py `_collective_s`): busbw / link bandwidth IS that efficiency. Fitted on the large payloads
(>= 64 MiB, where latency is amortised), as the median over all_reduce, all_gather and reduce_scatter and every
world size given; all_to_all (MoE dispatch, Ulysses) is printed beside it. The latency column is the time of the
smallest payload, which the sim does not price yet. Prints the prior from calibration.py for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from autotune.errors import ConfigError
from autotune.hardware import get_gpu
from autotune.model.calibration import DEFAULT_CONSTANTS

LARGE_BYTES = 64 << 20
RING = ("all_reduce", "all_gather", "reduce_scatter")


def fit(results: list[dict], link_bytes_per_s: float) -> dict:
    """{'collective_efficiency': median busbw/link over the large ring payloads, 'by': {(collective, world): eff},
    'latency_s': {(collective, world): time of the smallest payload}}."""
    by, latency = {}, {}
    for result in results:
        world = result["meta"]["world_size"]
        for collective in sorted({r["collective"] for r in result["rows"]}):
            rows = sorted((r for r in result["rows"] if r["collective"] == collective), key=lambda r: r["bytes"])
            large = [r["busbw_bytes_per_s"] / link_bytes_per_s for r in rows if r["bytes"] >= LARGE_BYTES]
            if large:
                by[(collective, world)] = statistics.median(large)
            latency[(collective, world)] = rows[0]["time_s"]
    ring = [eff for (collective, _), eff in by.items() if collective in RING]
    return {"collective_efficiency": statistics.median(ring) if ring else None, "by": by, "latency_s": latency}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--gpu", required=True, help="GPU type of the measured node (autotune gpus lists them)")
    args = ap.parse_args(argv)
    try:
        gpu = get_gpu(args.gpu)
        results = [json.loads(p.read_text()) for p in args.results]
    except (ConfigError, OSError, ValueError) as exc:
        print(f"fit_comm: {exc}", file=sys.stderr)
        return 2
    out = fit(results, gpu.intra_node_bytes_per_s)
    print(f"link: {gpu.name} intra-node {gpu.intra_node_bytes_per_s / 1e9:.0f} GB/s per direction (autotune/hardware.py)")
    print(f"{'collective':15s} {'GPUs':>4s} {'busbw/link (>= 64 MiB)':>24s} {'latency (smallest) ms':>22s}")
    for key in sorted(out["latency_s"]):
        eff = out["by"].get(key)
        print(f"{key[0]:15s} {key[1]:4d} {eff if eff is not None else float('nan'):24.2f} {out['latency_s'][key] * 1e3:22.3f}")
    prior = DEFAULT_CONSTANTS.system.collective_efficiency
    fitted = out["collective_efficiency"]
    print(f"collective_efficiency: prior {prior:.2f}, fitted {fitted:.2f}" if fitted is not None
          else f"collective_efficiency: prior {prior:.2f}; no payload >= 64 MiB measured, nothing fitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
