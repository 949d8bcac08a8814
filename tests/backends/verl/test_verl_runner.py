"""The verl backend's launcher, end to end against a TEST DOUBLE of main_ppo (tests/backends/verl/verl_double).

The double stands in for verl only as the child process; VerlRunner builds and runs the same command a
user's machine runs, reads the same JSONL file and classifies the same log tails.
"""

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autotune.errors import ProbeCrashed, ProbeEnvironmentError, ProbeOOM, ProbeRejected, ProbeTimeout
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.backends.base import ProbePruned, ProbeRequest
from autotune.backends.verl.runner import ProbeLimits, VerlRunner, probe_command, train_command
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

DOUBLE = Path(__file__).parent / "verl_double"


def _request(tmp_path, **cand) -> ProbeRequest:
    return ProbeRequest(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), n_gpus=8, nodes=1,
                        workload=Workload(), candidate=Candidate(**cand), run_dir=tmp_path / "run",
                        trial_number=7, warmup_steps=1, timed_steps=2)


def _runner(scenario, **limits) -> VerlRunner:
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AUTOTUNE_VERL_DOUBLE": scenario, "RAY_ADDRESS": "ray://stray:10001"}
    return VerlRunner(limits=ProbeLimits(**{"deadline_s": 60, "idle_timeout_s": 30, "kill_grace_s": 2, **limits}),
                      env=env)


def _invocation(tmp_path):
    return json.loads((tmp_path / "run" / "double_invocation.json").read_text())


def test_probe_command_line_and_environment(tmp_path):
    argv, env, metrics = probe_command(_request(tmp_path, actor_engine="megatron", actor_tp=2,
                                                cuda_device_max_connections=1))
    run_dir = (tmp_path / "run").resolve()
    assert argv[1:5] == ["-m", "verl.trainer.main_ppo", f"--config-path={run_dir}", "--config-name=probe"]
    assert (run_dir / "probe.yaml").is_file() and metrics == run_dir / "metrics.jsonl" and metrics.is_absolute()
    for expected in ("trainer.total_training_steps=3", "trainer.val_before_train=False", "trainer.test_freq=-1",
                     "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[console,file]",
                     "actor_rollout_ref.rollout.ignore_eos=True", "data.train_max_samples=3072",
                     f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='{metrics}'"):
        assert expected in argv
    assert env["VERL_FILE_LOGGER_PATH"] == str(metrics) and env["WANDB_MODE"] == "disabled"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


@pytest.mark.verl
@pytest.mark.parametrize("cand", [{}, {"actor_engine": "megatron", "actor_tp": 2, "cuda_device_max_connections": 1,
                                       "use_dynamic_bsz": True}])
def test_probe_config_composes_with_verl_and_the_limits_arrive(tmp_path, cand):
    from autotune.verl.compose import compose_exported, select

    argv, _, metrics = probe_command(_request(tmp_path, **cand))
    cfg = compose_exported(tmp_path / "run" / "probe.yaml", argv[5:])
    assert select(cfg, "trainer.total_training_steps") == 3
    assert list(select(cfg, "trainer.logger")) == ["console", "file"]
    assert select(cfg, "actor_rollout_ref.rollout.ignore_eos") is True
    assert select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH") == str(metrics)


def test_the_probe_peak_is_the_gpus_not_only_the_trainers(tmp_path, monkeypatch):
    """verl's max_memory_allocated is the trainer process; vLLM's pool lives in another process. With NVML the
    probe reports the device's peak (real H200 study 2026-12-03: verl 28.8 GiB, the GPU 89.8 GiB)."""
    from autotune.backends import gpu_monitor
    from autotune.backends.verl import runner as verl_runner
    class FakeNvml:  # TEST DOUBLE of pynvml: two GPUs holding 10 and 11 GiB
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 2)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetUtilizationRates = staticmethod(lambda h: SimpleNamespace(gpu=80))
        nvmlDeviceGetMemoryInfo = staticmethod(lambda h: SimpleNamespace(used=(10 + h) * 2**30))

    class FakeMonitor(gpu_monitor.GpuMonitor):
        def __init__(self, interval_s=1.0):
            super().__init__(interval_s=0.01, nvml=FakeNvml())

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(verl_runner, "GpuMonitor", FakeMonitor)
    result = _runner("ok").probe(_request(tmp_path), lambda step, tps: False)
    assert result.peak_mem_gib == pytest.approx(11.0)
    assert result.extra["verl_max_allocated_gib"] == pytest.approx(43.0)
    assert result.extra["peak_source"].startswith("NVML")


