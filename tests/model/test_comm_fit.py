"""The multi-GPU communication benchmark (benchmarks/multi_gpu/): the collectives script runs under torchrun (gloo
on CPU here; NCCL on the GPU nodes), and the fit recovers the sim's collective efficiency from busbw."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "multi_gpu"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_collectives_run_under_torchrun_and_report_nccl_tests_bandwidths(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "coll.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(BENCH / "collectives.py"), "--backend", "gloo", "--sizes-kib", "64", "--warmup", "1",
                    "--iters", "2", "--out", str(out)], check=True, capture_output=True, timeout=240, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["meta"]["world_size"] == 2 and result["meta"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert {r["collective"] for r in result["rows"]} == {"all_reduce", "all_gather", "all_to_all"}
    for r in result["rows"]:
        factor = 1.0 if r["collective"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert r["time_s"] > 0 and r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * factor)


def test_fit_recovers_the_efficiency_from_large_payloads_only():
    fit_comm = _module("fit_comm")
    link = 450e9
    rows = []
    for collective, eff in (("all_reduce", 0.78), ("all_gather", 0.82), ("reduce_scatter", 0.80), ("all_to_all", 0.4)):
        for mib, busbw in ((1, 0.05 * link), (64, eff * link), (1024, eff * link)):  # 1 MiB is latency-bound
            rows.append({"collective": collective, "bytes": mib << 20, "time_s": 1e-4 * mib,
                         "algbw_bytes_per_s": busbw, "busbw_bytes_per_s": busbw})
    out = fit_comm.fit([{"meta": {"world_size": 8}, "rows": rows}], link)
    assert out["collective_efficiency"] == pytest.approx(0.80)
    assert out["by"][("all_to_all", 8)] == pytest.approx(0.4) and out["latency_s"][("all_gather", 8)] == 1e-4
