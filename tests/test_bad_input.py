"""Bad input, as a user types it: one clear line on stderr, exit code 2, nothing written to the study (issue 7).

Runs the real CLI in a subprocess against an output folder that already holds a study, and checks the
study's trials are untouched after every case.
"""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import load_tune_yaml
from autotune.errors import ConfigError
from autotune.models import get_model
from autotune.spaces.space import SearchSpace

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
RUN = ["run", "--model", "qwen2.5-1.5b", "--gpus", "8"]


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=ENV,
                          timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def existing(tmp_path_factory):
    out = tmp_path_factory.mktemp("existing")
    proc = _cli(*RUN, "--backend", "sim", "--trials", "6", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


def _trials(out: Path) -> list:
    study = optuna.load_study(study_name="qwen2.5-1.5b-1x8-sim", storage=f"sqlite:///{out / 'autotune.db'}")
    return [(t.number, t.state, t.params) for t in study.trials]


YAMLS = {
    "broken_yaml": "workload: {train_batch_size: 8\n",
    "not_a_mapping": "- 1\n- 2\n",
    "unknown_top_key": "wrkload: {}\n",
    "unknown_workload_key": "workload: {batch: 8}\n",
    "wrong_type": "workload: {rollout_n: five}\n",
    "negative": "workload: {max_response_length: -1}\n",
    "mini_over_train": "workload: {train_batch_size: 8, ppo_mini_batch_size: 16}\n",
    "unknown_fixed_knob": "fixed: {tensor_parallel: 2}\n",
    "fixed_wrong_type": "fixed: {gradient_checkpointing: 'yes'}\n",
    "fixed_impossible_tp": "fixed: {actor_engine: megatron, actor_tp: 3}\n",
    "megatron_knob_without_engine": "fixed: {actor_pp: 2}\n",
    "range_empty": "ranges: {ppo_micro_batch_size_per_gpu: []}\n",
    "range_backwards": "ranges: {gpu_memory_utilization: {low: 0.9, high: 0.2}}\n",
    "range_out_of_bounds": "ranges: {gpu_memory_utilization: {low: 0.5, high: 1.5}}\n",
    "range_bad_step": "ranges: {gpu_memory_utilization: {low: 0.4, high: 0.6, step: 0}}\n",
    "range_never_valid": "ranges: {rollout_tp: [3]}\n",
    "tune_learning_rate": "tune_workload: [learning_rate]\n",
    "workload_range_without_opt_in": "ranges: {ppo_mini_batch_size: [64, 128]}\n",
    "bad_objective": "search: {objective: fastest}\n",
    "bad_budget": "budget: {probes: 0}\n",
    "unknown_budget_key": "budget: {hours: 3}\n",
    "probe_zero_steps": "probe: {timed_steps: 0}\n",
    # issue 20: hangs, tracebacks and wrong acceptances found by fault injection
    "range_nan": "ranges: {gpu_memory_utilization: {low: .nan, high: 0.8}}\n",
    "range_inf_step": "ranges: {gpu_memory_utilization: {low: 0.4, high: 0.8, step: .inf}}\n",
    "choices_nan": "ranges: {gpu_memory_utilization: [0.5, .nan]}\n",
    "budget_nan_gpu_hours": "budget: {gpu_hours: .nan}\n",
    "budget_inf_wall_time": "budget: {wall_time_s: .inf}\n",
    "probe_1e8_steps": "probe: {timed_steps: 100000000}\n",
    "train_batch_1e32": "workload: {train_batch_size: 100000000000000000000000000000000}\n",
    "deeply_nested": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "alias_bomb": "fixed:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"  {k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcde", "bcdef")),
}

RAW_CONFIGS = {
    "not_utf8": b"model: qwen2.5-7b\n# \xff\xfe\n",
    "too_big": b"# " + b"x" * (1 << 20) + b"\n",
}


@pytest.mark.parametrize("name", sorted(RAW_CONFIGS))
def test_bad_tune_yaml_bytes(existing, tmp_path, name):
    config = tmp_path / "tune.yaml"
    config.write_bytes(RAW_CONFIGS[name])
    proc = _cli(*RUN, "--backend", "sim", "--out", str(existing), "--config", str(config))
    assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("autotune: error: ")


SCRIPTS = {
    "not_utf8": b"#!/bin/bash\n# \xff\xfe\npython3 -m verl.trainer.main_ppo data.train_batch_size=8\n",
    # $(( )) evaluates to more than 4300 digits: Python refuses to print such an int
    "arith_4300_digits": b"#!/bin/bash\nA=$((99999999999999999999*99999999999999999999))\n"
                         b"python3 -m verl.trainer.main_ppo data.train_batch_size=$((" + b"*".join([b"A"] * 300)
                         + b")) actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n",
    # issue 33: bounds on what --from reads, each refused in one line naming the bound
    "doubling_chain.sh": b"A=" + b"x" * 1000 + b"\n" + b"A=$A$A\n" * 40 + b"python3 -m verl.trainer.main_ppo a=$A\n",
    "long_line.sh": b"python3 -m verl.trainer.main_ppo data.train_files=" + b"x" * 100_000 + b"\n",
    "big_file.sh": b"python3 -m verl.trainer.main_ppo data.train_files=" + b"x" * 20_000_000 + b"\n",
    "alias_bomb.yaml": b"a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + b"".join(
        f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n".encode() for p, k in zip("abcdef", "bcdefg")),
    "interpolation.yaml": b"data:\n  train_batch_size: ${oops\n",
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_bad_launch_script(tmp_path, name):
    script = tmp_path / (name if "." in name else "run.sh")
    script.write_bytes(SCRIPTS[name])
    proc = _cli("run", "--from", str(script), "--gpus", "8", "--backend", "sim", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", sorted(YAMLS))
def test_bad_tune_yaml(existing, tmp_path, name):
    config = tmp_path / "tune.yaml"
    config.write_text(YAMLS[name])
    before = _trials(existing)
    proc = _cli(*RUN, "--backend", "sim", "--out", str(existing), "--config", str(config))
    assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("autotune: error: ")
    assert _trials(existing) == before


ARGS = {
    "unknown_model": ["run", "--model", "gpt-5", "--gpus", "8"],
    "zero_gpus": ["run", "--model", "qwen2.5-1.5b", "--gpus", "0"],
    "negative_nodes": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--nodes", "-1"],
    "gpus_not_a_number": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8.5"],
    "model_too_big": ["run", "--model", "qwen2.5-72b", "--gpus", "1"],
    "unknown_gpu": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--gpu", "T4"],
    "unknown_backend": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "jax"],
    "verl_without_verl": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--backend", "verl"],
    "url_garbage": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "::::"],
    "url_unknown_dialect": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "oracle+nope://x/y"],
    "url_cannot_connect": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage",
                           "postgresql+psycopg://u:p@127.0.0.1:1/db"],
    "url_missing_folder": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "sqlite:////nope/a.db"],
    "bad_study_name": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--study", "../etc"],
    "trials_zero": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--trials", "0"],
    "host_mem_zero": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--host-mem-gib", "0"],
    "host_mem_not_a_number": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--host-mem-gib", "lots"],
    "missing_config_file": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--config", "/nope/tune.yaml"],
    "unknown_command": ["tune"],
    "unknown_flag": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--fast"],
    "show_unknown_study": ["show", "--study", "nope"],
    "export_unknown_study": ["export", "--study", "nope"],
    "train_missing_config": ["train", "--config", "/nope/best.yaml"],
    "train_bad_override": ["train", "--config", "__EXISTING__/best.yaml", "not-an-override"],
    "seed_over_2_32": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--seed", "99999999999"],
    "seed_negative": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--seed", "-1"],
    "url_port_not_a_number": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage",
                              "postgresql+psycopg://u:secretpw@127.0.0.1:abc/db"],
    "url_password_unknown_dialect": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage",
                                     "oracle+nope://u:secretpw@h/db"],
    "url_password_in_query": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage",
                              "postgresql+psycopg://u@127.0.0.1:1/db?password=secretpw"],
    "url_password_in_query_unknown_dialect": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage",
                                              "oracle+nope://u@h/db?password=secretpw"],
    # issue 33: empty names fell back to defaults, an in-memory study, files that are no database, a path too long
    "gpu_empty": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--gpu", ""],
    "study_empty": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--study", ""],
    "show_study_empty": ["show", "--study", ""],
    "dashboard_storage_empty": ["dashboard", "--storage", ""],
    "report_study_empty": ["report", "--study", ""],
    "report_storage_empty": ["report", "--storage", ""],
    "worker_study_empty": ["worker", "--study", "", "--storage", "sqlite:///x.db"],
    "worker_storage_empty": ["worker", "--study", "s", "--storage", ""],
    "host_mem_1e-300": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--host-mem-gib", "1e-300"],
    "url_sqlite_in_memory": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "sqlite:///"],
    "url_sqlite_in_proc": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "sqlite:////proc/x.db"],
    "url_journal_dev_null": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--storage", "journal:///dev/null"],
    "model_5000_characters": ["run", "--model", "x" * 5000, "--gpus", "8"],
    "model_path_too_long": ["run", "--model", "/" + "y" * 300 + "/m", "--gpus", "8"],
    "gpus_ten_billion": ["run", "--model", "qwen2.5-1.5b", "--gpus", "10000000000"],
    "nodes_ten_billion": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--nodes", "10000000000"],
    "config_dev_zero": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--config", "/dev/zero"],
    "study_with_newline": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--study", "abc\n"],
    "out_empty": ["run", "--model", "qwen2.5-1.5b", "--gpus", "8", "--out", ""],
    "resume_other_job": ["run", "--model", "qwen2.5-1.5b", "--gpus", "4", "--study", "qwen2.5-1.5b-1x8-sim"],
}


