#!/usr/bin/env python3
"""Issue 29: where verl's training passes spend their time, from a real run (no GPU needed to read it).

Reads a results folder of `benchmarks/verl_h200/gpu/explain_phases.sh` plus `gpu/phase_micro.py` (the job's
verl console logs with remove-padding off and on, and the same passes run by hand in torch + transformers on the
same GPU) and prints, per phase of the timed step (step 2; step 1 is warm-up): verl's seconds with remove-padding
off and on, the by-hand seconds of the same compute, and the model FLOP/s each achieves (FLOPs as verl's own
FlopsCounter counts them over the step's real tokens: `autotune/verl/flops.py`).

    PYTHONPATH=. python benchmarks/verl_phase_gap.py benchmarks/results/h100-2026-12-06-explain
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from autotune.models import get_model
from autotune.verl.flops import forward_flops, train_flops
from autotune.verl.metrics import parse_console_line

TIMED_STEP = 2
NUM_SEQS = 128  # the job: 32 prompts x rollout.n 4 (benchmarks/verl_h200/run_tiny_grpo.sh)
MICRO_RE = re.compile(r"^(padded SDPA|remove-padding flash varlen): old_log_prob pass ([\d.]+) s .*update fwd\+bwd "
                      r"([\d.]+) s")


def step_metrics(log: Path, step: int) -> dict[str, float]:
    """verl's metrics of one step; the console logger splits a step over several lines."""
    merged: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        parsed = parse_console_line(line)
        if parsed is not None and parsed.step == step:
            merged.update(parsed.metrics)
    if not merged:
        raise SystemExit(f"verl_phase_gap: no step {step} in {log}")
    return merged


def by_hand(text: str) -> dict[str, tuple[float, float]]:
    """phase_micro.py's seconds per attention path: (old_log_prob pass, update forward + backward)."""
    found = {}
    for line in text.splitlines():
        match = MICRO_RE.match(line)
        if match:
            found[match.group(1)] = (float(match.group(2)), float(match.group(3)))
    return found


def main(folder: Path) -> None:
    model = get_model("qwen2.5-1.5b")
    off = step_metrics(folder / "rmpad_off.log", TIMED_STEP)
    on = step_metrics(folder / "rmpad_on.log", TIMED_STEP)
    micro_text = (folder / "phase_micro.txt").read_text()
    hand = by_hand(micro_text)
    gpu = micro_text.splitlines()[0]
    seqlens = [off["perf/total_num_tokens"] / NUM_SEQS] * NUM_SEQS
    fwd, trained = forward_flops(model, seqlens), train_flops(model, seqlens)
    print(f"# {folder}: {gpu}; step {TIMED_STEP} of each launch (step 1 is warm-up)")
    print(f"# real tokens in the step: {off['perf/total_num_tokens']:.0f} (remove-padding off), "
          f"{on['perf/total_num_tokens']:.0f} (on); FLOPs as verl counts them: forward {fwd / 1e12:.0f} TFLOP, "
          f"forward+backward {trained / 1e12:.0f} TFLOP (recompute not counted)")
    header = ("phase", "verl off s", "verl on s", "on/off", "by hand padded s", "by hand rmpad s",
              "verl off / hand", "verl TFLOP/s", "hand TFLOP/s")
    print(" | ".join(header))
    rows = (("old_log_prob", fwd, 0), ("ref", fwd, 0), ("update_actor", trained, 1))
    padded, rmpad = hand["padded SDPA"], hand["remove-padding flash varlen"]
    for phase, flops, which in rows:
        t_off, t_on = off[f"timing_s/{phase}"], on[f"timing_s/{phase}"]
        t_hand, t_hand_rmpad = padded[which], rmpad[which]
        print(f"{phase} | {t_off:.1f} | {t_on:.1f} | {t_on / t_off:.2f} | {t_hand:.2f} | {t_hand_rmpad:.2f} | "
              f"{t_off / t_hand:.1f} | {flops / t_off / 1e12:.0f} | {flops / t_hand / 1e12:.0f}")
    for phase in ("gen", "update_weights", "step"):
        t_off, t_on = off[f"timing_s/{phase}"], on[f"timing_s/{phase}"]
        print(f"{phase} | {t_off:.1f} | {t_on:.1f} | {t_on / t_off:.2f} | - | - | - | - | -")
    print(f"verl's perf/mfu/actor: {off['perf/mfu/actor']:.3f} (off), {on['perf/mfu/actor']:.3f} (on); "
          f"throughput {off['perf/throughput']:.0f} and {on['perf/throughput']:.0f} tokens/s/GPU")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: verl_phase_gap.py RESULTS_FOLDER")
    main(Path(sys.argv[1]))