def test_successful_probe_scores_the_median_of_timed_steps(tmp_path):
    reported = []
    result = _runner("ok").probe(_request(tmp_path), lambda step, tps: reported.append((step, tps)) or False)
    assert reported == [(2, 1200.0), (3, 1300.0)]  # step 1 is warm-up
    assert result.tokens_per_s_per_gpu == pytest.approx(1250.0) and not result.simulated
    assert result.mfu == pytest.approx(0.325) and result.peak_mem_gib == pytest.approx(43.0)
    assert result.phase_s["gen"] == pytest.approx(1.5) and result.series["perf/throughput"] == [1200.0, 1300.0]
    # where the probe's time went: each start-up stage, each step and the end, in launch order (issue 28 item 1)
    stage_s = result.extra["stage_s"]
    assert list(stage_s) == ["ray_up", "dataloader", "workers_created", "engines_ready", "vllm_ready", "rollout_ready",
                             "ready_to_fit", "step1", "step2", "step3", "end"], stage_s
    assert list(stage_s.values()) == sorted(stage_s.values())
    assert stage_s["end"] == pytest.approx(result.extra["probe_wall_s"], abs=0.01)
    seen = _invocation(tmp_path)
    assert "RAY_ADDRESS" not in seen["env"], "a stray Ray cluster must never be joined"
    assert (tmp_path / "run" / "probe.log").read_text().count("\x1b[0m step:") == 3


def test_pruned_probe_stops_early(tmp_path):
    with pytest.raises(ProbePruned) as info:
        _runner("slow_exit").probe(_request(tmp_path), lambda step, tps: True)
    assert info.value.step == 2


@pytest.mark.parametrize("scenario, error, phase", [
    ("oom", ProbeOOM, "old_log_prob"),
    ("kv", ProbeOOM, "rollout"),
    ("config", ProbeRejected, None),
    ("env", ProbeEnvironmentError, None),
    ("nccl", ProbeCrashed, None),
])
def test_failures_are_classified_from_real_log_excerpts(tmp_path, scenario, error, phase):
    with pytest.raises(error) as info:
        _runner(scenario).probe(_request(tmp_path), lambda *_: False)
    if phase:
        assert info.value.phase == phase
    assert "probe.log" in str(info.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_hung_probe_is_killed_with_its_whole_process_tree(tmp_path):
    start = time.monotonic()
    runner = _runner("spawn", idle_timeout_s=2)
    runner.base_env["AUTOTUNE_VERL_DOUBLE_MARK"] = mark = f"mark-{tmp_path.name}"
    with pytest.raises(ProbeTimeout, match="hang"):
        runner.probe(_request(tmp_path), lambda *_: False)
    assert time.monotonic() - start < 2 + 2 + 10
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _alive(int(p.name))
                 and mark in (p / "cmdline").read_bytes().decode(errors="replace")]
    assert not leftovers


def test_train_command_uses_the_exported_file(tmp_path):
    argv = train_command(tmp_path / "out" / "best.yaml", ["trainer.total_epochs=3"])
    assert argv[1:] == ["-m", "verl.trainer.main_ppo", f"--config-path={(tmp_path / 'out').resolve()}",
                        "--config-name=best", "trainer.total_epochs=3"]
    assert argv[0] == sys.executable