@pytest.mark.parametrize("name", sorted(ARGS))
def test_bad_invocation(existing, name):
    args = [a.replace("__EXISTING__", str(existing)) for a in ARGS[name]]
    if args[0] in ("run", "show", "export", "report", "dashboard") and "--out" not in args:
        args += ["--out", str(existing)]
    if args[0] == "run" and "--backend" not in args:
        args += ["--backend", "sim"]
    before = _trials(existing)
    proc = _cli(*args)
    assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "secretpw" not in proc.stderr + proc.stdout  # a storage URL's password is never printed
    assert _trials(existing) == before


def test_a_rejected_run_leaves_no_out_folder_it_created(tmp_path):
    """Refused input leaves no trace (issue 33: three rejected inputs left an empty --out folder)."""
    for args in (["--model", "gpt-5"], ["--model", "qwen2.5-72b", "--gpus", "1"], ["--storage", "oracle+nope://h/db"]):
        out = tmp_path / "new" / "out"
        proc = _cli("run", "--gpus", "8", "--model", "qwen2.5-1.5b", "--backend", "sim", "--out", str(out), *args)
        assert proc.returncode == 2, proc.stderr
        assert not out.exists(), args


def test_an_out_folder_that_is_not_utf8_is_refused_before_the_study(tmp_path):
    """It crashed the export after the study had run, leaving an empty best.yaml.tmp (issue 33)."""
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/o\xff")
    proc = _cli(*RUN, "--backend", "sim", "--trials", "2", "--out", out)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not UTF-8" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_corpus_is_large_enough():
    assert len(YAMLS) + len(ARGS) >= 30


