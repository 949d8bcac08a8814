"""The user's own verl job: real launch scripts from verl's examples (tests/data/verl_examples, SOURCES.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.estimate import estimate
from autotune.hardware import get_gpu
from autotune.verl.job_import import user_job
from autotune.verl.keys import BY_KEY, WORKLOAD_BY_KEY, active_knobs_for, kind_of
from autotune.verl.launch_script import import_launch_script

EXAMPLES = Path(__file__).parents[1] / "data" / "verl_examples"
SCRIPTS = sorted(EXAMPLES.glob("*.sh"))
# scripts whose model path is not readable statically (or is wrong in verl's own file), and the model to use
MODEL_FOR = {"qwen2-70b_grpo_32_h20_fsdp_vllm.sh": "qwen2.5-72b",  # verl's script says model.path=model_path
             "run_qwen3-235b_megatron_96gb.sh": "qwen3-235b-a22b"}  # a folder under $RAY_DATA_HOME
# docs/perf/device_tuning.rst: "Hardware Resource Needed for RL" (MIN rows), the hardware each script ran on
DEVICE_TUNING = {
    "qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2-3b_grpo-lora_1_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2-7b_grpo_2_h800_fsdp_vllm.sh": "H800",
    "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2_14b_grpo_4_h800_fsdp_vllm.sh": "H800",
    "qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2_32B_grpo_8_h20_megatron_vllm.sh": "H20",
    "qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh": "H100-80GB",
    "qwen2-70b_grpo_32_h20_fsdp_vllm.sh": "H20",
    "qwen2-70b_grpo_32_h800_fsdp_vllm.sh": "H800",
    "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh": "H100-80GB",
}


def _job(path: Path):
    """The job as a user gets it imported: with the `--` values its error asks for (run names the shell computes,
    say) and the model verl's own file names wrongly."""
    from autotune.verl.judge import import_script

    try:
        return import_script(path, model_name=MODEL_FOR.get(path.name))[1]
    except Exception as exc:  # models outside the table (gpt-oss, DeepSeek-V3) must say so in one line
        return exc


def test_at_least_ten_fixtures_cover_fsdp_megatron_moe_and_lora():
    names = [p.name for p in SCRIPTS]
    assert len(names) >= 10
    assert any("megatron" in n for n in names) and any("lora" in n for n in names)
    assert any("30b" in n or "moe" in n for n in names)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_fixture_imports_or_names_what_is_missing(path):
    job = _job(path)
    if isinstance(job, Exception):  # a model outside the table, or verl's own placeholder (<path_to_dsv3_config>)
        from autotune.errors import ConfigError
        assert isinstance(job, ConfigError) and "\n" not in str(job), job
        assert any(m in str(job) for m in ("unknown model", "cannot read actor_rollout_ref.model.path",
                                           "not readable statically", "statically, all of them")), job
        return
    assert job.workload.train_batch_size >= 1 and job.workload.rollout_n >= 1
    inactive = [k for k in job.passthrough if kind_of(k) == "system"
                and (BY_KEY[k].field is None or job.baseline.actor_engine not in BY_KEY[k].engines
                     or BY_KEY[k].field not in active_knobs_for(job.workload, job.baseline.actor_engine))]
    # every passthrough key is the user's verbatim: not a knob this job searches (the other engine's keys included,
    # which its engine never reads; a candidate on that engine sets them)
    # (and the user's own Megatron recompute settings, kept while checkpointing stays on: export.py)
    recompute = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_"
    assert all(kind_of(k) == "passthrough" or WORKLOAD_BY_KEY.get(k) or k in inactive or k.startswith(recompute)
               for k in job.passthrough)
    assert "actor_rollout_ref.model.path" in job.passthrough or path.name in MODEL_FOR


# With Ulysses SP 2 these scripts' global micro-batches are per GPU = global / (GPUs / SP) (verl <= 0.8
# fsdp_workers.py, issue 15 defect 6): 116, 90 and 44 sequences per micro-batch, twice what the old import read.
# The memory model checks every response at max_response_length (1024 here; docs/model.md: a late long-response OOM
# is real, verl issue 1232), and there the update micro-batch (116 x ~1229 tokens / SP 2 = 71k tokens per GPU for
# the 14B) predicts 89.8 / 91.7 / 88.5 GiB on an 80 GB H100. The model fits them with every response at <= 800 /
# 752 / 784 tokens (880-928 with GSM8K's prompts): benchmarks/lora_sp2_lengths.py, output in
# benchmarks/results/lora_sp2_lengths.txt.
# device_tuning.rst reports them running on GSM8K, whose responses are far shorter than 1024 (prompts: 74 tokens on
# average in our own H200 run, benchmarks/results/h200-2026-12-03-verl/train.txt), so that report does not show
# they fit at max length. Checked against verl for LoRA + SP, the model already does what verl does: activations
# and logits split by SP (inputs sliced per SP rank before the model, log-probs gathered after:
# engine/fsdp/transformer_impl.py:1228-1240, :688), a frozen fp32 base (model_dtype null is fp32
# for training: engine/fsdp/transformer_impl.py:258-262) without gradients or Adam state, the reference on the actor
# with adapters off (0 GiB). Not a model defect found; strict: the mark goes if the model or the import changes.
_SP2_MEMORY_MODEL = pytest.mark.xfail(strict=True, reason="checked at max response length 1024, where the model "
                                      "predicts the update OOMs; the published run is GSM8K with far shorter responses "
                                      "(the model fits them at <= 752-800 tokens per response)")
