"""Read verl's per-step metrics from its console lines and from its `file` logger's JSONL.

Both formats are verl 0.9.1's (reference/verl.md section 4):
- console: `Tracking` prints `step:N - key:value - ...` through `concat_dict_to_str`, values as
  `pprint.pformat` reprs, inside the TaskRunner Ray actor, so the driver's stdout carries a coloured
  `(TaskRunnerV1 pid=...)` prefix (verl/utils/logger/aggregate_logger.py:26-49);
- file: `{"step": N, "data": {...}}` per line, written unbuffered with orjson, NaN as null
  (verl/utils/tracking.py:529-548).
Nothing here imports verl, torch or ray.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["JsonlTail", "ProbeSummary", "StepMetrics", "parse_console_line", "summarize"]


@dataclass(frozen=True)
class StepMetrics:
    """The numeric metrics verl logged for one step (step 0 is the pre-training validation)."""

    step: int
    metrics: dict[str, float]


# ---------------------------------------------------------------------------------------------
# Console lines
# ---------------------------------------------------------------------------------------------

# Ray colours the actor prefix; copies pasted from a terminal often keep "[36m" without the ESC.
_ANSI_RE = re.compile(r"\x1b?\[[0-9;]{0,12}m|\x1b\[[0-9;?]{0,12}[A-Za-z]")
# `step:N` that starts the logger's line; not `training/global_step:N` or `timing_s/step:...`.
# The digit cap keeps int() away from Python's 4300-digit limit.
_STEP_RE = re.compile(r"(?:^|[^\w/.])step:(\d{1,18})(?=\s+-\s|\s*$)")
# pprint reprs verl emits: plain numbers, nan/inf, True/False, numpy-2 `np.float64(0.2)`.
_NUMPY_WRAP_RE = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")
# (written so that no two parts can split the same digits: linear time on any input)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)")
_BOOLS = {"True": 1.0, "False": 0.0}
_ITEM_SEP = " - "
# Ray's log deduplication appends this to a line (e.g. "... 'vllm._version' [repeated 7x across
# cluster]" in PRIME-RL/PRIME#16); left on a step line it would hide the last metric.
_RAY_REPEAT_RE = re.compile(r"\[repeated \d+x across cluster\]\s*$")


def parse_console_line(line: str) -> StepMetrics | None:
    """Metrics of one verl console step line, or None for any other line; never raises."""
    clean = _RAY_REPEAT_RE.sub("", _ANSI_RE.sub("", line))
    match = _STEP_RE.search(clean)
    if match is None:
        return None
    items = clean[match.end() :].split(_ITEM_SEP)
    return StepMetrics(step=int(match.group(1)), metrics=_parse_items(items))


def _parse_items(items: Iterable[str]) -> dict[str, float]:
    """`key:value` items to floats; items cut short (a truncated copy) or non-numeric are dropped."""
    metrics: dict[str, float] = {}
    for item in items:
        key, sep, raw = item.strip().partition(":")
        value = _parse_value(raw) if sep and key else None
        if value is not None:
            metrics[key] = value
    return metrics


def _parse_value(raw: str) -> float | None:
    """One pprint repr to a float: `0.21`, `-1e-05`, `nan`, `True`, `np.float64(0.21)`."""
    text = raw.strip()
    wrapped = _NUMPY_WRAP_RE.match(text)
    if wrapped:
        text = wrapped.group(1).strip()
    if text in _BOOLS:
        return _BOOLS[text]
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return float(text)
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------------------------
# JSONL written by verl's `file` logger
# ---------------------------------------------------------------------------------------------

# A line without a newline this long is not a metrics record in progress; drop it.
_MAX_PENDING_BYTES = 64 * 2**20


class JsonlTail:
    """Incremental reader of the `file` logger's JSONL, safe while verl is still writing it.

    verl opens the file unbuffered, so the last line may be half written; it is kept until its
    newline arrives. If the file shrinks (verl reopens with "wb"), reading starts over.
    """

    def __init__(self, path: Path | str) -> None:
        self._path = Path(path)
        self._offset_bytes = 0
        self._pending = b""

    @property
    def path(self) -> Path:
        return self._path

    def read_new(self) -> list[StepMetrics]:
        """Steps from the complete lines written since the last call; [] if the file is missing."""
        chunk = self._read_chunk()
        if not chunk:
            return []
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > _MAX_PENDING_BYTES:
            self._pending = b""
        parsed = (_parse_jsonl_record(line) for line in lines)
        return [step for step in parsed if step is not None]

    def _read_chunk(self) -> bytes:
        """Bytes appended since the last read; resets when the file was truncated."""
        try:
            with self._path.open("rb") as fh:
                size = fh.seek(0, 2)
                if size < self._offset_bytes:
                    self._offset_bytes, self._pending = 0, b""
                fh.seek(self._offset_bytes)
                chunk = fh.read(size - self._offset_bytes)
        except OSError:
            return b""
        self._offset_bytes += len(chunk)
        return chunk


def _parse_jsonl_record(line: bytes) -> StepMetrics | None:
    """One `{"step": N, "data": {...}}` record; None for garbage."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    step = _json_step(record.get("step"))
    if step is None:
        return None
    metrics = {k: v for k, v in ((k, _json_value(v)) for k, v in record["data"].items()) if v is not None}
    return StepMetrics(step=step, metrics=metrics)


