"""Say why a verl probe failed, from its exit code and the tail of its log.

The strings are the ones verl 0.9.1, vLLM, torch, Ray and Hydra print (reference/verl.md sections
2 and 4.6); tests/verl/data/verl_failures/ holds real excerpts from verl issue threads and
docs, one file per case. The driver exits non-zero with a `RayTaskError(...)` wrapper, so the cause
is found by what the tail says, not by the exception type at the bottom.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["Failure", "FailureKind", "classify_failure"]


class FailureKind(str, Enum):
    CUDA_OOM = "cuda_oom"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    HOST_OOM = "host_oom"
    NCCL = "nccl"
    CONFIG_REJECTED = "config_rejected"
    ENVIRONMENT = "environment"
    HANG = "hang"
    INTERRUPTED = "interrupted"
    UNKNOWN = "unknown"


_GPU_MEMORY_KINDS = frozenset({FailureKind.CUDA_OOM, FailureKind.KV_CACHE_TOO_SMALL})
MAX_MESSAGE_CHARS = 300


@dataclass(frozen=True)
class Failure:
    """A classified probe failure: what, in which phase, and the log line that shows it."""

    kind: FailureKind
    phase: str | None
    message: str
    requested_gib: float | None = None

    @property
    def is_gpu_memory(self) -> bool:
        """True when the candidate did not fit on the GPU, the one failure a memory model predicts."""
        return self.kind in _GPU_MEMORY_KINDS


def _rx(*patterns: str) -> re.Pattern[str]:
    """One regex matching any of `patterns` (one search per line instead of one per pattern)."""
    return re.compile("|".join(f"(?:{p})" for p in patterns))


# Evidence, most specific cause first. Order matters: an OOM on one rank leaves the other ranks in an
# NCCL watchdog timeout, and every worker error reaches the driver wrapped in a RayTaskError, so
# memory evidence is looked for before NCCL evidence and nothing keys on the wrapper. vLLM's
# KV-cache check comes before a plain CUDA OOM because it names the knob to turn
# (gpu_memory_utilization / max_model_len) when both show up.
_KV_CACHE = _rx(
    # vLLM: KV cache profiling left no room (vllm/v1/core/kv_cache_utils.py; verl-project/verl#2245)
    r"No available memory for the cache blocks",
    # vLLM V1: one max-length request does not fit (kv_cache_utils.check_enough_kv_cache_memory)
    r"larger than the available KV cache memory",
    # vLLM V0 spelling of the same check (vllm/worker/worker.py raise_if_cache_size_invalid)
    r"larger than the maximum number of tokens that can be stored in KV cache",
    # vLLM V1 startup: the trainer still holds memory vLLM was told it may take (gpu_worker.py)
    r"Free memory on device .{0,120}is less than desired GPU memory utilization",
)
_CUDA_OOM = _rx(
    r"torch\.(?:cuda\.)?OutOfMemoryError",  # verl-project/verl#2828
    r"CUDA out of memory",
    # vLLM's cumem allocator on wake_up after a rollout sleep (verl-project/verl#302)
    r"(?i:CUDA error: out of memory)",
    # CUDA driver API code 2 = CUDA_ERROR_OUT_OF_MEMORY, as sglang's memory pool reports it
    r"CUresult error: 2 \(out of memory\)",
)
_HOST_OOM = _rx(
    # Ray memory monitor (verl-project/verl#2950, #1684)
    r"Task was killed due to the node running low on memory",
    r"killed due to memory pressure \(OOM\)",
    # torch DataLoader worker reaped by the kernel OOM killer
    r"killed by signal: Killed",
)
_CONFIG = _rx(
    # Hydra override rejected at composition (verl-project/verl#1080)
    r"Could not override '",
    r"ConfigCompositionException",
    r"OverrideParseException",
    # a structured config (verl's config dataclasses, hydra's instantiate) refusing a key the user set:
    # "Key 'foo' not in 'FSDPActorConfig'". Not "Key '...' is not in struct", which verl's own code hits at run
    # time (verl-project/verl#4157, tests/verl/data/verl_failures/unknown__rollout_correction_config_key.log)
    r"ConfigKeyError: Key '[^']+' not in '",
    r"__init__\(\) got an unexpected keyword argument '",
    # verl's own checks, verl.md section 2 (verl/utils/config.py, workers/config/*.py, engine_workers.py)
    r"must be divisible by",
    r"should be divisible by",
    r"is not divisible by",
    r"Please set at least one of '",
    r"You have set both '",
    r"must be >= actor\.ppo_mini_batch_size",
    r"max_token_len must be greater than the sequence length",
    r"Invalid loss_agg_mode",
    r"you must enable `use_remove_padding`",
    r"Rollout mode 'sync' has been removed",
    r"must be a multiple of tensor_model_parallel_size",
    r"must be equal to tensor_model_parallel_size",
    r"Got mini_batch_size=\d+ and dp_size=\d+",
)
_ENVIRONMENT = _rx(
    r"ModuleNotFoundError",
    r"\bImportError\b",
    r"No module named '",
    r"undefined symbol: ",
    r"CUDA driver version is insufficient",
    r"No CUDA GPUs are available",
    r"FileNotFoundError",  # missing data or model path (verl-project/verl#1763)
    # ray.init / a local Ray cluster that never came up
    r"Failed to connect to GCS",
    r"Could not find any running Ray instance",
    r"Failed to start the GCS",
    r"timed out during startup",
)
# A warning that names a missing module (e.g. vLLM's "No module named 'vllm._version'") is not
# why the run died.
_WARNING_LINE = re.compile(r"(?i)warning|warnings\.warn|falling back")
_NCCL = _rx(
    r"(?i:\bNCCL error\b)",
    r"nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error",
    r"Watchdog caught collective operation timeout",  # verl-project/verl#1158
)
_EVIDENCE: tuple[tuple[FailureKind, re.Pattern[str]], ...] = (
    (FailureKind.KV_CACHE_TOO_SMALL, _KV_CACHE),
    (FailureKind.CUDA_OOM, _CUDA_OOM),
    (FailureKind.HOST_OOM, _HOST_OOM),
    (FailureKind.CONFIG_REJECTED, _CONFIG),
    (FailureKind.ENVIRONMENT, _ENVIRONMENT),
    (FailureKind.NCCL, _NCCL),
)

# Phase markers: verl worker methods and the engines they drive. The last one in the tail wins.
_PHASE_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("rollout", re.compile(r"generate_sequences|wake_up|cumem|(?i:vllm)|(?i:sglang)|EngineCore|agent_loop")),
    ("old_log_prob", re.compile(r"compute_log_prob\b|old_log_prob")),
    ("ref", re.compile(r"compute_ref_log_prob|ref_log_prob\b")),
    ("update_actor", re.compile(r"update_actor\b|update_policy\b|\btrain_batch\b|train_mini_batch\b")),
    ("init", re.compile(r"init_model\b|_build_model_optimizer\b|init_workers\b")),
)
# Hydra echoes every override on failure ("Error executing job with overrides: [...]") and launch
# scripts are logged too; `rollout.name=vllm` there says nothing about where the run died.
_NOT_A_PHASE_LINE = re.compile(r"overrides: \[|\w(?:\.\w+){1,8}=")

_ANSI_RE = re.compile(r"\x1b?\[[0-9;]{0,12}m|\x1b\[[0-9;?]{0,12}[A-Za-z]")
_REQUESTED_RE = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(GiB|MiB|KiB|GB|MB)")
_UNIT_GIB = {"GiB": 1.0, "GB": 1.0, "MiB": 1 / 1024, "MB": 1 / 1024, "KiB": 1 / 1024**2}
_SIGKILL_CODES = frozenset({-9, 137})  # Popen's "killed by signal 9", and a shell's 128 + 9


def classify_failure(
    returncode: int | None, log_tail: str, *, hung: bool = False, interrupted: bool = False
) -> Failure:
    """Kind, phase and evidence of a failed probe; evidence in the log outranks the hang flag."""
    lines = _ANSI_RE.sub("", log_tail).splitlines()
    phase = _infer_phase(lines)
    if interrupted:
        return Failure(FailureKind.INTERRUPTED, phase, "stopped by the operator (interrupt)")
    found = _find_evidence(lines)
    if found is not None:
        kind, line, at = found
        # the phase at the error, not the last marker of the tail: lines logged after the error (other ranks,
        # the driver's teardown) must not move a rollout OOM to update_actor
        phase = _infer_phase(lines[: at + 1]) or phase
        requested = _requested_gib(line, lines) if kind is FailureKind.CUDA_OOM else None
        return Failure(kind, phase, _one_line(line), requested)
    if hung:
        return Failure(FailureKind.HANG, phase, _hang_message(lines))
    return Failure(FailureKind.UNKNOWN, phase, _unknown_message(returncode, lines))


def _find_evidence(lines: list[str]) -> tuple[FailureKind, str, int] | None:
    """First kind (in `_EVIDENCE` order) with a matching line, its last such line and that line's index."""
    for kind, pattern in _EVIDENCE:
        found = _last_matching_line(lines, pattern, skip_warnings=kind is FailureKind.ENVIRONMENT)
        if found is not None:
            return kind, *found
    return None


