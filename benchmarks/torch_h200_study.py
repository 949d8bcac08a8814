"""A real autotune study on one GPU with the torch backend: verl's default configuration against the best found.

    python benchmarks/torch_h200_study.py --model qwen2.5-1.5b --wall-s 420 --out results/

The study lives in OUT/torch_study_<model>.db: run the same command with the same OUT to continue a study
that a time limit cut (finished trials are kept; the warm start is not repeated).

Runs the real driver (rules, memory gate, warm start from the sim model, TPE, pruning) with the torch
backend on the GPU of this machine, for a small GSM8K-shaped GRPO workload that fits a few-minute budget
on one GPU (by default 32 prompts x 4 samples, mini-batch 16 prompts, prompts up to 512 tokens,
128-token responses). Prints and writes
(OUT/torch_study_<model>.json): the device, driver and library versions, every trial, and verl's default
against the best in tokens/s per GPU and update-phase MFU, plus the sim model's predicted peak memory
against the measured one for every launched probe (the model's error on data it was not fitted on).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from autotune.config import Budget, ProbeBudget, SearchOptions, TuneConfig
from autotune.hardware import detect_gpus, detect_host_mem_gib, get_gpu, match_device_name
from autotune.models import get_model
from autotune.backends.torch.runner import TorchRunner
from autotune.search.driver import run_study
from autotune.study_tools import load_study
from autotune.storage.records import baseline_record, best_records, records
from autotune.workload import Workload


def study_workload(args: argparse.Namespace) -> Workload:
    return Workload(train_batch_size=args.train_batch, ppo_mini_batch_size=args.mini_batch, rollout_n=4,
                    max_prompt_length=512, max_response_length=128, lora_rank=args.lora_rank)


def probe_default(cfg: TuneConfig, trial, out: Path, deadline_s: float) -> dict:
    """Probe verl's default outside the study (the gate predicted an OOM): a measured OOM or a measurement."""
    from autotune.errors import ProbeOOM
    from autotune.backends.base import ProbeRequest
    from autotune.spaces.candidate import Candidate

    request = ProbeRequest(model=cfg.model, gpu=cfg.gpu, n_gpus=1, nodes=1, workload=cfg.workload,
                           candidate=Candidate.from_params(trial.user_attrs["candidate"]), run_dir=out / "default_probe",
                           warmup_steps=cfg.probe.warmup_steps, timed_steps=cfg.probe.timed_steps)
    predicted = trial.user_attrs.get("predicted_peak_gib")
    try:
        result = TorchRunner(device="cuda", deadline_s=deadline_s, idle_timeout_s=deadline_s).probe(
            request, lambda step, tps: False)
    except ProbeOOM as exc:
        return {"outcome": f"OOM in {exc.phase}", "peak_mem_gib": exc.peak_mem_gib, "predicted_peak_gib": predicted,
                "message": str(exc)}
    return {"outcome": "fits", "peak_mem_gib": result.peak_mem_gib, "predicted_peak_gib": predicted,
            "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu, "mfu_update": result.mfu, "message": ""}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--wall-s", type=float, default=420.0, help="search budget in wall time")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--train-batch", type=int, default=32, help="prompts per step (x4 samples)")
    parser.add_argument("--mini-batch", type=int, default=16, help="prompts per PPO mini-batch")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    parser.add_argument("--probe-deadline-s", type=float, default=300.0,
                        help="a probe running longer is killed and recorded as failed (7B with offload: ~100 s a step)")
    parser.add_argument("--timed-steps", type=int, default=2, help="timed steps per probe, after one warm-up step")
    parser.add_argument("--measure-default", action="store_true",
                        help="when the memory gate kept verl's default from launching, probe it anyway afterwards, "
                             "to check the predicted OOM against a real one")
    args = parser.parse_args()
    workload = study_workload(args)
    import torch
    import transformers

    gpus = detect_gpus()
    if gpus is None:
        sys.exit("no GPU found: this benchmark measures real GPU work")
    gpu = match_device_name(gpus.device_name) or get_gpu("H200")
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = TuneConfig(model=get_model(args.model), gpu=gpu, gpus_per_node=1, nodes=1, backend="torch", trials=args.trials,
                     storage_url=f"sqlite:///{(args.out / f'torch_study_{args.model}.db').resolve()}",
                     study_name=f"{args.model}-torch", out_dir=args.out, seed=0, workload=workload, fixed={},
                     ranges={}, tune_workload=(), probe=ProbeBudget(warmup_steps=1, timed_steps=args.timed_steps),
                     search=SearchOptions(warm_start=2), budget=Budget(wall_time_s=args.wall_s),
                     host_mem_gib=detect_host_mem_gib())
    started = time.time()
    trials_log = args.out / f"torch_study_{args.model}.trials.jsonl"

    def on_trial(t) -> None:
        """Print each trial and append it to a JSON-lines file, so a study cut short keeps its trials."""
        a = t.user_attrs
        print(f"trial {t.number}: {a.get('state')} tokens/s/GPU {a.get('tokens_per_s_per_gpu') or '-'} "
              f"update MFU {a.get('mfu') or '-'} peak {a.get('peak_mem_gib') or '-'} GiB "
              f"(sim {a.get('predicted_peak_gib') or '-'}) {a.get('reason', '')[:120]}", flush=True)
        with trials_log.open("a") as f:
            f.write(json.dumps({"number": t.number, **a}, default=str) + "\n")

    try:
        runner = TorchRunner(device="cuda", deadline_s=args.probe_deadline_s, idle_timeout_s=args.probe_deadline_s)
        study = run_study(cfg, runner, on_trial=on_trial)
    except KeyboardInterrupt:  # cut short (e.g. `timeout -s INT`): report what the storage holds
        print("interrupted: reporting the finished trials", flush=True)
        study = load_study(cfg.storage_url, cfg.study_name)
    recs = records(study)
    base, best = baseline_record(study), (best_records(study, k=1) or [None])[0]
    default_probe = None
    if args.measure_default and base is not None and base.state != "measured":
        default_probe = probe_default(cfg, study.trials[base.number], args.out, args.probe_deadline_s)
    mem_err, launched_ooms = [], []
    for t in study.trials:
        if t.user_attrs.get("launched") and t.user_attrs.get("state") == "oom":  # the gate let a real OOM through
            launched_ooms.append({"trial": t.number, "predicted_gib": t.user_attrs.get("predicted_peak_gib"),
                                  "reason": t.user_attrs.get("reason", "")[:200]})
        measured, predicted = t.user_attrs.get("peak_mem_gib"), t.user_attrs.get("predicted_peak_gib")
        if t.user_attrs.get("launched") and measured and predicted and t.user_attrs.get("state") == "measured":
            mem_err.append({"trial": t.number, "measured_gib": measured, "predicted_gib": predicted,
                            "error": predicted / measured - 1})
    doc = {
        "device": gpus.device_name, "driver": gpus.driver, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"), "host_mem_gib": cfg.host_mem_gib, "model": args.model, "workload": workload.__dict__,
        "wall_s": round(time.time() - started, 1),
        "trials": [{"number": r.number, "state": r.state, "reason": r.reason[:200],
                    "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "mfu_update": r.mfu, "peak_mem_gib": r.peak_mem_gib,
                    "phase_s": r.phase_s, "params": study.trials[r.number].user_attrs.get("candidate")} for r in recs],
        "baseline": None if base is None else {"trial": base.number, "tokens_per_s_per_gpu": base.tokens_per_s_per_gpu,
                                               "mfu_update": base.mfu, "peak_mem_gib": base.peak_mem_gib},
        "best": None if best is None else {"trial": best.number, "tokens_per_s_per_gpu": best.tokens_per_s_per_gpu,
                                           "mfu_update": best.mfu, "peak_mem_gib": best.peak_mem_gib},
        "sim_memory_error": mem_err,
        "default_probe": default_probe,
        "launched_ooms": launched_ooms,
    }
    (args.out / f"torch_study_{args.model}.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"\n{args.model} on {gpus.device_name} (driver {gpus.driver}, torch {torch.__version__}), "
          f"{len(recs)} trials in {doc['wall_s']:.0f} s")
    print("| configuration | tokens/s/GPU | update MFU | peak GiB |")
    print("|---|---|---|---|")
    for name, r in (("verl default", base), ("best found", best)):
        if r is not None and r.tokens_per_s_per_gpu:
            print(f"| {name} (trial {r.number}) | {r.tokens_per_s_per_gpu:.0f} | {r.mfu or 0:.3f} | {r.peak_mem_gib:.1f} |")
    if base and best and base.tokens_per_s_per_gpu:
        print(f"speed-up x{best.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu:.2f}")
    print(f"OOMs among launched probes (predicted to fit, did not): {len(launched_ooms)}")
    if default_probe is not None:
        print(f"verl default (trial {base.number}, {base.state}: not launched by the study), probed afterwards: "
              f"{default_probe['outcome']}, peak {default_probe['peak_mem_gib']} GiB against the sim's "
              f"{default_probe['predicted_peak_gib']:.1f} GiB predicted ({default_probe['message'][:160]})")
    if mem_err:
        print(f"sim peak-memory error on {len(mem_err)} measured probes: median "
              f"{statistics.median(abs(e['error']) for e in mem_err):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
