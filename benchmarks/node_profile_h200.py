"""A node profile learned from one real verl study, checked on another study's probes (no GPU needed).

    PYTHONPATH=. python benchmarks/node_profile_h200.py > benchmarks/results/node_profile_h200.txt

Twice: with the time model as it prices a node with flash-attn, and told what the node was (no flash-attn:
verl's per-token log-prob loop, model/cost.py logprob_loop_s).

Learns the profile (search/node_prior.study_rows: per phase the log of measured over predicted seconds of each
measured probe) from the 18 configurations of the 2026-12-05 shared-launch study on one H200
(benchmarks/results/h200-2026-12-05-verl-shared/autotune.db), then predicts each phase of the three measured probes
of the 2026-12-03 second study (another day, other configurations; step 2 of benchmarks/results/h200-2026-12-03-
verl-2/, as benchmarks/sim_vs_verl_h200.py reads them) with and without it. Both studies ran one job (Qwen2.5-1.5B
shapes, 32 prompts x 4, 256/512 tokens, KL loss) on the same software (verl 0.9.1, vLLM 0.24, torch 2.11, SDPA):
this checks what carries across studies and configurations; a different job on the profile is the GPU check of
issue 29, not done here.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).parent))

from sim_vs_verl_h200 import PHASES, study_row  # noqa: E402

from autotune.config import ProbeBudget, TuneConfig  # noqa: E402
from autotune.hardware import get_gpu  # noqa: E402
from autotune.model.cost import estimate_step_time  # noqa: E402
from autotune.models import get_model, model_from_identity  # noqa: E402
from autotune.search import node_prior  # noqa: E402
from autotune.search.node_prior import study_rows  # noqa: E402
from autotune.storage.node_profile import NodeKind, NodeProfile, phase_factors, profile_row  # noqa: E402
from autotune.spaces.layout import ParallelLayout  # noqa: E402
from autotune.storage.results import measured_workload, workload_of  # noqa: E402
from autotune.verl.metrics import PROMPT_MEAN_KEY, RESPONSE_MEAN_KEY  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SOURCE_DB = RESULTS / "h200-2026-12-05-verl-shared" / "autotune.db"
HELD_OUT = [("h200-2026-12-03-verl-2", trial) for trial in (0, 1, 2)]


def source_cfg(study: optuna.Study, loop: bool, db: Path = SOURCE_DB) -> TuneConfig:
    """The configuration that prices a stored study's probes as that study did (its identity; `loop`: verl's
    per-token log-prob loop priced), for reading its rows back (search/node_prior.study_rows)."""
    identity = study.user_attrs["identity"]
    return TuneConfig(model=model_from_identity(identity), gpu=get_gpu(identity["gpu"]),
                      gpus_per_node=identity["gpus_per_node"], nodes=identity["nodes"], backend=identity["backend"],
                      trials=0, storage_url=f"sqlite:///{db}", study_name=study.study_name,
                      out_dir=db.parent, seed=0, workload=workload_of(identity), fixed={}, ranges={},
                      tune_workload=(), probe=ProbeBudget(), passthrough=identity.get("passthrough") or {},
                      logprob_loop=loop)


def logged_lengths(db: Path) -> dict[str, float]:
    """Medians of the prompt and response means verl logged over the study's committed launches (runs/*/metrics.jsonl,
    verl's own file logger): for probes stored before autotune kept them in a probe's series (2026-12-08)."""
    values: dict[str, list[float]] = {PROMPT_MEAN_KEY: [], RESPONSE_MEAN_KEY: []}
    for path in sorted(db.parent.glob("runs/*/metrics.jsonl")):
        for line in path.read_text().splitlines():
            data = json.loads(line).get("data", {})
            for key, found in values.items():
                if isinstance(data.get(key), (int, float)):
                    found.append(float(data[key]))
    return {key: statistics.median(found) for key, found in values.items() if found}


def rows_at_lengths(study: optuna.Study, cfg: TuneConfig, lengths: dict[str, float]) -> tuple:
    """search/node_prior.study_rows, each probe priced at the lengths it ran: its own series where it kept them (a
    study recorded since 2026-12-08), else `lengths` (logged_lengths: verl's logs of the study's launches)."""
    def with_logged(workload, attrs):
        series = attrs.get("series") or {}
        if lengths and not any(key in series for key in lengths):
            attrs = {**attrs, "series": {**series, **{key: [value] for key, value in lengths.items()}}}
        return measured_workload(workload, attrs)

    original, node_prior.measured_workload = node_prior.measured_workload, with_logged
    try:
        return study_rows(study, cfg)
    finally:
        node_prior.measured_workload = original


def profile_factors(rows: dict, others: list, probes: int, eager_decode: bool) -> dict[str, float]:
    """measured/predicted per phase of a profile holding one study's rows, as a job of this decode mode reads it
    (storage/node_profile.py: the path a study takes)."""
    kind = NodeKind(gpu="H200", driver="", torch="", vllm="", verl="", attention="sdpa", backend="verl")
    profile = NodeProfile(kind=kind, studies={"source": {"phases": rows, "other_s": others, "probes": probes}})
    return phase_factors(profile.summary(eager_decode))


def check(study: optuna.Study, loop: bool) -> None:
    rows, others, probes = rows_at_lengths(study, source_cfg(study, loop), logged_lengths(SOURCE_DB))
    factor = profile_factors(rows, others, probes, eager_decode=True)  # the held-out probes run vLLM eager too
    print(f"profile from {SOURCE_DB.relative_to(RESULTS.parent.parent)}: {probes} measured probes")
    for phase in PHASES:
        r = rows.get(profile_row(phase, True), [])
        if r:
            print(f"  {phase:15s} measured/predicted x{factor[phase]:.2f} (median of {len(r)}; range "
                  f"x{math.exp(min(r)):.2f}-x{math.exp(max(r)):.2f})")
    print(f"  outside the phases: median {statistics.median(others):.1f} s per step" if others else "")
    print()
    print("held-out probes, step 2: predicted/measured per phase, without the profile -> with it")
    worst = {"without": [], "with": []}
    model, gpu = get_model("qwen2.5-1.5b"), get_gpu("H200")
    for folder, trial in HELD_OUT:
        m, workload, cand = study_row(folder, trial)
        layout = ParallelLayout.of(cand, workload, gpus_per_node=1, nodes=1)
        # the held-out job runs vLLM eager (run_tiny_grpo.sh), as the profile's study does (its passthrough)
        step = estimate_step_time(model, gpu, workload, cand, layout, logprob_loop=loop, vllm_eager=True)
        cells = []
        for phase in PHASES:
            measured = m[f"timing_s/{phase}"]
            bare = step.phase_s[phase] / measured
            fixed = bare * factor.get(phase, 1.0)
            worst["without"].append(max(bare, 1 / bare))
            worst["with"].append(max(fixed, 1 / fixed))
            cells.append(f"{phase} {bare:.2f}->{fixed:.2f}")
        print(f"  {folder.removeprefix('h200-2026-12-03-')} trial {trial}: " + ", ".join(cells))
    for label, values in worst.items():
        within = sum(v <= 1.25 for v in values)
        print(f"{label:8s} the profile: phases within 1.25x {within}/{len(values)}, worst x{max(values):.2f}, "
              f"median error x{statistics.median(values):.2f}")


def main() -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{SOURCE_DB}"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    print("## the time model without the per-token log-prob loop (as for a node with flash-attn)")
    check(study, loop=False)
    print()
    print("## the time model told what the node was: no flash-attn, verl's per-token log-prob loop priced")
    check(study, loop=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
