"""The memory model against real verl's peaks (NVML, every process on the GPU) in the committed verl studies: each
measured probe's peak over the model's prediction for it, with the model's phase peaks. No GPU needed.

    PYTHONPATH=. python benchmarks/verl_peaks_vs_model.py
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.hardware import get_gpu
from autotune.model.memory import estimate_memory
from autotune.models import model_from_identity
from autotune.spaces.candidate import Candidate
from autotune.spaces.layout import ParallelLayout
from autotune.storage.results import workload_of

RESULTS = Path(__file__).parent / "results"
STUDIES = (  # (database, GPU, trials left out and why)
    ("h100-2026-12-07-shared-study/autotune.db", "H100", {}),
    ("h200-2026-12-05-verl-shared/autotune.db", "H200",
     {0: "its peak is the whole launch's (read before shared_launch.sample_spans)"}),
)


def label(cand: Candidate) -> str:
    text = (f"dyn {cand.ppo_max_token_len_per_gpu}/{cand.log_prob_max_token_len_per_gpu}" if cand.use_dynamic_bsz else
            f"micro {cand.ppo_micro_batch_size_per_gpu}/{cand.log_prob_micro_batch_size_per_gpu}/"
            f"{cand.ref_log_prob_micro_batch_size_per_gpu}")
    return text + (" fused" if cand.use_fused_kernels else "") + f" {cand.actor_engine}"


def main() -> int:
    ratios = []
    for db, gpu_name, skip in STUDIES:
        study = optuna.load_study(study_name="qwen2.5-1.5b-1x1-verl", storage=f"sqlite:///{RESULTS / db}")
        ident = study.user_attrs["identity"]
        model, gpu = model_from_identity(ident), get_gpu(gpu_name)
        workload = workload_of(ident)
        print(f"{db} ({gpu.name}, {gpu.mem_gib:.1f} GiB); measured / predicted peak, then the model's phase peaks GiB")
        for number, why in skip.items():
            print(f"  trial {number:2d} left out: {why}")
        for t in study.trials:
            ua = t.user_attrs
            if ua.get("state") != "measured" or t.number in skip or ua.get("confirms") is not None:
                continue
            cand = Candidate.from_params(ua["candidate"])
            mem = estimate_memory(model, gpu, workload, cand, ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1))
            ratio = ua["peak_mem_gib"] / mem.peak_gib
            ratios.append(ratio)
            phases = " ".join(f"{k} {v:.1f}" for k, v in mem.phase_peak_gib.items())
            print(f"  trial {t.number:2d} {label(cand):32s} measured {ua['peak_mem_gib']:6.1f} predicted "
                  f"{mem.peak_gib:6.1f}  x{ratio:.2f}   {phases}")
    ratios.sort()
    print(f"{len(ratios)} probes: measured/predicted {ratios[0]:.2f}-{ratios[-1]:.2f}, median {ratios[len(ratios) // 2]:.2f}; "
          f"above 1.04 (past the gate's 4% headroom): {sum(r > 1.04 for r in ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