def _json_step(value: object) -> int | None:
    """The record's step: an int (bools are not steps)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _json_value(value: object) -> float | None:
    """A metric value; orjson writes NaN as null, so null reads back as NaN."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return None
    return None


# ---------------------------------------------------------------------------------------------
# Summary of one probe
# ---------------------------------------------------------------------------------------------

THROUGHPUT_KEY = "perf/throughput"  # tokens / s / GPU (verl metric_utils.py:655-688)
MFU_KEY = "perf/mfu/actor"
STEP_TIME_KEY = "timing_s/step"
PHASES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights", "step")
# 0.9.x renames the worker's perf/max_memory_* to actor/perf/... (rename_dict); older verl, e.g.
# verl-project/verl#2060, logged them unprefixed. Prefer the new name, fall back to the old one.
ALLOCATED_KEYS = ("actor/perf/max_memory_allocated_gb", "perf/max_memory_allocated_gb")
RESERVED_KEYS = ("actor/perf/max_memory_reserved_gb", "perf/max_memory_reserved_gb")
# the prompt and response lengths verl measured in each step (trainer/ppo/metric_utils.py:573, 589): the job's own,
# where the workload only assumes them (prompt_fill, mean_response_length)
PROMPT_MEAN_KEY = "prompt_length/mean"
RESPONSE_MEAN_KEY = "response_length/mean"


@dataclass(frozen=True)
class ProbeSummary:
    """What one probe measured, medians over the timed steps (gpt-fast style), plus raw series."""

    timed_steps: int
    tokens_per_s_per_gpu: float
    mfu_actor: float | None
    step_s: float
    phase_s: dict[str, float] = field(default_factory=dict)
    peak_mem_gib: float | None = None
    reserved_mem_gib: float | None = None
    series: dict[str, list[float]] = field(default_factory=dict)


