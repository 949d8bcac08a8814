"""The sim model's predictions next to the torch probe's H200 measurements it was not fitted on.

    python benchmarks/sim_vs_torch_probe.py > benchmarks/results/sim_vs_torch_probe.txt

Reads committed results only (no GPU, no torch):
- update-phase plans of benchmarks/profile_torch_update.py: the update's peak memory and verl's update MFU;
- study trials of benchmarks/torch_h200_study.py: the whole probe's peak (every phase), for launched trials;
- every measured OOM: was it predicted? A probe the kernel killed (host out of memory): was the host's
  overflow predicted (model/host_memory.py)?
- single probes of benchmarks/torch_probe_one.py;
- the training passes' times (old_log_prob, ref, update_actor) of the study trials.

The sim's constants were fitted on ../shared/calibration (benchmarks/fit_calibration.py). Of the constants
these rows touch, liger_throughput_factor was set from the MFU of the liger rows and host_s_per_layer_pass
from the small-micro-batch phase times of the 1.5B default (both marked "fitted"); every memory row and
the MFU of the rows without liger are held out.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.model.cost import estimate_step_time
from autotune.model.host_memory import estimate_host_memory
from autotune.model.memory import estimate_memory
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.workload import Workload

sys.path.insert(0, str(Path(__file__).parent))
from torch_update_plans import update_plans  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROFILE = RESULTS / "h200-2026-12-02-torch-session3" / "profile_torch_update_qwen2.5-1.5b_after_inplace.json"
# the workloads benchmarks/torch_h200_study.py ran: --train-batch 64 --mini-batch 32, and 32 / 16 for 7B
STUDY_64 = Workload(train_batch_size=64, ppo_mini_batch_size=32, rollout_n=4, max_prompt_length=512,
                    max_response_length=128)
STUDY_32 = Workload(train_batch_size=32, ppo_mini_batch_size=16, rollout_n=4, max_prompt_length=512,
                    max_response_length=128)
OLD_BACKWARD = "old log-prob backward (a second logits-sized tensor in the update)"
NO_SLEEP = "; rollout weights held through training (no vLLM sleep yet)"
GREEDY = "; dynamic micro-batches packed greedily up to the budget (verl balances them; the probe does now)"
SESSION4 = RESULTS / "h200-2026-12-02-torch-session4"
SESSION5 = RESULTS / "h200-2026-12-02-torch-session5"
CURRENT = "current probe: balanced dynamic micro-batches, FSDP2 offload pinned and non-blocking"
HOST_GIB = {SESSION4: 125.0, SESSION5: 125.0}  # `free -g` on the machine (study_7b_b.txt, study_7b_call1.txt)
# (trials file, model, workload the study ran, note)
STUDIES = [
    (SESSION5 / "torch_study_qwen2.5-7b.trials.jsonl", "qwen2.5-7b", STUDY_32, CURRENT),
    (SESSION5 / "torch_study_qwen2.5-1.5b.trials.jsonl", "qwen2.5-1.5b", STUDY_64, CURRENT),
    (SESSION4 / "study_7b_a.trials.jsonl", "qwen2.5-7b", STUDY_32, "current log-prob backward" + GREEDY),
    (RESULTS / "h200-2026-12-02-torch-session3" / "study_1.5b_before_inplace_logprobs.trials.jsonl", "qwen2.5-1.5b",
     STUDY_64, OLD_BACKWARD),
    (RESULTS / "h200-2026-12-02-torch-session3" / "study_7b_before_inplace_logprobs.trials.jsonl", "qwen2.5-7b",
     STUDY_32, OLD_BACKWARD),
    (RESULTS / "h200-2026-12-02-torch-session2" / "study_1.5b_part2.trials.jsonl", "qwen2.5-1.5b", STUDY_64,
     OLD_BACKWARD + NO_SLEEP),
    (RESULTS / "h200-2026-12-02-torch-session2" / "study_7b.trials.jsonl", "qwen2.5-7b", STUDY_32,
     OLD_BACKWARD + NO_SLEEP),
]
# single probes: (result file, model, workload, note)
SINGLE = [(SESSION4 / "probe_7b_one.txt", "qwen2.5-7b", STUDY_32, "current log-prob backward" + GREEDY)]
H200 = get_gpu("H200")


def predict(model_name: str, workload: Workload, candidate: Candidate):
    model = get_model(model_name)
    layout = ParallelLayout.of(candidate, workload, gpus_per_node=1, nodes=1)
    return (estimate_memory(model, H200, workload, candidate, layout),
            estimate_step_time(model, H200, workload, candidate, layout))


def update_rows() -> tuple[list[float], list[float]]:
    doc = json.loads(PROFILE.read_text())
    plans = {name: (workload, cand) for name, workload, cand, _ in update_plans()}
    print(f"update phase: {doc['model']} on {doc['device']}, torch {doc['torch']}, {doc['date']} ({PROFILE.name})")
    print("  this profile kept the rollout model's bf16 copy on the GPU (the script now moves it off, as vLLM's")
    print("  sleep): the measured peak includes it, the sim's does not (2.9 GiB for this model)")
    mem_err, mfu_err = [], []
    for r in doc["results"]:
        workload, cand = plans[r["plan"]]
        mem, step = predict(doc["model"], workload, cand)
        peak = mem.phase_peak_gib["update_actor"]
        e_mem, e_mfu = peak / r["peak_mem_gib"] - 1, step.mfu_actor / r["mfu_update"] - 1
        mem_err.append(e_mem)
        held_out = not cand.use_liger
        if held_out:
            mfu_err.append(e_mfu)
        print(f"  {r['plan']:42s} peak {r['peak_mem_gib']:6.1f} GiB sim {peak:6.1f} ({e_mem:+6.1%})   "
              f"MFU {r['mfu_update']:.3f} sim {step.mfu_actor:.3f} ({e_mfu:+6.1%}){'' if held_out else ' fitted'}")
    return mem_err, mfu_err


def host_check(path: Path, model_name: str, workload: Workload, t: dict) -> tuple | None:
    """A probe the kernel killed: did the host model see the overflow?"""
    if "SIGKILL" not in t.get("reason", "") or path.parent not in HOST_GIB:
        return None
    cand = Candidate.from_params(t["candidate"])
    # the probe runs actor_engine=fsdp as FSDP2 and, until this session, offloaded its moments per tensor
    ran = cand.with_(actor_engine="fsdp2")
    layout = ParallelLayout.of(ran, workload, gpus_per_node=1, nodes=1)
    host = estimate_host_memory(get_model(model_name), workload, ran, layout, gpus_per_node=1,
                                capacity_gib=HOST_GIB[path.parent])
    print(f"  trial {t['number']:2d} killed (host OOM); host model {host.describe()} of {HOST_GIB[path.parent]:.0f} "
          f"GiB: {'predicted host OOM' if not host.fits else 'predicted to fit (wrong)'}")
    return path.name, t["number"], not host.fits


# The probes below sized their generation KV pool with the sim's own vllm_kv_budget_bytes (until issue 21), so a
# whole-probe peak measured in generation agrees with the sim by construction: such rows are printed but kept
# out of the held-out error.
GEN_PHASES = ("gen", "rollout")


def measured_row(label: str, model_name: str, workload: Workload, cand: Candidate, t: dict
                 ) -> tuple[float | None, float | None]:
    """(peak-memory error or None when the peak was in generation, update-MFU error or None) of one probe."""
    mem, step = predict(model_name, workload, cand)
    phases = t.get("phase_peak_mem_gib") or {}
    where = max(phases, key=phases.get) if phases else "?"
    err = mem.peak_gib / t["peak_mem_gib"] - 1
    by_construction = where in GEN_PHASES
    print(f"  {label} measured peak {t['peak_mem_gib']:6.1f} GiB (in {where}) "
          f"sim {mem.peak_gib:6.1f} (in {mem.worst_phase}, {err:+6.1%})"
          + ("  [KV pool sized by the sim: not held out]" if by_construction else ""))
    if by_construction:
        err = None
    tag = " fitted" if cand.ppo_micro_batch_size_per_gpu <= 8 and not cand.use_dynamic_bsz else ""
    print("           seconds " + "  ".join(
        f"{ph} {t['phase_s'][ph]:.2f} sim {step.phase_s[ph]:.2f} ({step.phase_s[ph] / t['phase_s'][ph] - 1:+.0%})"
        for ph in ("old_log_prob", "ref", "update_actor") if ph in t["phase_s"]) + tag)
    mfu_err = None
    measured_mfu = t.get("mfu_update") or t.get("mfu")  # torch_probe_one.py's key, the study trials' key
    if measured_mfu:
        mfu_err = step.mfu_actor / measured_mfu - 1
        print(f"           update MFU {measured_mfu:.3f} sim {step.mfu_actor:.3f} ({mfu_err:+.1%})")
    return err, mfu_err


def single_rows() -> tuple[list[float], list[float]]:
    mem_errors, mfu_errors = [], []
    for path, model_name, workload, note in SINGLE:
        print(f"\nsingle probe: {path.parent.name}/{path.name} ({model_name}; {note})")
        t = json.loads(path.read_text().splitlines()[0])
        mem_err, mfu_err = measured_row("probe   ", model_name, workload, Candidate.from_params(t["candidate"]), t)
        if mem_err is not None:
            mem_errors.append(mem_err)
        if mfu_err is not None:
            mfu_errors.append(mfu_err)
    return mem_errors, mfu_errors


def default_probe_rows() -> list[tuple]:
    """verl's default probed after a study that had gated it (torch_h200_study.py --measure-default)."""
    ooms = []
    for path, model_name, workload, _ in STUDIES:
        doc_path = path.with_name(path.name.replace(".trials.jsonl", ".json"))
        probe = json.loads(doc_path.read_text()).get("default_probe") if doc_path.exists() else None
        if not probe or not probe["outcome"].startswith("OOM"):
            continue
        first = json.loads(path.read_text().splitlines()[0])
        mem, _ = predict(model_name, workload, Candidate.from_params(first["candidate"]))
        print(f"\nverl's default, {doc_path.name}: {probe['outcome']} at {probe['peak_mem_gib']:.1f} GiB; sim "
              f"{mem.peak_gib:.1f} GiB in {mem.worst_phase}: {'predicted OOM' if not mem.fits else 'predicted to fit (wrong)'}")
        ooms.append((doc_path.name, 0, not mem.fits))
    return ooms