_XFAIL = {"qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh", "qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh",
          "qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh"}


@pytest.mark.parametrize("name, gpu", [pytest.param(n, g, marks=_SP2_MEMORY_MODEL) if n in _XFAIL else (n, g)
                                       for n, g in sorted(DEVICE_TUNING.items())])
def test_estimate_does_not_predict_oom_for_configs_verl_reports_running(name, gpu):
    job = _job(EXAMPLES / name)
    result = estimate(job.model, get_gpu(gpu), job.workload, job.baseline, gpus_per_node=job.gpus_per_node,
                      nodes=job.nodes or 1)
    assert result.fits, (result.phase_peak_gib, result.kv_cache_gib, result.capacity_gib)
    assert not result.violations, result.violations


def test_verls_qwen3_235b_script_fits_32_h20s_as_its_docs_say():
    """verl's docs (docs/perf/dpsk.md:31 at 2239fd0): with OFFLOAD_FRACTION=1, Qwen3-235B-A22B runs "on as few as 32
    H20 (96GB) GPUs", using "1.6TB CPU memory per node". Issue 30: the model said 228.5 GiB per GPU (the interleaved
    factor at VPP 1; Megatron's CPU optimizer, which keeps the whole distributed optimizer on the host, not read;
    PP micro-batches of the largest stage in flight where 1F1B's first stage holds PP of its own 11 layers)."""
    job = _job(EXAMPLES / "run_qwen3-235b_megatron_96gb.sh")
    assert job.workload.megatron_optimizer_cpu_offload and job.workload.megatron_optimizer_offload_fraction == 1.0
    assert (job.baseline.actor_tp, job.baseline.actor_pp, job.baseline.actor_ep) == (4, 8, 4)
    result = estimate(job.model, get_gpu("H20"), job.workload, job.baseline, gpus_per_node=job.gpus_per_node,
                      nodes=job.nodes or 1)
    assert (job.gpus_per_node, job.nodes) == (8, 4)
    assert result.fits and not result.violations, (result.phase_peak_gib, result.violations)
    assert result.components_gib["optimizer"] == 0.0
    assert result.host_per_gpu_gib["optimizer"] > 50  # the CPU optimizer's state lives on the host
    assert 1000 < result.host_node_gib < 1.6e12 / 2**30 * 1.1  # "1.6TB CPU memory per node"


def test_lora_is_read_and_changes_the_memory_model():
    job = _job(EXAMPLES / "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh")
    assert job.workload.lora_rank > 0
    from dataclasses import replace
    full = estimate(job.model, get_gpu("H100-80GB"), replace(job.workload, lora_rank=0), job.baseline,
                    gpus_per_node=1, nodes=1)
    lora = estimate(job.model, get_gpu("H100-80GB"), job.workload, job.baseline, gpus_per_node=1, nodes=1)
    assert lora.components_gib["optimizer"] < full.components_gib["optimizer"] / 50
    assert lora.components_gib["reference"] == 0.0  # LoRA's reference is the actor with adapters off


def test_lora_target_modules_are_read_and_size_the_adapters(tmp_path):
    job = _job(EXAMPLES / "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh")
    assert job.workload.lora_target_modules == "all-linear"
    script = tmp_path / "run.sh"
    script.write_text((EXAMPLES / "qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh").read_text().replace(
        "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]"))
    narrow = _job(script)
    assert narrow.workload.lora_target_modules == ["q_proj", "v_proj"]
    from autotune.model.memory import lora_params
    assert lora_params(job.model, 64, ["q_proj", "v_proj"]) < lora_params(job.model, 64) / 5


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "HOME": "/home/user"})


