"""The command line as a user runs it: run -> storage -> export -> verl composition, and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.cli import main

RESULT_KEYS = {"backend", "model", "gpus", "nodes", "study", "storage", "trials_total", "trials_complete",
               "trials_failed_oom", "trials_rejected_before_launch", "simulated", "best"}


def _run(*args):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    proc = _run("run", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(out), "--seed", "7")
    return proc, out


def test_run_with_no_gpu_simulates_and_exports(default_run):
    proc, out = default_run
    assert proc.returncode == 0, proc.stderr
    # issue 17: the first line says what is assumed (model and shapes source, GPU, count, workload)
    assert proc.stdout.splitlines()[0].startswith("model Qwen/Qwen2.5-7B-Instruct (shapes from")
    assert proc.stdout.splitlines()[1] == "no GPU found: simulating with the calibrated model"
    assert "SIMULATED" in proc.stdout and "verl default" in proc.stdout
    doc = json.loads((out / "result.json").read_text())
    assert RESULT_KEYS <= set(doc)
    assert doc["backend"] == "sim" and doc["simulated"] is True and doc["trials_total"] == 40
    assert doc["gpus"] == 8 and doc["nodes"] == 1 and doc["storage"].startswith("sqlite:///")
    assert doc["trials_complete"] + doc["trials_failed_oom"] + doc["trials_rejected_before_launch"] \
        + doc["trials_pruned"] + doc["trials_failed"] == 40
    assert set(doc["best"]) >= {"trial", "params", "tokens_per_s_per_gpu", "mfu", "peak_mem_gib"}
    assert doc["best"]["tokens_per_s_per_gpu"] >= doc["baseline"]["tokens_per_s_per_gpu"]
    best_yaml = (out / "best.yaml").read_text()
    assert "simulated: true" in best_yaml and "SIMULATED" in best_yaml


@pytest.mark.verl
def test_exported_best_yaml_is_accepted_by_verl(default_run):
    from autotune.spaces.candidate import Candidate
    from autotune.verl.compose import compose_exported, select

    _, out = default_run
    cfg = compose_exported(out / "best.yaml")
    best = Candidate.from_params(json.loads((out / "result.json").read_text())["best"]["params"])
    assert select(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size") == best.rollout_tp
    assert select(cfg, "actor_rollout_ref.actor.use_dynamic_bsz") == best.use_dynamic_bsz
    assert select(cfg, "data.train_batch_size") == 1024 and select(cfg, "actor_rollout_ref.rollout.n") == 5


def test_second_run_resumes_the_same_study(default_run):
    _, out = default_run
    proc = _run("run", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(out), "--trials", "45", "--quiet")
    assert proc.returncode == 0, proc.stderr
    study = optuna.load_study(study_name="qwen2.5-7b-1x8-sim", storage=f"sqlite:///{out / 'autotune.db'}")
    assert len(study.trials) == 45


def test_show_and_export_read_the_stored_study(default_run, tmp_path):
    _, out = default_run
    (out / "best.yaml").unlink()
    assert main(["export", "--out", str(out)]) == 0
    assert (out / "best.yaml").is_file()
    shown = _run("show", "--out", str(out))
    assert shown.returncode == 0 and "verl's default configuration" in shown.stdout
    # every stored trial is a row, with its state (rejected and OOM trials too, whichever this search produced)
    study = optuna.load_study(study_name="qwen2.5-7b-1x8-sim", storage=f"sqlite:///{out / 'autotune.db'}")
    rows = [line for line in shown.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == len(study.trials)
    for t, row in zip(sorted(study.trials, key=lambda t: t.number), rows):
        assert row.split("│")[1].split()[0] == str(t.number) and t.user_attrs["state"] in row


def test_models_lists_shapes():
    proc = _run("models")
    assert proc.returncode == 0 and "qwen2.5-7b" in proc.stdout and "qwen3-30b-a3b" in proc.stdout


def test_help_names_every_command():
    proc = _run("--help")
    assert all(cmd in proc.stdout for cmd in ("run", "models", "show", "export"))


@pytest.mark.parametrize("args, message", [
    (["run", "--model", "gpt-5", "--gpus", "8"], "unknown model 'gpt-5'"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "0"], "--gpus must be at least 1"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "eight"], "expected a whole number"),
    (["run", "--model", "qwen2.5-72b", "--gpus", "1"], "cannot run on 1 x 1 H200"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--backend", "torch"], "torch backend"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--backend", "verl"], "verl backend"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--backend", "tpu"], "unknown backend"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--storage", "nonsense"], "not a database URL"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--storage", "sqlite:////no/such/dir/x.db"], "does not exist"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--study", "a b"], "--study must be"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--trials", "0"], "must be at least 1"),
    (["run", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "V100"], "unknown GPU type"),
    (["run", "--gpus", "8"], "--model is required"),
    (["show"], "no study database"),
    (["export"], "no study database"),
])
def test_bad_input_is_one_line_exit_2_and_stores_nothing(tmp_path, args, message):
    out = tmp_path / "o"
    proc = _run(*args, "--out", str(out)) if args[0] in ("run", "show", "export") else _run(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (out / "autotune.db").exists()


def test_malformed_tune_yaml(tmp_path):
    bad = tmp_path / "tune.yaml"
    bad.write_text("workload: {train_batch_size: [1, 2]\n")
    proc = _run("run", "--model", "qwen2.5-7b", "--gpus", "8", "--config", str(bad), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "o" / "autotune.db").exists()


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _run("run", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(blocker / "sub"))
    assert proc.returncode == 2 and "not a writable folder" in proc.stderr


def test_export_of_a_study_with_no_feasible_trial_is_refused(tmp_path):
    from autotune.config import ProbeBudget, TuneConfig
    from autotune.hardware import get_gpu
    from autotune.models import get_model
    from autotune.search.driver import open_study
    from autotune.workload import Workload

    out = tmp_path / "o"
    out.mkdir()
    cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                     trials=1, storage_url=f"sqlite:///{out / 'autotune.db'}", study_name="empty", out_dir=out,
                     seed=0, workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())
    open_study(cfg)
    proc = _run("export", "--out", str(out))
    assert proc.returncode == 2 and "no finished feasible trial" in proc.stderr


def test_run_says_which_knobs_the_backend_holds_off(tmp_path, monkeypatch, capsys):
    """A real backend without liger-kernel holds use_liger at False: the user is told, the export agrees."""
    from autotune.backends import base
    from autotune.backends.sim import SimRunner

    class SimWithoutLiger(SimRunner):  # test double: the sim standing in for a backend lacking a package
        def held_off(self):
            return {"use_liger": False}

    monkeypatch.setattr(base, "get_runner", lambda name: SimWithoutLiger())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "out"
    assert main(["run", "--model", "qwen2.5-1.5b", "--gpus", "1", "--trials", "6", "--out", str(out), "--quiet"]) == 0
    assert "held off, their package is not installed here: use_liger=False" in capsys.readouterr().out
    assert "use_liger: false" in (out / "best.yaml").read_text()


def test_run_says_what_the_backend_measures_and_a_pin_outside_it_is_one_line(tmp_path, monkeypatch, capsys):
    """A backend that measures FSDP only (the torch backend, here a sim test double) narrows the engine choice."""
    from autotune.backends import base
    from autotune.backends.sim import SimRunner

    class SimMeasuringFsdpOnly(SimRunner):
        def measurable_choices(self):
            return {"actor_engine": ("fsdp", "fsdp2")}

    monkeypatch.setattr(base, "get_runner", lambda name: SimMeasuringFsdpOnly())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    out = tmp_path / "out"
    assert main(["run", "--model", "qwen2.5-1.5b", "--gpus", "1", "--trials", "6", "--out", str(out), "--quiet"]) == 0
    assert "backend measures only: actor_engine in fsdp, fsdp2" in capsys.readouterr().out
    tune = tmp_path / "tune.yaml"
    tune.write_text("fixed:\n  actor_engine: megatron\n")
    assert main(["run", "--model", "qwen2.5-1.5b", "--gpus", "1", "--trials", "2", "--out", str(tmp_path / "o2"),
                 "--quiet", "--config", str(tune)]) == 2
    err = capsys.readouterr().err
    assert "cannot measure actor_engine='megatron'" in err and "Traceback" not in err


def test_host_mem_gib_keeps_offload_within_the_nodes_ram(tmp_path):
    """A sim study for an 8-GPU node with little RAM (128 GiB): candidates whose offload overflows it are rejected."""
    out = tmp_path / "out"
    # TPE alone (no model picks, which never propose a predicted host OOM): its random start proposes offload
    tune = tmp_path / "tune.yaml"
    tune.write_text("search: {warm_start: 0, learn: false}\n")
    proc = _run("run", "--model", "qwen2.5-7b", "--gpus", "8", "--out", str(out), "--trials", "12", "--seed", "1",
                "--host-mem-gib", "128", "--quiet", "--config", str(tune))
    assert proc.returncode == 0, proc.stderr
    assert "host memory: 128 GiB per node; offloaded states must fit in 90% of it" in proc.stdout
    study = optuna.load_study(study_name="qwen2.5-7b-1x8-sim", storage=f"sqlite:///{out / 'autotune.db'}")
    host = [t for t in study.trials if "predicted host OOM" in t.user_attrs.get("reason", "")]
    assert host and all(not t.user_attrs.get("launched") for t in host)
    assert all(t.user_attrs["predicted_host_gib"] <= 0.9 * 128 for t in study.trials
               if t.user_attrs.get("state") == "simulated")


# ---- issue 32 item 7: smaller defects ------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["run", "--model", "qwen2.5-7b", "--gpu", "8"],
                                  ["estimate", "--model", "qwen2.5-7b", "--gpu", "8"]])
def test_a_gpu_count_given_as_the_gpu_type_is_named(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith("did you mean --gpus 8?"), err


def test_train_with_a_missing_config_says_it_is_missing(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "not an exported best.yaml" not in err


def test_install_hints_work_from_a_source_checkout():
    """The PyPI name installs the published release; from this checkout, the checkout's folder is what installs."""
    import autotune
    from autotune.errors import install_hint
    from autotune.backends.select import EXTRAS

    root = Path(autotune.__file__).resolve().parents[1]
    assert install_hint("dashboard") == f"pip install '{root}[dashboard]'"
    assert EXTRAS["verl"] == f"pip install '{root}[verl]'"


def test_the_export_names_the_package_a_chosen_knob_needs():
    from autotune.models import get_model
    from autotune.spaces.candidate import Candidate
    from autotune.verl.export import export_header

    def header(candidate):
        return "\n".join(export_header(model=get_model("qwen2.5-7b"), gpu_name="H200", gpus_per_node=8, nodes=1,
                                       backend="sim", simulated=True, study="s", trial=3, tokens_per_s_per_gpu=1.0,
                                       mfu=None, peak_mem_gib=1.0, baseline_tokens_per_s_per_gpu=None,
                                       tuned_workload_knobs=(), config_dir=Path("."), candidate=candidate))

    assert "use_liger: true needs the liger-kernel package" in header(Candidate(use_liger=True))
    assert "liger-kernel" not in header(Candidate(use_liger=False))
