"""Fit the memory and throughput constants of the sim model to the H200 measurements, and print the
error of the fitted model on every row plus a leave-one-out error (each row predicted by constants
fitted without it).

    python benchmarks/fit_calibration.py            # fit, print; paste the constants into calibration.py
    python benchmarks/fit_calibration.py --check    # only print the errors of the committed constants

The fit is a coordinate search over a few physically meaningful constants, minimising the mean
absolute log error; OOM rows must stay predicted over capacity.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import fields, replace
from pathlib import Path

from autotune.model.calibration import ACTIVATIONS, THROUGHPUT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_rows import (H200, errors, load_rows, memory_rows, predict_peak_gib,  # noqa: E402
                              predict_tokens_per_s, throughput_rows)

MEM_KNOBS = ("per_h", "per_i", "logits_retained_bytes", "logits_transient_bytes", "logits_forward_bytes")
THR_KNOBS = ("mfu_max_at_h2048", "mfu_max_log2_slope", "t_half_tokens_at_h2048", "t_half_log2_slope",
             "ckpt_throughput_factor", "forward_mfu_factor")


def mem_loss(act, rows) -> float:
    loss = 0.0
    for row in rows:
        pred = predict_peak_gib(row, act)
        if row.oom:
            loss += 0.0 if pred > H200.mem_gib else 10.0
        else:
            loss += abs(math.log(pred / row.raw["peak_gb"]))
    return loss


def thr_loss(thr, rows) -> float:
    return sum(abs(math.log(predict_tokens_per_s(r, thr) / r.raw["tok_s"])) for r in rows)


def coordinate_fit(start, knobs, loss, rows, rounds: int = 6):
    best, best_loss = start, loss(start, rows)
    for step in (0.2, 0.1, 0.05, 0.02, 0.01)[:rounds]:
        improved = True
        while improved:
            improved = False
            for knob in knobs:
                for sign in (+1, -1):
                    value = getattr(best, knob)
                    trial = replace(best, **{knob: value * (1 + sign * step) if value else sign * step})
                    trial_loss = loss(trial, rows)
                    if trial_loss < best_loss - 1e-12:
                        best, best_loss, improved = trial, trial_loss, True
    return best


def leave_one_out(start, knobs, loss, rows, predict, measured):
    out = []
    for i, row in enumerate(rows):
        if getattr(row, "oom", False):
            continue
        fitted = coordinate_fit(start, knobs, loss, rows[:i] + rows[i + 1:], rounds=3)
        out.append(predict(row, fitted) / measured(row) - 1)
    return out


def show(title, items) -> None:
    print(f"\n{title}")
    for label, measured, pred, err in items:
        print(f"  {label:32s} measured {measured:10.1f}  predicted {pred:10.1f}  error {err:+6.1%}")
    print(f"  median |error| {statistics.median(abs(x[3]) for x in items):.1%}, max {max(abs(x[3]) for x in items):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="print errors of the committed constants only")
    args = parser.parse_args()
    rows = load_rows()
    mrows, trows = memory_rows(rows), throughput_rows(rows)
    act, thr = ACTIVATIONS, THROUGHPUT
    if not args.check:
        act = coordinate_fit(ACTIVATIONS, MEM_KNOBS, mem_loss, mrows)
        thr = coordinate_fit(THROUGHPUT, THR_KNOBS, thr_loss, trows)
        print("fitted ActivationConstants:", {f.name: round(getattr(act, f.name), 4) for f in fields(act)})
        print("fitted ThroughputConstants:", {f.name: round(getattr(thr, f.name), 4) for f in fields(thr)})
    e = errors(act, thr)
    show("peak memory (GiB), torch.cuda.max_memory_allocated", e["memory"])
    print("\nOOM rows (predicted peak GiB, predicted OOM?)")
    for label, pred, predicted_oom in e["oom"]:
        print(f"  {label:32s} predicted {pred:8.1f}  {'OOM' if predicted_oom else 'FITS (wrong)'}")
    show("throughput (tokens/s)", e["throughput"])
    if not args.check:
        loo_m = leave_one_out(ACTIVATIONS, MEM_KNOBS, mem_loss, mrows, predict_peak_gib, lambda r: r.raw["peak_gb"])
        loo_t = leave_one_out(THROUGHPUT, THR_KNOBS, thr_loss, trows, predict_tokens_per_s, lambda r: r.raw["tok_s"])
        print(f"\nleave-one-out: memory median |error| {statistics.median(map(abs, loo_m)):.1%} "
              f"(max {max(map(abs, loo_m)):.1%}); throughput median |error| {statistics.median(map(abs, loo_t)):.1%} "
              f"(max {max(map(abs, loo_t)):.1%})")


if __name__ == "__main__":
    main()