def _last_matching_line(lines: list[str], pattern: re.Pattern[str], *, skip_warnings: bool) -> tuple[str, int] | None:
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if pattern.search(line) and not (skip_warnings and _WARNING_LINE.search(line)):
            return line, index
    return None


def _infer_phase(lines: list[str]) -> str | None:
    """The phase of the last verl phase marker in the tail; None when there is none."""
    for line in reversed(lines):
        if _NOT_A_PHASE_LINE.search(line):
            continue
        phase = _last_phase_in_line(line)
        if phase is not None:
            return phase
    return None


def _last_phase_in_line(line: str) -> str | None:
    best_end, best_phase = -1, None
    for phase, marker in _PHASE_MARKERS:
        for match in marker.finditer(line):
            if match.end() > best_end:
                best_end, best_phase = match.end(), phase
    return best_phase


def _requested_gib(evidence: str, lines: list[str]) -> float | None:
    """The allocation torch failed on ("Tried to allocate 2.50 GiB"), in GiB."""
    candidates = [evidence, *reversed(lines)]
    for text in candidates:
        match = _REQUESTED_RE.search(text)
        if match:
            return float(match.group(1)) * _UNIT_GIB[match.group(2)]
    return None


def _one_line(text: str) -> str:
    """Evidence as one trimmed line of at most MAX_MESSAGE_CHARS characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_MESSAGE_CHARS else flat[: MAX_MESSAGE_CHARS - 3] + "..."


def _last_nonblank(lines: list[str]) -> str | None:
    return next((line for line in reversed(lines) if line.strip()), None)


def _hang_message(lines: list[str]) -> str:
    last = _last_nonblank(lines)
    return _one_line(f"no progress before the idle timeout; last line: {last}" if last else "no output at all")


def _unknown_message(returncode: int | None, lines: list[str]) -> str:
    """Exit status plus the last line; a bare SIGKILL is not assumed to be the OOM killer."""
    if returncode in _SIGKILL_CODES:
        status = f"killed by SIGKILL (exit {returncode}) with no cause in the log"
    elif returncode is None:
        status = "no exit status"
    else:
        status = f"exit {returncode}"
    last = _last_nonblank(lines)
    return _one_line(f"{status}; last line: {last}" if last else status)
