"""The sim model's error on the real H200 measurements (autotune/data/h200-*.json).

Bounds here are what docs/model.md states; benchmarks/fit_calibration.py prints every row.
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from calibration_rows import errors, load_rows, memory_rows, throughput_rows  # noqa: E402


def test_rows_load_and_cover_both_models():
    rows = load_rows()
    assert len(rows) == 32
    assert {r.raw["model"] for r in memory_rows(rows)} >= {"0.5b", "1.5b", "7b"}
    assert len(throughput_rows(rows)) >= 15


def test_peak_memory_error_is_small():
    mem = errors()["memory"]
    abs_err = [abs(e[3]) for e in mem]
    assert statistics.median(abs_err) <= 0.05  # docs/model.md: 2.5% median
    assert max(abs_err) <= 0.15


def test_every_measured_oom_is_predicted_and_every_fit_fits():
    e = errors()
    assert len(e["oom"]) == 5
    assert all(predicted_oom for _, _, predicted_oom in e["oom"])
    from calibration_rows import H200
    assert all(pred < H200.mem_gib for _, _, pred, _ in e["memory"])


def test_throughput_error_is_small():
    thr = errors()["throughput"]
    abs_err = [abs(e[3]) for e in thr]
    assert statistics.median(abs_err) <= 0.03  # docs/model.md: 0.8% median
    assert max(abs_err) <= 0.10
