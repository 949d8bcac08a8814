"""How slow or fast each launch of a stored real study ran, as the corrected model reads it (issue 34).

    PYTHONPATH=. python benchmarks/launch_effects.py <autotune.db> [...]

The corrected model (search/learned.py) holds one random effect per launch, shared by every phase of every
configuration the launch measured; its posterior mean (phase_gp.shared_effects) says how much slower or faster than
the model's expectation that launch ran, after what the other launches measured. Beside it, each launch's repeat of
its first configuration where it timed one (the step-to-step spread inside a launch, backends/verl/shared_launch.py).
No GPU needed: everything is read from the study's database, priced as the study priced it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import optuna

from autotune.search.learned import CorrectedModel
from autotune.search.phase_gp import NOISE_REL

sys.path.insert(0, str(Path(__file__).parent))
from node_profile_h200 import source_cfg  # noqa: E402
from profile_new_job_h200 import load  # noqa: E402


def _label(key: tuple) -> str:
    """A launch as storage/tuning_cost.launch_of names it: (run folder, trials) of a shared one, ("trial", n) of one
    configuration's own (CorrectedModel.launch_effects adds ("observation", i) for one it was given without)."""
    if key[0] in ("trial", "observation"):
        return f"{key[0]} {key[1]} (a launch of its own)"
    return f"launch of trials {list(key[1])}"


def main(dbs: list[str]) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for db in dbs:
        study = load(db)
        trials = study.get_trials(deepcopy=False)
        model = CorrectedModel.from_trials(trials, source_cfg(study, loop=True, db=Path(db)), study)
        print(f"{db}: a probe's noise {model.noise_rel:.3f} in log time per phase, of which the launch's "
              f"{math.sqrt(max(model.noise_rel ** 2 - NOISE_REL ** 2, 0)):.3f}")
        if not model.launch_effects:
            print("  no launch effect: the study's probes are taken as exact (its backend deterministic, or a study "
                  "stored before noisy probes were marked)")
            continue
        spread = {}
        for t in trials:
            launch = t.user_attrs.get("launch") or {}
            if launch.get("repeat_spread") is not None:
                spread[tuple(launch.get("trials") or ())] = launch["repeat_spread"]
        for key, effect in sorted(model.launch_effects.items(), key=lambda kv: str(kv[0])):
            print(f"  {_label(key)}: read as x{math.exp(effect):.3f}"
                  + (f"; its first configuration's repeat {100 * spread[key[1]]:.1f}% apart"
                     if key[1] in spread else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