def study_rows() -> tuple[list[float], list[tuple], list[tuple], list[float]]:
    """Peak-memory errors, OOMs, host kills, and the update-MFU errors of the current probe's trials."""
    errors, ooms, host_kills, current_mfu = [], [], [], []
    for path, model_name, workload, note in STUDIES:
        print(f"\nstudy trials: {path.parent.name}/{path.name} ({model_name}; {note})")
        for line in path.read_text().splitlines():
            t = json.loads(line)
            if not t.get("launched"):
                continue
            cand = Candidate.from_params(t["candidate"])
            mem, step = predict(model_name, workload, cand)
            if t["state"] == "measured":
                mem_err, mfu_err = measured_row(f"trial {t['number']:2d}", model_name, workload, cand, t)
                if mem_err is not None:
                    errors.append(mem_err)
                if note == CURRENT and mfu_err is not None:
                    current_mfu.append(mfu_err)
            elif t["state"] == "failed":
                killed = host_check(path, model_name, workload, t)
                if killed:
                    host_kills.append(killed)
            elif t["state"] == "oom":
                predicted_oom = not mem.fits
                ooms.append((path.name, t["number"], predicted_oom))
                print(f"  trial {t['number']:2d} OOM; sim {mem.peak_gib:6.1f} GiB in {mem.worst_phase}: "
                      f"{'predicted OOM' if predicted_oom else 'predicted to fit (wrong)'}")
    return errors, ooms, host_kills, current_mfu