def test_autotune_train_runs_the_same_launcher(tmp_path):
    import subprocess

    best = tmp_path / "out" / "best.yaml"
    best.parent.mkdir()
    best.write_text("defaults: [ppo_trainer, _self_]\n")
    env = {**os.environ, "PYTHONPATH": f"{DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AUTOTUNE_VERL_DOUBLE": "ok"}
    proc = subprocess.run([sys.executable, "-m", "autotune", "train", "--config", str(best),
                           "trainer.total_training_steps=2"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].endswith(f"--config-path={best.parent.resolve()} --config-name=best "
                                                "trainer.total_training_steps=2")
    assert "step:2" in proc.stdout and (best.parent / "train.log").is_file()


def test_a_study_on_the_verl_backend_keeps_logs_as_artifacts(tmp_path):
    from optuna.artifacts import FileSystemArtifactStore, download_artifact

    from autotune.config import ProbeBudget, TuneConfig
    from autotune.search.driver import run_study
    from autotune.storage.records import records

    cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="verl",
                     trials=3, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="v", out_dir=tmp_path,
                     seed=1, workload=Workload(), fixed={}, ranges={}, tune_workload=(),
                     probe=ProbeBudget(configs_per_launch=1))  # a launch each (shared ones: test_shared_launch.py)
    study = run_study(cfg, _runner("ok"))
    recs = records(study)
    assert recs[0].baseline and recs[0].state == "measured" and recs[0].tokens_per_s_per_gpu == pytest.approx(1250)
    launched = [t for t in study.trials if "log_artifact_id" in t.user_attrs]
    assert launched
    out = tmp_path / "log.txt"
    download_artifact(artifact_store=FileSystemArtifactStore(str(tmp_path / "artifacts")), file_path=str(out),
                      artifact_id=launched[0].user_attrs["log_artifact_id"])
    assert "step:3" in out.read_text()


def test_a_knob_whose_package_is_missing_is_rejected_before_launch(monkeypatch):
    from autotune.backends import select

    monkeypatch.setattr(select, "knob_without_package", lambda knob: "liger_kernel")
    assert "use_liger needs liger-kernel" in VerlRunner().unsupported(Candidate(use_liger=True), Workload())
    assert VerlRunner().unsupported(Candidate(use_liger=False), Workload()) is None
    # another interpreter's packages are not visible from here: verl's own import error will say it
    assert VerlRunner(python="/opt/other/python").unsupported(Candidate(use_liger=True), Workload()) is None


def test_without_megatron_core_only_fsdp_engines_are_proposed(monkeypatch):
    """A Megatron probe on a machine without megatron-core ends the study with an environment error; the runner
    says so up front and the driver narrows the space (found preparing the first real verl study)."""
    import importlib.util

    from autotune.search.driver import fit_to_runner
    from autotune.config import ProbeBudget, TuneConfig

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name.split(".")[0] == "megatron":
            raise ModuleNotFoundError(name)
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    runner = VerlRunner()
    assert runner.measurable_choices() == {"actor_engine": ("fsdp", "fsdp2")}
    cfg = TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="verl",
                     trials=4, storage_url="sqlite://", study_name="s", out_dir=Path("."), seed=0,
                     workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())
    assert fit_to_runner(cfg, runner).ranges["actor_engine"] == ["fsdp", "fsdp2"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert VerlRunner().measurable_choices() == {}


def test_a_probe_gets_what_the_users_script_exports_but_never_its_gpu_placement(tmp_path):
    from dataclasses import replace

    from autotune.backends.verl.runner import probe_env

    request = replace(_request(tmp_path), env={"VLLM_ATTENTION_BACKEND": "XFORMERS", "CUDA_VISIBLE_DEVICES": "0,1",
                                               "WANDB_MODE": "online"})
    env = probe_env(request, tmp_path / "m.jsonl", base={"CUDA_VISIBLE_DEVICES": "4,5", "PATH": "/bin"})
    assert env["VLLM_ATTENTION_BACKEND"] == "XFORMERS" and env["PATH"] == "/bin"
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"  # the executor's GPUs, not the script's
    assert env["WANDB_MODE"] == "disabled"  # a probe's own settings win