def summarize(steps: list[StepMetrics], warmup_steps: int) -> ProbeSummary:
    """Median throughput and timings of the timed steps; memory peaks of every training step.

    Step 0 is verl's validation line and the first `warmup_steps` training steps are cold (vLLM
    graph capture, allocator growth), so neither is timed. Memory peaks do include the warm-up
    steps: a peak reached there is reached in the real run too.
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, but got {warmup_steps=}")
    training = _training_steps(steps)
    timed = training[warmup_steps:]
    if not timed:
        raise ValueError(
            f"no timed steps: {len(training)} training step(s) logged and {warmup_steps=}; "
            "the probe must log at least warmup_steps + 1 steps after step 0"
        )
    return ProbeSummary(
        timed_steps=len(timed),
        tokens_per_s_per_gpu=_required_median(timed, THROUGHPUT_KEY),
        mfu_actor=_median(timed, MFU_KEY),
        step_s=_required_median(timed, STEP_TIME_KEY),
        phase_s=_phase_medians(timed),
        peak_mem_gib=_max_of_first_present(training, ALLOCATED_KEYS),
        reserved_mem_gib=_max_of_first_present(training, RESERVED_KEYS),
        series=_series(timed),
    )


def _training_steps(steps: Iterable[StepMetrics]) -> list[StepMetrics]:
    """Steps >= 1 in step order; a step logged twice (console and JSONL both read) keeps the last."""
    by_step = {s.step: s for s in steps if s.step >= 1}
    return [by_step[n] for n in sorted(by_step)]


def _values(steps: Iterable[StepMetrics], key: str) -> list[float]:
    """Finite values of `key` across steps (NaN is how a failed reduction shows up)."""
    return [s.metrics[key] for s in steps if key in s.metrics and math.isfinite(s.metrics[key])]


def _median(steps: list[StepMetrics], key: str) -> float | None:
    values = _values(steps, key)
    return statistics.median(values) if values else None


def _required_median(steps: list[StepMetrics], key: str) -> float:
    """Median of a metric the score needs; its absence means the probe cannot be scored."""
    value = _median(steps, key)
    if value is None:
        raise ValueError(f"no finite {key!r} in the {len(steps)} timed step(s); cannot score the probe")
    return value


def _phase_medians(steps: list[StepMetrics]) -> dict[str, float]:
    medians = {phase: _median(steps, f"timing_s/{phase}") for phase in PHASES}
    return {phase: value for phase, value in medians.items() if value is not None}


def _max_of_first_present(steps: list[StepMetrics], keys: tuple[str, ...]) -> float | None:
    """Max of the first key in `keys` that any step logged."""
    for key in keys:
        values = _values(steps, key)
        if values:
            return max(values)
    return None


def _series_keys() -> tuple[str, ...]:
    phase_keys = tuple(f"timing_s/{phase}" for phase in PHASES)
    return (THROUGHPUT_KEY, MFU_KEY, *phase_keys, *ALLOCATED_KEYS, *RESERVED_KEYS, PROMPT_MEAN_KEY, RESPONSE_MEAN_KEY)


def _series(steps: list[StepMetrics]) -> dict[str, list[float]]:
    """Raw per-step values (NaN kept) of every summarized key that was logged."""
    series = {key: [s.metrics[key] for s in steps if key in s.metrics] for key in _series_keys()}
    return {key: values for key, values in series.items() if values}


# ---------------------------------------------------------------------------------------------
# One rollout for every configuration of a shared launch
# ---------------------------------------------------------------------------------------------

# verl 0.9.1's v1 trainer times `gen` as its wait on the replay buffer (trainer/ppo/v1/trainer_base.py:565-574), and
# the synchronous buffer checks for the finished rollout every 2.0 s (trainer/ppo/v1/replay_buffer.py:144, 409; not a
# config key): a step's gen is the rollout rounded up to that grid. On the H200 and H100 runs of the recipe job every
# gen was 10.1, 12.1, 14.1 or 16.2 s, so two steps of one vLLM engine differ by 2-4 s that no training knob caused.
REPLAY_POLL_S = 2.0
GEN_KEY = "timing_s/gen"
TOKENS_KEY = "perf/total_num_tokens"
# a shared launch member's per-step tokens/s with the launch's rollout (with_launch_rollout): what it is scored by
LAUNCH_ROLLOUT_KEY = "autotune/throughput_at_launch_rollout"


def launch_rollout(steps: Iterable[StepMetrics]) -> tuple[float, float] | None:
    """(median gen seconds, median tokens) over the timed steps of one launch; None without both."""
    usable = [s for s in steps if s.metrics.get(GEN_KEY, 0) > 0 and s.metrics.get(TOKENS_KEY, 0) > 0]
    if not usable:
        return None
    return (statistics.median(s.metrics[GEN_KEY] for s in usable),
            statistics.median(s.metrics[TOKENS_KEY] for s in usable))


def with_launch_rollout(metrics: dict[str, float], rollout: tuple[float, float]) -> float | None:
    """tokens/s/GPU of a step as if its rollout had taken the launch's median, scaled by the step's tokens.

    Every configuration of a shared launch runs the same vLLM engine (their restart key holds the rollout settings),
    and the knobs switched between steps are the trainer's micro-batches and token budgets, which the rollout never
    reads: the differences between their gen times are the poll grid above and the batch, not the configuration.
    None where the step lacks the figures."""
    gen_s, tokens = rollout
    try:
        step_s, own_gen_s, n = metrics[STEP_TIME_KEY], metrics[GEN_KEY], metrics[TOKENS_KEY]
        throughput = metrics[THROUGHPUT_KEY]
    except KeyError:
        return None
    adjusted_s = step_s - own_gen_s + gen_s * n / tokens
    return throughput * step_s / adjusted_s if adjusted_s > 0 else None
