"""The `torch` backend: one GRPO-shaped step loop on real transformers modules, in a subprocess.

`TorchRunner.probe` writes `request.json` into the probe's run directory, starts
`python -m autotune.backends.torch.probe` (under `torch.distributed.run` when the job's GPUs
are all on this host) in its own process group, forwards each timed step's tokens/s to `report`,
and turns the result file and exit code into a ProbeResult or a ProbeError. A separate process per
probe means an OOM or a crash cannot leave the next trial with a poisoned CUDA context.

This module imports no torch: the parent process of a study stays light, and `import` works
without the `torch` extra. The file protocol (exit codes, result file names) is defined here and
imported by the workload.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar

from autotune.errors import install_hint
from autotune.errors import (
    BackendUnavailable,
    ProbeCrashed,
    ProbeEnvironmentError,
    ProbeOOM,
    ProbeRejected,
    ProbeTimeout,
)
from autotune.hardware import detect_gpus
from autotune.models import ModelSpec
from autotune.backends.base import ProbePruned, ProbeRequest, ProbeResult, ProbeRunner, StepReporter
from autotune.backends.process import ProcessOutcome, run_in_process_group
from autotune.backends.select import knob_package_missing, knobs_held_off
from autotune.spaces.candidate import Candidate
from autotune.workload import Workload

__all__ = ["MEASURABLE_CHOICES", "PHASES", "TorchRunner", "rank_result_path", "request_payload", "unsupported_reason"]

# verl's timing_s/<phase> names, in step order.
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")

# Exit codes of the probe (backends/torch/probe) beyond Python's own (1: uncaught exception).
EXIT_OOM = 3
EXIT_KV_CACHE_TOO_SMALL = 4
EXIT_ENVIRONMENT = 5
EXIT_REJECTED = 6  # a configuration verl itself would refuse (e.g. a token budget below one sequence)

REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
LOG_FILE = "probe.log"  # the driver keeps run_dir/probe.log as the trial's artifact
_INSTALL_HINT = f"the torch backend needs `{install_hint('torch')}`"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding `autotune/`


_SIGNALS = {s.value for s in signal.Signals}
# Knobs whose kernels are Triton, CUDA only: a CPU probe (tests) cannot turn them on.
CUDA_ONLY_KNOBS = ("use_liger",)


def rank_result_path(out: str | Path, rank: int) -> str:
    """Rank 0 writes the result; other ranks write their own failure next to it."""
    return str(out) if rank == 0 else f"{out}.rank{rank}"


# What the probe (backends/torch/probe) implements of verl's layouts: FSDP data parallelism, no Ulysses (see unsupported_reason)
MEASURABLE_CHOICES: dict[str, tuple] = {"actor_engine": ("fsdp", "fsdp2"), "ulysses_sp": (1,)}


def unsupported_reason(candidate: Candidate, workload: Workload, device: str = "cuda") -> str | None:
    """Why this backend cannot measure a candidate, or None. It runs FSDP data parallelism only."""
    if candidate.is_megatron:
        return "the torch backend measures FSDP layouts only, but got actor_engine='megatron'"
    if candidate.ulysses_sp != 1:
        return f"the torch backend does not implement Ulysses sequence parallelism, but got ulysses_sp={candidate.ulysses_sp}"
    missing = knob_package_missing(candidate)
    if missing:
        return missing
    cuda_only = [knob for knob in CUDA_ONLY_KNOBS if getattr(candidate, knob)]
    if cuda_only and device != "cuda":
        return f"{cuda_only[0]} runs Triton kernels, which need a CUDA GPU"
    if workload.lora_rank and importlib.util.find_spec("peft") is None:
        return f"the torch backend measures LoRA (lora_rank={workload.lora_rank}) with peft, which is not installed"
    return None


def _shape_override(model: ModelSpec) -> dict:
    """Fields where `model` differs from the table entry of the same name (tests' tiny shapes); a model read from
    its own config.json (no table entry) sends every field."""
    from autotune.models import lookup_table

    found = lookup_table(model.name)
    if found is None:
        return asdict(model)
    table = found[0]
    return {f.name: getattr(model, f.name) for f in fields(ModelSpec)
            if getattr(model, f.name) != getattr(table, f.name)}


def request_payload(request: ProbeRequest, *, device: str, overrides: dict | None = None) -> dict:
    """request.json for the probe (backends/torch/probe); `overrides` adds `scale`, `shape_override`, test doubles."""
    payload = {
        "model": request.model.name,
        "shape_override": _shape_override(request.model),
        "workload": asdict(request.workload),
        "candidate": request.candidate.as_params(),
        "gpus_per_node": request.n_gpus,
        "nodes": request.nodes,
        "warmup_steps": request.warmup_steps,
        "timed_steps": request.timed_steps,
        "device": device,
        "peak_flops_per_gpu": request.gpu.peak_bf16_flops,
        "seed": request.trial_number,
    }
    if device != "cuda":
        payload["device_mem_gib"] = request.gpu.mem_gib  # sizes the KV budget; CUDA asks the device
    payload.update(overrides or {})
    return payload


class TorchRunner(ProbeRunner):
    """Measures a candidate with the probe (backends/torch/probe) in a subprocess (see module docstring).

    `device="cpu"` runs the same loop on the CPU (tests, with a tiny `shape_override`);
    `request_overrides` is merged into request.json (`scale`, `shape_override`, `device_mem_gib`).
    """

    name: ClassVar[str] = "torch"
    simulated: ClassVar[bool] = False

    def __init__(self, *, device: str = "cuda", deadline_s: float = 3600.0, idle_timeout_s: float = 1200.0,
                 multi_gpu: bool = True, request_overrides: dict | None = None, python: str = sys.executable) -> None:
        missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
        if missing:
            raise BackendUnavailable(f"{_INSTALL_HINT} ({', '.join(missing)} not installed)")
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', but got {device=}")
        self.device = device
        self.deadline_s = deadline_s
        self.idle_timeout_s = idle_timeout_s
        self.multi_gpu = multi_gpu
        self.request_overrides = dict(request_overrides or {})
        self.python = python

    def unsupported(self, candidate: Candidate, workload: Workload) -> str | None:
        return unsupported_reason(candidate, workload, self.device)

    def measurable_choices(self) -> dict[str, tuple]:
        return MEASURABLE_CHOICES

    def held_off(self) -> dict:
        return knobs_held_off() | ({knob: False for knob in CUDA_ONLY_KNOBS} if self.device != "cuda" else {})

    def probe(self, request: ProbeRequest, report: StepReporter) -> ProbeResult:
        reason = unsupported_reason(request.candidate, request.workload, self.device)
        if reason:
            raise ProbeRejected(reason)  # a property of the candidate: the sampler learns to avoid it
        run_dir = Path(request.run_dir).resolve()  # the probe runs with cwd=run_dir: its paths must be absolute
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob(f"{RESULT_FILE}*"):
            stale.unlink()
        payload = request_payload(request, device=self.device, overrides=self.request_overrides)
        (run_dir / REQUEST_FILE).write_text(json.dumps(payload, indent=1))
        progress = _Progress(report)
        outcome = run_in_process_group(
            self._argv(request, run_dir), env=self._env(), cwd=run_dir, log_path=run_dir / LOG_FILE,
            deadline_s=self.deadline_s, idle_timeout_s=self.idle_timeout_s,
            on_output=progress.on_line, should_stop=progress.should_stop)
        if progress.pruned is not None:
            raise ProbePruned(*progress.pruned)
        return _outcome_to_result(outcome, run_dir)

    def _processes(self, request: ProbeRequest) -> int:
        """GPUs to launch on: the job's, when it is one node and they are all here; else one process
        that does one rank's share of the step."""
        world = request.n_gpus * request.nodes
        if self.device != "cuda" or not self.multi_gpu or request.nodes != 1 or world <= 1:
            return 1
        detected = detect_gpus()
        return world if detected is not None and detected.count >= world else 1

    def _argv(self, request: ProbeRequest, run_dir: Path) -> list[str]:
        module_args = ["-m", "autotune.backends.torch.probe",
                       "--request", str(run_dir / REQUEST_FILE), "--out", str(run_dir / RESULT_FILE)]
        nproc = self._processes(request)
        if nproc == 1:
            return [self.python, *module_args]
        return [self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *module_args]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        # as verl configures its workers (plugin/platform/platform_base.py:138, expandable segments): fewer
        # fragmentation OOMs when phases with different shapes share one allocator
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        return env


class _Progress:
    """Reads the workload's per-step JSON lines; asks `report` about timed steps."""

    def __init__(self, report: StepReporter) -> None:
        self.report = report
        self.pruned: tuple[int, float] | None = None

    def on_line(self, line: str) -> bool:
        record = _step_line(line)
        if record is None:
            return False
        # 1-based step numbers, as the sim backend reports them
        step, tokens_per_s = int(record["step"]) + 1, float(record["tokens_per_s_per_gpu"])
        if record.get("timed") and self.pruned is None and self.report(step, tokens_per_s):
            self.pruned = (step, tokens_per_s)
        return True

    def should_stop(self) -> bool:
        return self.pruned is not None


def _step_line(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "step" in record and "tokens_per_s_per_gpu" in record else None


def _read_results(run_dir: Path) -> list[dict]:
    """Rank 0's result first, then any other rank's failure record."""
    paths = sorted(run_dir.glob(f"{RESULT_FILE}*"), key=lambda p: (p.name != RESULT_FILE, p.name))
    records = []
    for path in paths:
        if path.suffix == ".tmp":
            continue
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return records


def _last_error_line(log_path: Path) -> str:
    """The last line that is not a step record: for a Python crash, the exception itself."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.strip() and _step_line(line) is None:
            return line.strip()[:500]
    return ""


def _outcome_to_result(outcome: ProcessOutcome, run_dir: Path) -> ProbeResult:
    records = _read_results(run_dir)
    failure = next((r for r in records if not r.get("ok")), None)
    if failure is not None:
        raise _failure_error(failure)
    if outcome.timed_out or outcome.hung:
        why = "made no progress" if outcome.hung else "ran past its deadline"
        raise ProbeTimeout(f"torch probe {why} after {outcome.wall_s:.0f} s (log: {outcome.log_path})")
    last_line = _last_error_line(outcome.log_path)
    if outcome.returncode != 0 or not records:
        if outcome.returncode is not None and outcome.returncode < 0:  # a signal; the log's last line is not why
            name = signal.Signals(-outcome.returncode).name if -outcome.returncode in _SIGNALS else outcome.returncode
            hint = " (the host may have run out of memory)" if outcome.returncode == -signal.SIGKILL else ""
            raise ProbeCrashed(f"torch probe was killed by {name}{hint} (log: {outcome.log_path})")
        # only an uncaught import error ends a Python traceback with this line; libraries also log
        # warnings that merely mention ImportError (liger-kernel's optional backends do)
        if last_line.startswith(("ModuleNotFoundError:", "ImportError:")):
            raise ProbeEnvironmentError(f"torch probe could not start: {last_line} ({_INSTALL_HINT})")
        raise ProbeCrashed(f"torch probe exited with code {outcome.returncode}: {last_line or 'no output'} "
                           f"(log: {outcome.log_path})")
    return _to_probe_result(records[0], outcome.wall_s)


def _failure_error(record: dict) -> Exception:
    message = record.get("message", "")
    if record.get("oom"):
        return ProbeOOM(message, phase=record.get("phase"), over_gib=record.get("over_gib"),
                        peak_mem_gib=record.get("peak_mem_gib"))
    if record.get("kv_cache_too_small"):
        return ProbeOOM(message, phase="rollout", over_gib=record.get("over_gib"))
    if record.get("rejected"):
        return ProbeRejected(message)
    if record.get("environment"):
        return ProbeEnvironmentError(f"torch probe cannot run here: {message}")
    return ProbeCrashed(f"torch probe failed: {message}")


def _to_probe_result(record: dict, wall_s: float) -> ProbeResult:
    return ProbeResult(
        tokens_per_s_per_gpu=record["tokens_per_s_per_gpu"],
        mfu=record["mfu"],
        peak_mem_gib=record["peak_mem_gib"],
        step_s=record["step_s"],
        phase_s=dict(record["phase_s"]),
        simulated=False,
        series=dict(record["series"]),
        extra={"phase_peak_mem_gib": record["phase_peak_mem_gib"], "plan": record["plan"],
               "steps": record["steps"], "probe_wall_s": wall_s},
    )