def test_estimate_cli_table_and_json():
    script = str(EXAMPLES / "qwen2-7b_grpo_2_h800_fsdp_vllm.sh")
    table = _cli("estimate", "--from", script, "--gpu", "H800")
    assert table.returncode == 0, table.stderr
    assert "verl's rules: all pass" in table.stdout and "SIMULATED" in table.stdout
    assert "not read statically: $@" in table.stdout
    doc = json.loads(_cli("estimate", "--from", script, "--gpu", "H800", "--json").stdout)
    assert doc["gpus_per_node"] == 2 and doc["fits"] is True and doc["simulated"] is True
    assert set(doc["components_gib"]) >= {"weights", "gradients", "optimizer", "activations", "logits", "vllm_share"}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("from")
    script = EXAMPLES / "qwen2-7b_grpo_2_h800_fsdp_vllm.sh"
    proc = _cli("run", "--from", str(script), "--backend", "sim", "--gpu", "H800", "--trials", "10", "--out",
                str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    return script, out, proc


def test_run_from_a_script_measures_the_users_config_first(tuned):
    script, out, proc = tuned
    assert "workload held fixed" in proc.stdout
    doc = json.loads((out / "result.json").read_text())
    base = doc["baseline"]["params"]
    assert doc["baseline"]["trial"] == 0
    assert base["ppo_micro_batch_size_per_gpu"] == 16 and base["rollout_tp"] == 2
    assert base["gpu_memory_utilization"] == 0.6 and base["param_offload"] is True


@pytest.mark.verl
def test_workload_values_are_identical_before_and_after_tuning(tuned):
    from autotune.verl.compose import compose_exported, compose_overrides, select

    script, out, _ = tuned
    imported = import_launch_script(script, {"HOME": "/home/user"})
    user_overrides = [f"{k}={v}" for k, v in imported.overrides.items()]
    before = compose_overrides(user_overrides)
    after = compose_exported(out / "best.yaml")
    checked = 0
    for key in imported.overrides:
        if kind_of(key) in ("workload", "passthrough"):
            assert select(after, key) == select(before, key), key
            checked += 1
    assert checked >= 15
    assert select(after, "actor_rollout_ref.actor.optim.lr") == 1e-6
    assert list(select(after, "trainer.logger")) == ["console", "wandb"]


def test_opted_in_workload_knob_is_named_in_the_export(tmp_path):
    script = EXAMPLES / "qwen2-7b_grpo_2_h800_fsdp_vllm.sh"
    proc = _cli("run", "--from", str(script), "--backend", "sim", "--gpu", "H800", "--trials", "6", "--out",
                str(tmp_path), "--quiet", "--tune-workload", "ppo_mini_batch_size")
    assert proc.returncode == 0, proc.stderr
    header = (tmp_path / "best.yaml").read_text().split("hydra:")[0]
    assert "WORKLOAD CHANGED (opted in): ppo_mini_batch_size" in header


def test_unreadable_model_path_is_reported_by_name(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=$MODEL data.train_batch_size=8\n")
    proc = _cli("estimate", "--from", str(script), "--gpus", "8")
    assert proc.returncode == 2 and "MODEL" in proc.stderr and len(proc.stderr.splitlines()) == 1


ENV_SCRIPT = """\
export VLLM_ATTENTION_BACKEND=XFORMERS
export CUDA_DEVICE_MAX_CONNECTIONS=1
LOCAL_ONLY=1
NCCL_DEBUG=WARN python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
    data.train_files=data/train.parquet data.val_files=[data/a.parquet,../b.parquet] \\
    data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct custom_reward_function.path=reward.py \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.project_name=p trainer.experiment_name=e
"""


def test_a_scripts_paths_are_made_absolute_and_its_exports_kept(tmp_path):
    """Issue 32 item 1: verl expands no `~` and a probe runs in its own folder; `export` lines reach the job."""
    from autotune.verl.launch_script import import_launch_text

    (tmp_path / "reward.py").write_text("def compute_score(*a): return 0.0\n")
    job = user_job(import_launch_text(ENV_SCRIPT, environ={}), cwd=tmp_path)
    assert job.workload.train_files == str(tmp_path / "data" / "train.parquet")
    assert job.workload.val_files == [str(tmp_path / "data" / "a.parquet"), str(tmp_path.parent / "b.parquet")]
    assert job.passthrough["custom_reward_function.path"] == str(tmp_path / "reward.py")
    assert job.passthrough["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-7B-Instruct"  # an HF id, as written
    # exported or given on the command only; CUDA_DEVICE_MAX_CONNECTIONS is a searched knob, set by the candidate
    assert job.env == {"VLLM_ATTENTION_BACKEND": "XFORMERS", "NCCL_DEBUG": "WARN"}


def test_the_scripts_environment_reaches_best_yaml_and_train_and_missing_data_is_refused(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(ENV_SCRIPT)
    (tmp_path / "reward.py").write_text("def compute_score(*a): return 0.0\n")
    out = tmp_path / "out"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})

    proc = cli("run", "--from", str(script), "--backend", "sim", "--gpu", "H100", "--trials", "2", "--out", str(out),
               "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "VLLM_ATTENTION_BACKEND=XFORMERS NCCL_DEBUG=WARN" in proc.stdout
    text = (out / "best.yaml").read_text()
    header = text.split("hydra:")[0]
    assert "# export VLLM_ATTENTION_BACKEND=XFORMERS\n# export NCCL_DEBUG=WARN\n" in header
    assert yaml.safe_load(text)["data"]["train_files"] == str(tmp_path / "data" / "train.parquet")
    train = cli("train", "--config", str(out / "best.yaml"))
    assert train.returncode == 2 and len(train.stderr.strip().splitlines()) == 1, train.stderr
    assert f"data.train_files={tmp_path / 'data' / 'train.parquet'}" in train.stderr and "Traceback" not in train.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    dry = cli("train", "--config", str(out / "best.yaml"), "--dry-run",
              f"data.val_files=[{tmp_path / 'data' / 'train.parquet'}]")
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    assert dry.stdout.startswith("VLLM_ATTENTION_BACKEND=XFORMERS NCCL_DEBUG=WARN ")
