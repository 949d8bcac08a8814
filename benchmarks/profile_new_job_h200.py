"""A new job's first launch predicted from the node profile another job's study left (issue 29's GPU check).

    PYTHONPATH=. python benchmarks/profile_new_job_h200.py benchmarks/results/<run>/other/autotune.db [SEED_DB]

The study (benchmarks/verl_h200/run_other_grpo.sh, tune_other.yaml) stored the profile it started from
(search/node_prior.PROFILE_ATTR: per phase the median of log measured/predicted over the earlier study's probes).
For each measured configuration of its first launch, every phase's prediction without the profile (the time model
alone, with verl's per-token log-prob loop priced as on that node) and with it (the profile's factor), against
what verl measured. With SEED_DB (the database of the study the profile was learned from), also the profile this
autotune learns from that study now (search/node_prior.study_rows, storage/node_profile.NodeProfile), for a change
in how profiles are kept. No GPU needed: everything is read from the studies' databases.
"""

from __future__ import annotations

import math
import statistics
import sys

from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.search.learned import base_prediction
from autotune.spaces.candidate import Candidate
from autotune.storage.node_profile import PROFILE_ATTR, describe_summary, phase_factors
from autotune.storage.results import measured_workload, workload_of

sys.path.insert(0, str(Path(__file__).parent))
from node_profile_h200 import logged_lengths, profile_factors, rows_at_lengths, source_cfg  # noqa: E402

WITHIN = 1.25


def load(db: str) -> optuna.Study:
    url = f"sqlite:///{db}"
    return optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)


def relearned(seed_db: str, eager_decode: bool) -> dict[str, float]:
    """The profile's factors this autotune learns from the seed study, as a study of a job in this decode mode
    reads them: each probe priced at the lengths it ran (search/node_prior.py), read from verl's logs where the
    study's probes predate keeping them."""
    seed = load(seed_db)
    lengths = logged_lengths(Path(seed_db))
    if lengths:
        print("seed study's lengths as verl logged them: " + ", ".join(f"{k} {v:.1f}" for k, v in lengths.items()))
    rows, others, probes = rows_at_lengths(seed, source_cfg(seed, loop=True, db=Path(seed_db)), lengths)
    return profile_factors(rows, others, probes, eager_decode)


def main(db: str, seed_db: str | None = None) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load(db)
    cfg = source_cfg(study, loop=True, db=Path(db))
    summary = study.user_attrs.get(PROFILE_ATTR)
    print("stored:", describe_summary(summary))
    profiles = {"with": phase_factors(summary)}
    if seed_db:
        profiles["now"] = relearned(seed_db, cfg.vllm_eager)
        print("this autotune:", ", ".join(f"{p} x{f:.2f}" for p, f in sorted(profiles["now"].items())),
              f"({'eager' if cfg.vllm_eager else 'CUDA graphs'} decoding, as this job's)")
    errors: dict[str, list[float]] = {"without": [], **{label: [] for label in profiles}}
    # the prediction a study makes before its first probe is at its workload's assumed lengths; priced at the lengths
    # the probe then ran (verl's logs of this study's launch), what is left is the node's and the model's error alone
    ran = logged_lengths(Path(db)) if "now" in profiles else {}
    if ran:
        print("this study's lengths as verl logged them: " + ", ".join(f"{k} {v:.1f}" for k, v in ran.items()))
        errors["ran"] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        attrs = t.user_attrs
        if attrs.get("state") != "measured" or not attrs.get("phase_s"):
            continue
        workload = workload_of(study.user_attrs["identity"], attrs)
        base = base_prediction(cfg, Candidate.from_params(attrs["candidate"]), workload)
        at_ran = base_prediction(cfg, Candidate.from_params(attrs["candidate"]),
                                 measured_workload(workload, {"series": {k: [v] for k, v in ran.items()}}))
        print(f"trial {t.number} ({attrs.get('label') or 'member of trial ' + str(attrs.get('launch_group'))}): "
              f"step {attrs.get('step_s', 0):.1f} s measured")
        for phase, measured_s in sorted(attrs["phase_s"].items()):
            predicted_s = base.phase_s.get(phase)
            if not predicted_s or not measured_s:
                continue
            line = (f"  {phase:15s} measured {measured_s:6.2f} s  predicted {predicted_s:6.2f} s "
                    f"(x{predicted_s / measured_s:.2f})")
            errors["without"].append(math.exp(abs(math.log(predicted_s / measured_s))))
            for label, factors in profiles.items():
                with_s = predicted_s * factors.get(phase, 1.0)
                errors[label].append(math.exp(abs(math.log(with_s / measured_s))))
                line += f"  {label} {with_s:6.2f} s (x{with_s / measured_s:.2f})"
            if ran:
                ran_s = at_ran.phase_s[phase] * profiles["now"].get(phase, 1.0)
                errors["ran"].append(math.exp(abs(math.log(ran_s / measured_s))))
                line += f"  now at its lengths {ran_s:6.2f} s (x{ran_s / measured_s:.2f})"
            print(line)
    names = {"without": "without the profile", "with": "with the stored profile",
             "now": "with this autotune's profile", "ran": "... priced at the lengths it ran"}
    for label, values in errors.items():
        if values:
            print(f"{names[label]:32s}: phases within {WITHIN}x {sum(v <= WITHIN for v in values)}/{len(values)}, "
                  f"worst x{max(values):.2f}, median error x{statistics.median(values):.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: profile_new_job_h200.py STUDY_DB [SEED_DB]")
    sys.exit(main(*sys.argv[1:]))
