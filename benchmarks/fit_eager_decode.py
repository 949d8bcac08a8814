"""The cost of vLLM's eager decode per layer per step (rollout.enforce_eager), fitted on real verl runs (no GPU).

    PYTHONPATH=. python benchmarks/fit_eager_decode.py > benchmarks/results/fit_eager_decode.txt

Fits model/calibration.py RolloutConstants.eager_decode_s_per_layer on the 18 measured configurations of the
2026-12-05 H200 shared study (benchmarks/results/h200-2026-12-05-verl-shared/autotune.db: verl 0.9.1, vLLM 0.24,
Qwen2.5-1.5B shapes, 28 layers, 32 prompts x 4 responses of up to 512 tokens, enforce_eager=True): per
configuration (measured gen - the model's gen with CUDA graphs) / (the model's decode steps x layers), the median
over configurations. The model's gen includes the wait on verl's 2-s poll of the rollout (1 s on average:
calibration.py verl_poll_wait_s), so the fit is the eager decode's alone. Then checks the fitted term on rows it
was not fitted on: the 2026-12-03 second study's three probes (the same job on another H200, max_num_seqs 128-1024).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).parent))

from sim_vs_verl_h200 import study_row  # noqa: E402

from autotune.hardware import get_gpu  # noqa: E402
from autotune.model.calibration import DEFAULT_CONSTANTS  # noqa: E402
from autotune.model.cost import estimate_step_time  # noqa: E402
from autotune.models import get_model, model_from_identity  # noqa: E402
from autotune.spaces.candidate import Candidate  # noqa: E402
from autotune.spaces.layout import ParallelLayout  # noqa: E402
from autotune.storage.results import workload_of  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SOURCE_DB = RESULTS / "h200-2026-12-05-verl-shared" / "autotune.db"
HELD_OUT = [("h200-2026-12-03-verl-2", trial) for trial in (0, 1, 2)]
UNIT_S = 1e-3  # a probe value of the constant: gen grows by decode steps x layers x it


def gen_s(model, gpu, workload, cand: Candidate, per_layer_s: float) -> float:
    k = replace(DEFAULT_CONSTANTS, rollout=replace(DEFAULT_CONSTANTS.rollout, eager_decode_s_per_layer=per_layer_s))
    layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
    return estimate_step_time(model, gpu, workload, cand, layout, constants=k, vllm_eager=True).phase_s["gen"]


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{SOURCE_DB}"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    identity = study.user_attrs["identity"]
    model, gpu = model_from_identity(identity), get_gpu(identity["gpu"])
    fits = []
    print("gen with CUDA graphs includes verl's mean poll wait "
          f"({DEFAULT_CONSTANTS.rollout.verl_poll_wait_s:.1f} s)")
    print(f"fitted on {SOURCE_DB.relative_to(RESULTS.parent.parent)} (verl's gen of each configuration's timed step)")
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        attrs = t.user_attrs
        measured = (attrs.get("phase_s") or {}).get("gen")
        if attrs.get("state") != "measured" or not measured:
            continue
        cand, workload = Candidate.from_params(attrs["candidate"]), workload_of(identity, attrs)
        graphs = gen_s(model, gpu, workload, cand, 0.0)
        steps_layers = (gen_s(model, gpu, workload, cand, UNIT_S) - graphs) / UNIT_S
        per_layer = (measured - graphs) / steps_layers
        fits.append(per_layer)
        print(f"  trial {t.number:2d}: seqs {cand.max_num_seqs:4d}, gen measured {measured:5.2f} s, CUDA graphs "
              f"{graphs:4.2f} s, {steps_layers / model.num_layers:5.0f} decode steps x {model.num_layers} layers: "
              f"{per_layer * 1e3:.3f} ms per layer per step")
    fitted = statistics.median(fits)
    print(f"eager_decode_s_per_layer = {fitted * 1e3:.3f} ms (median of {len(fits)}; range "
          f"{min(fits) * 1e3:.3f}-{max(fits) * 1e3:.3f})")
    print()
    print("held out (the 2026-12-03 second study, another H200): gen predicted/measured, CUDA graphs -> eager priced")
    q15 = get_model("qwen2.5-1.5b")
    for folder, trial in HELD_OUT:
        m, workload, cand = study_row(folder, trial)
        measured = m["timing_s/gen"]
        graphs, eager = gen_s(q15, gpu, workload, cand, 0.0), gen_s(q15, gpu, workload, cand, fitted)
        print(f"  {folder.removeprefix('h200-2026-12-03-')} trial {trial} (seqs {cand.max_num_seqs}): measured "
              f"{measured:.2f} s; x{graphs / measured:.2f} -> x{eager / measured:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
