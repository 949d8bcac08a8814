"""The `verl` backend: a short `python3 -m verl.trainer.main_ppo` GRPO run per candidate.

What is probed is what is exported: the probe's Hydra config is written by the same function as
best.yaml (verl/export.py), and only probe limits are added on the command line (few steps, no
validation, no checkpoints, a file logger, a fixed response length). The run lives in its own process
group with a watchdog (backends/process.py); metrics come live from verl's JSONL file logger, with the
console lines as a fallback; failures are classified from the exit code and the log tail
(verl/failures.py). GPUs are sampled with NVML during the probe.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from autotune.errors import (ProbeCrashed, ProbeEnvironmentError, ProbeError, ProbeOOM, ProbeRejected,
                             ProbeTimeout)
from autotune.backends.base import ProbePruned, ProbeRequest, ProbeResult, ProbeRunner, StepReporter
from autotune.backends.gpu_monitor import (GpuMonitor, device_peak_gib, idle_fraction_by_phase, phase_windows,
                                          summarize_samples)
from autotune.backends.process import ProcessOutcome, run_in_process_group
from autotune.backends.select import knob_package_missing, knobs_held_off
from autotune.verl.failures import FailureKind, classify_failure
from autotune.verl.metrics import THROUGHPUT_KEY, JsonlTail, StepMetrics, parse_console_line, summarize
from autotune.verl.export import best_yaml_text, model_engine, verl_overrides
from autotune.verl.stages import StageClock
from autotune.verl.step_knobs import parse_switch_line, shares_launches

PROBE_CONFIG_NAME = "probe"
VERL_ENTRY = "verl.trainer.main_ppo"
STEP_SWITCH_ENTRY = "autotune.verl.step_switch_entry"
PGID_FILE = "probe.pgid"  # the live probe's process group, for clean-up after a killed tuner
LOG_TAIL_CHARS = 20_000


@dataclass(frozen=True, kw_only=True)
class ProbeLimits:
    deadline_s: float = 3600.0  # whole probe, start-up included
    idle_timeout_s: float = 900.0  # no new step for this long: hung (first step includes Ray + vLLM start)
    kill_grace_s: float = 20.0


def probe_overrides(request: ProbeRequest, metrics_path: Path, total_steps: int | None = None) -> list[str]:
    """Command-line additions that turn the exported config into a short, comparable probe."""
    total_steps = total_steps or request.warmup_steps + request.timed_steps
    run_dir = Path(request.run_dir).resolve()
    return [
        f"trainer.total_training_steps={total_steps}",
        f"data.train_max_samples={total_steps * request.workload.train_batch_size}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        "trainer.logger=[console,file]",
        "trainer.project_name=autotune",
        f"trainer.experiment_name=trial{request.trial_number:04d}",
        # every sequence decodes to max_response_length, so probes compare equal work (rollout.yaml:49)
        "actor_rollout_ref.rollout.ignore_eos=True",
        # the file logger reads this in the TaskRunner actor; a locally started Ray cluster inherits the
        # driver's env, this covers a joined one too (reference/verl.md section 4)
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='{metrics_path}'",
    ]


def request_overrides(request: ProbeRequest) -> dict:
    """The verl keys of one request, by the exporter (what best.yaml would say for it)."""
    return verl_overrides(request.model, request.workload, request.candidate, gpus_per_node=request.n_gpus,
                          nodes=request.nodes, passthrough=request.passthrough)


def probe_command(request: ProbeRequest, *, python: str = sys.executable, entry: str = VERL_ENTRY,
                  total_steps: int | None = None, extra: list[str] = ()) -> tuple[list[str], dict[str, str], Path]:
    """(argv, env, metrics path) of one probe; writes RUN_DIR/probe.yaml, the exporter's config."""
    run_dir = Path(request.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    engine = model_engine(request.candidate)
    header = [f"autotune probe config for trial {request.trial_number} (same writer as best.yaml)"]
    (run_dir / f"{PROBE_CONFIG_NAME}.yaml").write_text(best_yaml_text(request_overrides(request), engine, header))
    argv = [python, "-m", entry, f"--config-path={run_dir}", f"--config-name={PROBE_CONFIG_NAME}",
            *probe_overrides(request, metrics_path, total_steps), *extra]
    return argv, probe_env(request, metrics_path), metrics_path


# where a probe runs is the executor's choice (a Ray task's GPUs, a local cluster), never the launch script's
PLACEMENT_VARS = frozenset({"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "RAY_ADDRESS"})


def probe_env(request: ProbeRequest, metrics_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # what the user's launch script exports (VLLM_ATTENTION_BACKEND, NCCL_*): the probe runs their job as they do
    env.update({k: v for k, v in request.env.items() if k not in PLACEMENT_VARS})
    env.pop("RAY_ADDRESS", None)  # never join a stray cluster: ray.init() honours it (reference/verl.md 4)
    env.update({"VERL_FILE_LOGGER_PATH": str(metrics_path), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
                "HYDRA_FULL_ERROR": "1"})
    if request.candidate.cuda_device_max_connections:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(request.candidate.cuda_device_max_connections)
    return env


def train_command(config_path: Path, extra_overrides: list[str], *, python: str = sys.executable) -> list[str]:
    """The full training launch for an exported best.yaml (`autotune train`)."""
    config_path = Path(config_path).resolve()
    return [python, "-m", "verl.trainer.main_ppo", f"--config-path={config_path.parent}",
            f"--config-name={config_path.stem}", *extra_overrides]


class StepStream:
    """Collects steps from the JSONL file (preferred) and console lines (fallback), reports new ones; notes the
    step switches of a shared launch (autotune/verl/step_switch.py) as they are announced."""

    def __init__(self, metrics_path: Path, warmup_steps: int, report: StepReporter) -> None:
        self.tail = JsonlTail(metrics_path)
        self.warmup_steps = warmup_steps
        self.report = report
        self.steps: dict[int, StepMetrics] = {}
        self.arrived_s: dict[int, float] = {}
        self.switched: dict[int, tuple[int, float]] = {}  # step -> (configuration, when announced)
        self.pruned_at: tuple[int, float] | None = None
        self.started_s = time.monotonic()  # made just before the launch
        self.clock = StageClock()

    def on_output(self, line: str) -> bool:
        self.clock.see(line, time.monotonic() - self.started_s)
        switch = parse_switch_line(line)
        if switch is not None:
            self.switched[switch[0]] = (switch[1], time.monotonic())
        found = [s for s in (parse_console_line(line),) if s is not None] + self.tail.read_new()
        return self._add(found)

    def stage_s(self, wall_s: float) -> dict[str, float]:
        """Seconds from the launch to each start-up stage, each step (as it arrived) and the end."""
        for step, arrived in sorted(self.arrived_s.items()):
            # a step read after the process ended (its JSONL line, read once more at exit) ended no later than it
            self.clock.see_step(step, min(arrived - self.started_s, wall_s))
        return {**self.clock.seconds, "end": round(wall_s, 2)}

    def poll(self) -> bool:
        """Called by the watchdog: read the JSONL file even when the console is quiet; True to stop."""
        self._add(self.tail.read_new())
        return self.pruned_at is not None

    def _add(self, found: list[StepMetrics]) -> bool:
        progress = False
        for step in found:
            if step.step < 1:
                continue
            known = self.steps.get(step.step)
            self.steps[step.step] = StepMetrics(step.step, {**(known.metrics if known else {}), **step.metrics})
            if known is None:
                progress = True
                self.arrived_s[step.step] = time.monotonic()
                self._report(step)
        return progress

    def _report(self, step: StepMetrics) -> None:
        if step.step <= self.warmup_steps or self.pruned_at is not None:
            return
        tokens_per_s = step.metrics.get(THROUGHPUT_KEY)
        if tokens_per_s is not None and self.report(step.step, tokens_per_s):
            self.pruned_at = (step.step, tokens_per_s)


class VerlRunner(ProbeRunner):
    name: ClassVar[str] = "verl"
    simulated: ClassVar[bool] = False
    default_configs_per_launch: ClassVar[int] = 4

    def __init__(self, limits: ProbeLimits | None = None, python: str = sys.executable,
                 env: dict[str, str] | None = None, shared_entry: str = STEP_SWITCH_ENTRY) -> None:
        self.limits = limits or ProbeLimits()
        self.python = python
        self.base_env = env
        self.shared_entry = shared_entry  # the module a shared launch runs (autotune/verl/step_switch.py)

    def unsupported(self, candidate, workload) -> str | None:
        if self.python == sys.executable:  # another interpreter's packages are not visible from here
            return knob_package_missing(candidate)
        return None

    def held_off(self) -> dict:
        return knobs_held_off() if self.python == sys.executable else {}

    def measurable_choices(self) -> dict[str, tuple]:
        """Without megatron-core where the probe runs, verl's Megatron engine cannot start (its worker imports
        megatron.core at module level: verl/workers/engine/megatron/transformer_impl.py:23): every Megatron probe
        would end the study with an environment error, so only the FSDP engines are proposed."""
        if self.python != sys.executable or _module_present("megatron.core"):
            return {}
        return {"actor_engine": ("fsdp", "fsdp2")}

    def probe(self, request: ProbeRequest, report: StepReporter) -> ProbeResult:
        argv, env, metrics_path = probe_command(request, python=self.python)
        stream = StepStream(metrics_path, request.warmup_steps, report)
        outcome, samples, log_path = self.run_launch(request, argv, env, metrics_path, stream)
        if stream.pruned_at is not None:
            raise ProbePruned(*stream.pruned_at)
        steps = [stream.steps[k] for k in sorted(stream.steps)]
        if outcome.returncode != 0 or outcome.hung or outcome.timed_out:
            raise_failure(outcome, log_path)
        try:
            summary = summarize(steps, request.warmup_steps)
        except ValueError as exc:
            raise ProbeCrashed(f"verl exited 0 but logged no usable step: {exc} (log: {log_path})") from None
        extra = {"log_path": str(log_path), "probe_wall_s": outcome.wall_s, "stage_s": stream.stage_s(outcome.wall_s)}
        return result_of(summary, steps, stream, samples, extra)

    def can_share(self, request: ProbeRequest) -> bool:
        return shares_launches(request.passthrough)

    def probe_group(self, requests: list[ProbeRequest], reports: list[StepReporter]) -> list:
        from autotune.backends.verl.shared_launch import probe_group

        if len(requests) == 1 or not all(self.can_share(r) for r in requests):
            return super().probe_group(requests, reports)
        return probe_group(self, requests, reports)

    def run_launch(self, request: ProbeRequest, argv: list[str], env: dict[str, str], metrics_path: Path,
                   stream: StepStream, extra_env: dict[str, str] | None = None) -> tuple[ProcessOutcome, list | None, Path]:
        """One verl process in its own group, watched, with NVML samples; (outcome, samples or None, log path)."""
        if self.base_env is not None:
            env = probe_env(request, metrics_path, base=self.base_env)
        env = {**env, **(extra_env or {})}
        run_dir = Path(request.run_dir).resolve()
        log_path = run_dir / "probe.log"
        with GpuMonitor(interval_s=1.0) as monitor:
            outcome = run_in_process_group(argv, env=env, cwd=run_dir, log_path=log_path,
                                           deadline_s=self.limits.deadline_s,
                                           idle_timeout_s=self.limits.idle_timeout_s, on_output=stream.on_output,
                                           should_stop=stream.poll, kill_grace_s=self.limits.kill_grace_s,
                                           pgid_file=run_dir / PGID_FILE)
        stream.poll()
        return outcome, (list(monitor.samples) if monitor.available else None), log_path


def result_of(summary, steps: list[StepMetrics], stream: StepStream, samples: list | None, extra: dict) -> ProbeResult:
    """A ProbeResult from the steps one configuration ran: verl's figures, the GPU's peak over those steps."""
    windows = [phase_windows(stream.arrived_s[s.step], {k.removeprefix("timing_s/"): v
                                                      for k, v in s.metrics.items() if k.startswith("timing_s/")})
               for s in steps if s.step in stream.arrived_s]
    extra = {**extra, "reserved_mem_gib": summary.reserved_mem_gib, "verl_max_allocated_gib": summary.peak_mem_gib}
    # The probe's peak is the device's, as the memory model predicts it and as an OOM sees it. verl's
    # perf/max_memory_allocated_gb is the trainer process alone: vLLM's weights and KV cache live in the
    # rollout server's process (H200 study 2026-12-03: verl said 28.8 GiB, the GPU held 89.8).
    peak_mem_gib = summary.peak_mem_gib or 0.0
    extra["peak_source"] = "verl max allocated (trainer process only; no NVML)"
    if samples is not None:
        extra["gpu_samples"] = summarize_samples(samples)
        extra["idle_fraction_by_phase"] = idle_fraction_by_phase(samples, windows)
        device_peak = device_peak_gib(samples)
        if device_peak is not None:
            peak_mem_gib, extra["peak_source"] = device_peak, "NVML used memory of the GPU, every process"
    return ProbeResult(tokens_per_s_per_gpu=summary.tokens_per_s_per_gpu, mfu=summary.mfu_actor,
                       peak_mem_gib=peak_mem_gib, step_s=summary.step_s,
                       phase_s=summary.phase_s, simulated=False, series=summary.series, extra=extra)


def _module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a missing parent package (megatron for megatron.core)
        return False


def _log_tail(log_path: Path) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - LOG_TAIL_CHARS, 0))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def raise_failure(outcome: ProcessOutcome, log_path: Path) -> None:
    raise failure_error(outcome, log_path)


def failure_error(outcome: ProcessOutcome, log_path: Path) -> ProbeError:
    """The exception the driver records for a non-success; only GPU memory feeds the constraint. It carries the
    probe's wall time: a failed probe spent GPU time too."""
    failure = classify_failure(outcome.returncode, _log_tail(log_path), hung=outcome.hung or outcome.timed_out,
                               interrupted=outcome.interrupted)
    where = f" (phase {failure.phase})" if failure.phase else ""
    message = f"{failure.kind.value}{where}: {failure.message} [log: {log_path}]"
    if failure.is_gpu_memory:
        kv = failure.kind is FailureKind.KV_CACHE_TOO_SMALL
        error: ProbeError = ProbeOOM(message, phase=failure.phase or ("rollout" if kv else None),
                                     over_gib=failure.requested_gib, kind=failure.kind.value)
    elif failure.kind is FailureKind.CONFIG_REJECTED:
        error = ProbeRejected(message)
    elif failure.kind is FailureKind.ENVIRONMENT:
        error = ProbeEnvironmentError(message)
    elif failure.kind is FailureKind.HANG:
        error = ProbeTimeout(message)
    else:
        error = ProbeCrashed(message)  # NCCL, host OOM, killed from outside, unknown: not the candidate's memory
    error.probe_wall_s = outcome.wall_s
    return error
