"""`--from` on every verl launch script in tests/data/verl_examples: it imports, or one line names every key it
cannot read; and the baseline trial is the script's own value for every system knob the script sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.verl.export import verl_overrides
from autotune.verl.job_import import hydra_value, user_job
from autotune.verl.judge import script_model
from autotune.verl.keys import BY_KEY, NOT_IN_VERL, WORKLOAD_FIELDS, active_knobs_for
from autotune.verl.launch_script import import_launch_script

EXAMPLES = Path(__file__).parents[1] / "data" / "verl_examples"
SCRIPTS = sorted(EXAMPLES.glob("*.sh"))


def _knob_keys(imported, job):
    """(key, script value) for every system knob the script sets that this job searches."""
    engine = job.baseline.actor_engine
    active = active_knobs_for(job.workload, engine)
    for key, text in imported.resolved_overrides().items():
        row = BY_KEY.get(key.lstrip("+"))
        if row is None or row.kind != "knob" or not row.field or row.field in WORKLOAD_FIELDS:
            continue
        if row.field == "actor_engine" or row.field not in active or engine not in row.engines:
            continue
        yield row, hydra_value(row.verl_key, text)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_imports_or_names_every_unreadable_key_at_once(path):
    imported = import_launch_script(path, {"HOME": "/home/user"})
    try:
        job = user_job(imported, model_name=script_model(path))
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message
        shell = [k for k, v in imported.overrides.items() if ("$" in v or "`" in v) and BY_KEY.get(k)
                 and BY_KEY[k].field and BY_KEY[k].field not in ("train_files", "val_files")]
        if "not readable statically" in message:
            assert all(k in message for k in shell), (shell, message)
        else:  # a model outside the table (gpt-oss, Qwen3-30B-A3B-Base) or verl's own placeholder
            # (with model identity, a local model folder that is not on this machine is named as such)
            assert any(s in message for s in ("unknown model", "model.path", "model folder", "config.json")), message
        return
    dropped = [k for k in imported.overrides if k.lstrip("+") in NOT_IN_VERL]
    assert all(any(d in u for u in job.unresolved) for d in dropped)
    for row, value in _knob_keys(imported, job):
        expected = row.from_verl(value, {}) if row.from_verl else value
        assert getattr(job.baseline, row.field) == pytest.approx(expected), row.verl_key
        exported = verl_overrides(job.model, job.workload, job.baseline, gpus_per_node=job.gpus_per_node or 8,
                                  nodes=job.nodes or 1, passthrough=job.passthrough)
        if row.verl_key in exported:  # the user's recompute keys or an alias may stand in its place
            out = exported[row.verl_key]
            assert (row.from_verl(out, {}) if row.from_verl else out) == pytest.approx(expected), row.verl_key


def test_every_script_imports_with_the_values_its_error_asks_for():
    from autotune.verl.judge import import_script, script_model

    for path in SCRIPTS:
        imported, _ = import_script(path, model_name=script_model(path))
        assert not imported.unresolved_keys, path.name


@pytest.mark.parametrize("name, args", [("run_qwen3moe-30b_megatron_96gb.sh", ["data.val_files=/data/aime24.parquet"]),
                                        ("run_qwen3-235b_megatron_96gb.sh", [])])
def test_an_eager_rollout_is_kept_and_the_import_says_the_model_prices_cuda_graphs(name, args):
    """verl's own scripts that set rollout.enforce_eager=True (with the value the 30B script's import asks for): the
    key passes through unchanged, and the first lines say that the time model prices vLLM's decode with CUDA graphs
    (the eager H200 recipe job: gen 3-4x the model)."""
    path = EXAMPLES / name
    imported = import_launch_script(path, {"HOME": "/home/user"}).with_arguments(args)
    job = user_job(imported, model_name=script_model(path))
    assert job.passthrough.get("actor_rollout_ref.rollout.enforce_eager") is True
    assert any(n.startswith("rollout.enforce_eager=True: kept") for n in job.notes), job.notes