def main() -> int:
    mem_err, mfu_err = update_rows()
    study_err, ooms, host_kills, current_mfu = study_rows()
    single_mem, single_mfu = single_rows()
    study_err += single_mem
    ooms += default_probe_rows()
    all_mem = mem_err + study_err
    print(f"\nheld-out peak memory: median |error| {statistics.median(map(abs, all_mem)):.1%} over {len(all_mem)} "
          f"rows (update phase {statistics.median(map(abs, mem_err)):.1%}, whole probe "
          f"{statistics.median(map(abs, study_err)):.1%})")
    print(f"held-out update MFU: median |error| {statistics.median(map(abs, mfu_err)):.1%} over {len(mfu_err)} rows "
          "(1.5B update-phase profile, without liger)")
    print("update MFU of single probes (7B, liger, whose factor was fitted on 1.5B): "
          + ", ".join(f"{e:+.1%}" for e in single_mfu))
    print("update MFU of the current probe's study trials (7B with liger; 1.5B default, then 1.5B with liger): "
          + ", ".join(f"{e:+.1%}" for e in current_mfu)
          + f" (median |error| {statistics.median(map(abs, current_mfu)):.1%})")
    print(f"measured GPU OOMs predicted: {sum(p for *_, p in ooms)} of {len(ooms)}")
    print(f"host OOMs (probe killed by the kernel) predicted: {sum(p for *_, p in host_kills)} of {len(host_kills)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
