"""Issue 17: the user's own model and job, exactly. Each item through the CLI (`python -m autotune`), sim backend."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.errors import ConfigError
from autotune.model_config import resolve_model, spec_from_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
EXAMPLES = ROOT / "tests" / "data" / "verl_examples"

# Publisher's stated totals (SOURCES.md), in billions, and what our count must reproduce within 1%.
PUBLISHED_B = {
    "Qwen2-7B-Instruct": ("qwen2", 7.62), "Qwen2.5-7B": ("qwen2", 7.61), "Qwen3-8B-Base": ("qwen3", 8.2),
    "Qwen3-30B-A3B-Base": ("qwen3_moe", 30.5), "Llama-3.1-8B": ("llama", 8.03), "Mistral-7B-v0.1": ("mistral", 7.24),
    "Mixtral-8x7B-v0.1": ("mixtral", 46.7), "DeepSeek-V2-Lite": ("deepseek_v2", 15.7),
    "DeepSeek-V3": ("deepseek_v3", 671.0), "gpt-oss-20b": ("gpt_oss", 20.9),
}
ACTIVE_B = {"Qwen3-30B-A3B-Base": 3.3, "Mixtral-8x7B-v0.1": 12.9, "DeepSeek-V3": 37.0}


def cli(*args, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "autotune", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


def one_line_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache and no network: nothing may be downloaded."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return cache


def put_in_cache(cache: Path, hf_id: str, folder: str) -> Path:
    repo = cache / ("models--" + hf_id.replace("/", "--"))
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    shutil.copy(CONFIGS / folder / "config.json", snap / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snap / "config.json"


# ---- item 1/2: shapes from config.json, every supported architecture -------------------------------------

@pytest.mark.parametrize("folder", sorted(PUBLISHED_B))
def test_real_config_json_gives_the_published_parameter_count(folder):
    model_type, billions = PUBLISHED_B[folder]
    spec = resolve_model(str(CONFIGS / folder))
    assert spec.model_type == model_type
    assert spec.param_count() / 1e9 == pytest.approx(billions, rel=0.01)
    if folder in ACTIVE_B:
        assert spec.active_param_count() / 1e9 == pytest.approx(ACTIVE_B[folder], rel=0.05)
    assert spec.model_path == str(CONFIGS / folder)


@pytest.mark.parametrize("folder", sorted(PUBLISHED_B))
def test_reader_agrees_with_transformers_config_class(folder):
    transformers = pytest.importorskip("transformers")
    raw = json.loads((CONFIGS / folder / "config.json").read_text())
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if raw["model_type"] not in mapping:
        pytest.skip(f"this transformers has no {raw['model_type']} config class")
    hf = mapping[raw["model_type"]](**{k: v for k, v in raw.items() if k not in ("auto_map", "quantization_config")})
    spec = resolve_model(str(CONFIGS / folder))
    assert spec.hidden_size == hf.hidden_size and spec.num_layers == hf.num_hidden_layers
    assert spec.num_heads == hf.num_attention_heads and spec.num_kv_heads == hf.num_key_value_heads
    assert spec.vocab_size == hf.vocab_size and spec.tie_word_embeddings == hf.tie_word_embeddings
    if spec.is_mla:
        assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.v_head_dim) == (
            hf.kv_lora_rank, hf.qk_rope_head_dim, hf.v_head_dim)
        assert spec.first_k_dense == hf.first_k_dense_replace and spec.n_shared_experts == hf.n_shared_experts
    elif getattr(hf, "head_dim", None):
        assert spec.head_dim == hf.head_dim
    if spec.is_moe:
        experts = getattr(hf, "num_local_experts", None) or getattr(hf, "n_routed_experts", None) or hf.num_experts
        assert spec.num_experts == experts and spec.num_experts_per_tok == hf.num_experts_per_tok


def test_unsupported_architecture_is_one_line_naming_model_type(tmp_path):
    proc = cli("estimate", "--model", CONFIGS / "Phi-3-mini-4k-instruct", "--gpus", "1")
    line = one_line_error(proc)
    assert "model_type 'phi3' is not supported" in line and "memory and FLOPs model" in line


def test_missing_key_is_named(tmp_path):
    raw = json.loads((CONFIGS / "Mixtral-8x7B-v0.1" / "config.json").read_text())
    del raw["num_local_experts"]
    with pytest.raises(ConfigError, match="lacks num_local_experts"):
        spec_from_config(raw, path="x", source="x/config.json")


def test_local_folder_is_read_and_its_path_exported(tmp_path, offline_cache):
    folder = tmp_path / "my models" / "qwen2-local"
    folder.mkdir(parents=True)
    shutil.copy(CONFIGS / "Qwen2-7B-Instruct" / "config.json", folder / "config.json")
    out = tmp_path / "out"
    proc = cli("run", "--model", folder, "--gpus", 8, "--backend", "sim", "--trials", 3, "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"model {folder} (shapes from its config.json")
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["actor_rollout_ref"]["model"]["path"] == str(folder)
    assert f"# model: {folder};" in (out / "best.yaml").read_text()


def test_missing_folder_is_refused(tmp_path, offline_cache):
    line = one_line_error(cli("run", "--model", tmp_path / "nope", "--gpus", 8, "--backend", "sim",
                              "--out", tmp_path / "o"))
    assert "does not exist" in line
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in one_line_error(cli("estimate", "--model", tmp_path / "empty", "--gpus", 8))


def test_hf_cache_config_is_read_offline(tmp_path, offline_cache):
    config = put_in_cache(offline_cache, "Qwen/Qwen3-30B-A3B-Base", "Qwen3-30B-A3B-Base")
    proc = cli("estimate", "--model", "Qwen/Qwen3-30B-A3B-Base", "--gpus", 8, "--gpu", "H100", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["model_path"] == "Qwen/Qwen3-30B-A3B-Base" and str(config) in doc["shapes_from"]


@pytest.mark.parametrize("given, exported", [
    ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),  # the Base model stays Base
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("qwen2-7b", "Qwen/Qwen2-7B"),  # never Qwen2.5
    ("Qwen/Qwen3-30B-A3B-Base", "Qwen/Qwen3-30B-A3B-Base"),
])
def test_table_fallback_keeps_the_exact_model_and_says_so(tmp_path, offline_cache, given, exported):
    out = tmp_path / "out"
    proc = cli("run", "--model", given, "--gpus", 8, "--backend", "sim", "--trials", 2, "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "built-in table" in proc.stdout.splitlines()[0]
    assert yaml.safe_load((out / "best.yaml").read_text())["actor_rollout_ref"]["model"]["path"] == exported
    assert json.loads((out / "result.json").read_text())["model_path"] == exported


def test_unknown_hf_id_offline_says_how_to_get_its_config(tmp_path, offline_cache):
    line = one_line_error(cli("estimate", "--model", "someorg/SomeModel-7B", "--gpus", 8))
    assert "no config.json for it in the local Hugging Face cache" in line
    assert "huggingface-cli download someorg/SomeModel-7B config.json" in line


def test_mla_and_gpt_oss_models_run_end_to_end(tmp_path, offline_cache):
    for folder, gpus in (("DeepSeek-V2-Lite", 8), ("gpt-oss-20b", 8), ("Mixtral-8x7B-v0.1", 8)):
        out = tmp_path / folder
        proc = cli("run", "--model", CONFIGS / folder, "--gpus", gpus, "--backend", "sim", "--trials", 3,
                   "--out", out, "--quiet")
        assert proc.returncode in (0, 1), proc.stderr  # 1: nothing feasible in 3 trials, still stored
        assert (out / "result.json").is_file()


# ---- item 3/4: the user's job is trial 0, labelled as such ----------------------------------------------

def test_user_job_outside_the_ranges_is_still_trial_0(tmp_path, offline_cache):
    script = EXAMPLES / "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh"  # gpu_memory_utilization=0.2 < 0.3
    out = tmp_path / "out"
    # the script names its run with $(date +%Y%m%d): the import asks for it, and the export keeps what is given
    proc = cli("run", "--from", script, "--backend", "sim", "--trials", 4, "--out", out,
               "--", "trainer.project_name=gsm8k-lora", "trainer.experiment_name=7b-1204")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["baseline"]["trial"] == 0 and doc["baseline_is"] == "your job"
    assert doc["baseline"]["params"]["gpu_memory_utilization"] == pytest.approx(0.2)
    assert doc["speedup_vs_baseline"] > 0
    assert doc["verl_default"]["trial"] == 1  # verl's default differs from the job: measured beside it
    assert "(your job)" in proc.stdout and "vs your job" in proc.stdout and "0 (verl default)" not in proc.stdout
    text = (out / "best.yaml").read_text()
    assert "baseline, your job (trial 0)" in text and "verl default baseline" not in text
    assert "$(" not in text and "experiment_name: 7b-1204" in text  # the name given, never the shell's text


def test_all_unreadable_keys_in_one_message():
    line = one_line_error(cli("estimate", "--from", EXAMPLES / "run_qwen3_8b_fsdp.sh"))
    assert "cannot read 8 key(s) statically, all of them" in line
    for key in ("data.train_batch_size", "data.max_prompt_length", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "actor_rollout_ref.rollout.gpu_memory_utilization"):
        assert key in line


def test_backticks_are_not_exported(tmp_path, offline_cache):
    script = tmp_path / "job.sh"
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo "
                      "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct "
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
                      "trainer.experiment_name=run-`hostname` trainer.n_gpus_per_node=1 trainer.nnodes=1\n")
    out = tmp_path / "out"
    line = one_line_error(cli("run", "--from", script, "--backend", "sim", "--trials", 2, "--out", out))
    assert "rerun with their values after --: -- trainer.experiment_name=VALUE" in line
    proc = cli("run", "--from", script, "--backend", "sim", "--trials", 2, "--out", out, "--",
               "trainer.experiment_name=run-node1")
    assert proc.returncode == 0, proc.stderr
    text = (out / "best.yaml").read_text()
    assert "`" not in text and "experiment_name: run-node1" in text


# ---- item 6: GPUs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, table", [("H100", "H100-80GB"), ("h100", "H100-80GB"),
                                         ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("a100-80gb", "A100-80GB"),
                                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("h20", "H20")])
def test_gpu_aliases(name, table):
    proc = cli("estimate", "--model", "qwen2.5-0.5b", "--gpus", 1, "--gpu", name, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpu"] == table


def test_bare_a100_asks_which():
    assert "40 or 80 GB" in one_line_error(cli("estimate", "--model", "qwen2.5-0.5b", "--gpus", 1, "--gpu", "A100"))


def test_gpus_command_lists_the_table():
    proc = cli("gpus")
    assert proc.returncode == 0 and "H100-80GB" in proc.stdout and "A100-40GB" in proc.stdout
    assert "detected:" in proc.stdout


def test_first_line_states_model_gpu_count_and_workload(tmp_path):
    proc = cli("run", "--model", "qwen2.5-7b", "--gpus", 8, "--backend", "sim", "--trials", 2, "--out", tmp_path)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("model Qwen/Qwen2.5-7B-Instruct (shapes from autotune's built-in table")
    assert "GPU H200" in first and "8 GPUs x 1 node(s)" in first and "train batch 1024" in first


# ---- item 7: why no layout fits ------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [3, 6])
def test_no_layout_says_why_and_what_would(tmp_path, gpus):
    line = one_line_error(cli("run", "--model", "qwen2.5-7b", "--gpus", gpus, "--backend", "sim", "--out", tmp_path))
    assert "mini_batch_divisible_by_dp" in line and "would run" in line
    assert "--gpus" in line.split("would run")[0]


@pytest.mark.parametrize("gpus", [4, 8])
def test_a_model_too_large_for_a_node_is_told_more_nodes_not_a_larger_node(tmp_path, gpus):
    """Issue 32 item 6: 72B on one node of H100s needs a second node; no node holds 16 GPUs."""
    line = one_line_error(cli("run", "--model", "qwen2.5-72b", "--gpus", gpus, "--gpu", "H100-80GB", "--backend",
                              "sim", "--out", tmp_path))
    assert line.endswith("--gpus 8 --nodes 2 would run"), line
    assert "--gpus 16" not in line


def test_more_gpus_than_a_node_holds_is_named_per_node(tmp_path):
    """`--gpus 16 --nodes 2` is 32 GPUs; the run goes on as asked and says what 16 in all would be."""
    proc = cli("run", "--model", "qwen2.5-7b", "--gpus", 16, "--nodes", 2, "--backend", "sim", "--trials", 1,
               "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    note = proc.stdout.splitlines()[1]
    assert note.startswith("note: --gpus counts GPUs per node: 2 node(s) x 16 = 32 GPUs in all")
    assert "16 in all would be --gpus 8 --nodes 2" in note
    quiet = cli("run", "--model", "qwen2.5-7b", "--gpus", 8, "--nodes", 2, "--backend", "sim", "--trials", 1,
                "--out", tmp_path / "b")
    assert "note: --gpus counts" not in quiet.stdout


# ---- item 8: one truth on resume ------------------------------------------------------------------------

def test_resume_status_line_names_the_exported_trial(tmp_path):
    args = ("run", "--model", "qwen2.5-1.5b", "--gpus", 2, "--backend", "sim", "--out", tmp_path, "--seed", 1)
    assert cli(*args, "--trials", 6).returncode == 0
    proc = cli(*args, "--trials", 8)
    assert proc.returncode == 0, proc.stderr
    status = [line for line in proc.stdout.splitlines() if "trials finished" in line]
    assert len(status) == 1 and "none yet" not in proc.stdout
    best_trial = json.loads((tmp_path / "result.json").read_text())["best"]["trial"]
    assert f"(trial {best_trial}, exported)" in status[0]
    assert f"trial {best_trial};" in (tmp_path / "best.yaml").read_text()


def test_no_status_line_before_an_error(tmp_path):
    proc = cli("run", "--model", "qwen2.5-1.5b", "--gpus", 2, "--backend", "sim", "--out", tmp_path,
               "--storage", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert proc.returncode == 2 and "trials finished" not in proc.stdout and "trials done" not in proc.stdout


# ---- item 9: report, estimate, show, legend, export overrides, dashboard -------------------------------

@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    proc = cli("run", "--model", "qwen2.5-7b", "--gpus", 8, "--backend", "sim", "--trials", 8, "--out", out,
               "--seed", 3, "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out


def test_estimate_from_flags_without_from():
    proc = cli("estimate", "--model", "Qwen/Qwen2.5-7B", "--gpus", 8)
    assert proc.returncode == 0, proc.stderr
    assert "verl's default configuration" in proc.stdout and "memory per GPU" in proc.stdout


def test_show_marks_the_best_and_explains_abbreviations(study_dir):
    proc = cli("show", "--out", study_dir)
    best = json.loads((study_dir / "result.json").read_text())["best"]["trial"]
    assert proc.returncode == 0
    assert any(line.split("│")[1].strip() == f"{best} BEST" or line.split("│")[1].strip() == f"{best} * BEST"
               for line in proc.stdout.splitlines() if line.startswith("│"))
    assert "ckpt = gradient checkpointing" in proc.stdout and "o-off" in proc.stdout


def test_export_overrides_are_key_value_lines_verl_reads(study_dir):
    proc = cli("export", "--out", study_dir, "--format", "overrides")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert all("=" in line and " " not in line.split("=", 1)[0] for line in lines)
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct" in lines
    best = yaml.safe_load((study_dir / "best.yaml").read_text())
    micro = best["actor_rollout_ref"]["actor"].get("ppo_micro_batch_size_per_gpu")
    if micro is not None:
        assert f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}" in lines


def test_report_out_is_the_run_folder_as_elsewhere(study_dir, tmp_path):
    proc = cli("report", "--out", study_dir)
    assert proc.returncode == 0, proc.stderr
    assert (study_dir / "report.html").is_file()
    line = one_line_error(cli("report", "--out", tmp_path / "empty"))
    assert "no study database" in line


def test_dashboard_view_does_not_plot_rejected_trials_as_zero(study_dir):
    from autotune.study_tools import dashboard_storage
    from autotune.storage.urls import open_storage

    inner = open_storage(f"sqlite:///{study_dir / 'autotune.db'}")
    view = dashboard_storage(inner)
    study_id = view.get_all_studies()[0]._study_id
    trials = view.get_all_trials(study_id)
    assert all(t.values is None or t.values[0] > 0 for t in trials)
    placeholders = [t for t in inner.get_all_trials(study_id) if t.user_attrs.get("feasible") is False]
    assert all(view.get_trial(t._trial_id).values is None for t in placeholders)


# ---- item 10/11: names --------------------------------------------------------------------------------

def test_distribution_name_and_matplotlib_core():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "verl-autotune" and project["scripts"]["autotune"] == "autotune.__main__:entry"
    assert any(d.startswith("matplotlib") for d in project["dependencies"])
    hints = subprocess.run(["git", "grep", "-n", "autotune\\[", "--", "README.md", "docs", "autotune", "pyproject.toml"],
                           cwd=ROOT, capture_output=True, text=True).stdout
    assert "verl-autotune[torch]" in hints
    assert all("verl-autotune[" in line for line in hints.splitlines() if "pip install" in line), hints


# ---- done when: every verl example script runs or fails with one line listing every reason ------------

@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.sh")))
def test_every_verl_example_runs_from_or_fails_in_one_line(tmp_path, offline_cache, script):
    from autotune.verl.judge import REMEDY_VALUES

    path = EXAMPLES / script
    est = cli("estimate", "--from", path, "--gpu", "H100")
    out = tmp_path / "out"
    run = cli("run", "--from", path, "--backend", "sim", "--trials", 2, "--out", out, "--gpu", "H100", "--quiet")
    remedy = []
    if run.returncode == 2 and "rerun with their values after --" in run.stderr:
        # every reason at once, the estimate's among them (it asks only for what it models), and the rerun to paste
        line = one_line_error(run)
        if est.returncode != 0:
            reasons = one_line_error(est).split("all of them: ", 1)[-1].split("; rerun")[0].split("; ")
            assert all(reason in line for reason in reasons), (reasons, line)
        asked = re.search(r"rerun with their values after --: -- (\S+=VALUE(?: \S+=VALUE)*)", line).group(1)
        keys = [arg.split("=", 1)[0] for arg in asked.split()]
        if not all(key in REMEDY_VALUES for key in keys) or "--model" in line:
            return  # a model path to give by hand (verl's <path_to_dsv3_config>, a folder on its author's machine)
        remedy = ["--", *(f"{key}={REMEDY_VALUES[key]}" for key in keys)]
        run = cli("run", "--from", path, "--backend", "sim", "--trials", 2, "--out", out, "--gpu", "H100", "--quiet",
                  *remedy)
    elif est.returncode != 0:
        line = one_line_error(est)
        assert "all of them" in line or "cannot run on" in line, line
        assert one_line_error(run).split(": ", 2)[-1] == line.split(": ", 2)[-1]  # the same reasons, at once
        return
    if run.returncode == 2:  # e.g. the job cannot run on its own GPUs: one line with the reason
        assert "cannot run on" in one_line_error(run)
        return
    assert run.returncode in (0, 1), run.stderr
    doc = json.loads((out / "result.json").read_text())
    assert doc["baseline_is"] == "your job"
    import optuna

    from autotune.cli import load_user_job
    from autotune.verl.launch_script import import_launch_script

    trial0 = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'autotune.db'}").trials[0]
    assert trial0.user_attrs.get("baseline") and trial0.user_attrs.get("label") == "your job"
    job = load_user_job(path, remedy[1:], None)
    own = job.baseline.as_params()
    assert trial0.params and all(own[k] == pytest.approx(v) for k, v in trial0.params.items()), (
        trial0.params, own)  # every knob the study searches holds the job's own value, not verl's
    imported = import_launch_script(path, os.environ)
    if doc["best"] is not None:
        best = yaml.safe_load((out / "best.yaml").read_text())
        assert best["actor_rollout_ref"]["model"]["path"] == doc["model_path"]
        own = imported.overrides.get("actor_rollout_ref.model.path", "").strip("'\"")
        if "$" not in own:
            assert doc["model_path"] == own


def test_header_names_the_exported_model_path_when_model_gives_only_shapes(tmp_path):
    """--from a script whose model.path is a local folder, with --model naming the shapes (a random-weight model
    built with a known model's shapes): best.yaml trains the folder, and its header says so, not the table's id."""
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=32 "
                      "actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=4 "
                      "actor_rollout_ref.model.path=/models/my-random-qwen trainer.n_gpus_per_node=1 "
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--backend", "sim", "--from", str(script),
                           "--model", "qwen2.5-1.5b", "--gpus", "1", "--trials", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (out / "best.yaml").read_text()
    assert "path: /models/my-random-qwen" in text
    header = next(line for line in text.splitlines() if line.startswith("# model:"))
    assert header.startswith("# model: /models/my-random-qwen (shapes of ")


def test_a_relative_model_folder_is_exported_as_its_absolute_path(tmp_path, monkeypatch):
    """A probe runs in its own run folder, so `./my-model` would name nothing there."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    shutil.copy(CONFIGS / "Qwen2-7B-Instruct" / "config.json", folder / "config.json")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("./my-model").model_path == str(folder)
    assert resolve_model(str(folder)).model_path == str(folder)  # an absolute path stays exactly as given