yaml_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=True)
                           | st.text(max_size=12), lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=12), kids, max_size=4), max_leaves=12)
keys = st.sampled_from(["model", "gpu", "workload", "fixed", "ranges", "tune_workload", "probe", "search", "budget",
                        "other"])
knob_names = st.sampled_from(["actor_tp", "rollout_tp", "gpu_memory_utilization", "max_num_seqs", "use_dynamic_bsz",
                              "ppo_micro_batch_size_per_gpu", "ppo_mini_batch_size", "actor_engine", "nope"])
knob_maps = st.dictionaries(knob_names, yaml_values | st.dictionaries(st.sampled_from(["low", "high", "step"]),
                                                                      yaml_values, max_size=3), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.dictionaries(keys, yaml_values, max_size=5) | yaml_values
       | st.fixed_dictionaries({"fixed": knob_maps, "ranges": knob_maps}))
def test_fuzzed_tune_yaml_never_crashes(tmp_path, doc):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        tune = load_tune_yaml(path)
        SearchSpace.build(get_model("qwen2.5-7b"), tune.workload, gpus_per_node=8, nodes=1, fixed=tune.fixed,
                          ranges=tune.ranges, tune_workload=tune.tune_workload)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300))
def test_fuzzed_raw_text_never_crashes(tmp_path, text):
    path = tmp_path / "raw.yaml"
    path.write_text(text)
    try:
        load_tune_yaml(path)
    except ConfigError:
        pass
