"""Where a verl probe's time goes: the start-up stages Ray, verl 0.9.1 and vLLM announce in the probe's log, and
the step lines, timed in seconds from the launch.

A live probe stamps each line as it arrives (`StageClock`); a kept log is read by the timestamps its lines carry
(`stages_from_log`: Ray's and verl's `YYYY-MM-DD HH:MM:SS,mmm`, vLLM's `MM-DD HH:MM:SS`), a line without one taking
the last seen. Nothing here imports verl, ray or vLLM.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import NamedTuple

from autotune.verl.metrics import parse_console_line

__all__ = ["STAGES", "StageClock", "describe_stages", "stage_durations", "stages_from_log"]


class Stage(NamedTuple):
    name: str
    pattern: re.Pattern
    source: str  # where the line is printed
    what: str  # what has happened by then


STAGES = (
    Stage("ray_up", re.compile(r"(Started a local Ray instance|Connected to Ray cluster)\."),
          "ray/_private/worker.py:2025-2027", "Ray is up (verl's main_ppo validated the config before)"),
    Stage("dataloader", re.compile(r"train and validate dataloader initialized"), "verl trainer/ppo/v1/trainer_base.py:760",
          "the TaskRunner actor started and read the dataset"),
    Stage("workers_created", re.compile(r"create worker group"), "verl trainer/ppo/v1/trainer_base.py:317",
          "the actor/ref worker processes exist"),
    Stage("engines_ready", re.compile(r"actor and ref model engine initialized"),
          "verl trainer/ppo/v1/trainer_base.py:330", "the checkpoint is loaded and FSDP/Megatron-wrapped"),
    Stage("vllm_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
          "vllm v1/engine/core.py", "vLLM loaded its weights, profiled, sized its KV cache, captured CUDA graphs"),
    Stage("rollout_ready", re.compile(r"checkpoint engine manager initialized"),
          "verl trainer/ppo/v1/trainer_base.py:388", "every rollout server is up"),
    Stage("ready_to_fit", re.compile(r"all initialize finished, ready to fit"),
          "verl trainer/ppo/v1/trainer_base.py:394", "the rollout slept and the training checkpoint is loaded"),
)
_BY_NAME = {s.name: s for s in STAGES}

_FULL = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})[,.](\d{3})")  # Ray, verl's logging
_VLLM = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG) (\d{2})-(\d{2}) (\d{2}:\d{2}:\d{2})\b")  # vLLM's logger


class StageClock:
    """The first time each stage's line arrives, and each step's, in seconds from the launch."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def see(self, line: str, at_s: float) -> None:
        for stage in STAGES:
            if stage.name not in self.seconds and stage.pattern.search(line):
                self.seconds[stage.name] = round(at_s, 2)

    def see_step(self, step: int, at_s: float) -> None:
        if step > 0:  # step 0 is the validation before training
            self.seconds.setdefault(f"step{step}", round(at_s, 2))


def _timestamp(line: str, year: int | None) -> _dt.datetime | None:
    if match := _FULL.search(line):
        return _dt.datetime.fromisoformat(f"{match.group(1)} {match.group(2)}.{match.group(3)}")
    if year is not None and (match := _VLLM.search(line)):
        return _dt.datetime.fromisoformat(f"{year}-{match.group(1)}-{match.group(2)} {match.group(3)}")
    return None


def stages_from_log(path: Path) -> dict[str, float]:
    """A kept probe log's stages, in seconds from its first timestamped line (Ray's first, about 20 s after the
    launch: the process start, Hydra and verl's config check come before it)."""
    clock = StageClock()
    first = last = None
    year = None
    for line in Path(path).read_text(errors="replace").splitlines():
        stamp = _timestamp(line, year)
        if stamp is not None:
            year = stamp.year
            first = first or stamp
            last = stamp
        if last is not None:
            clock.see(line, (last - first).total_seconds())
            if (step := parse_console_line(line)) is not None:
                clock.see_step(step.step, (last - first).total_seconds())
    return clock.seconds


def stage_durations(seconds: dict[str, float]) -> list[tuple[str, float]]:
    """(from -> to, seconds) between consecutive known stages, steps and the end, in launch order."""
    order = ["launch"] * ("end" in seconds) + _ordered(seconds)
    times = {**seconds, "launch": 0.0}
    return [(f"{a} -> {b}", round(times[b] - times[a], 1)) for a, b in zip(order, order[1:])]


def describe_stages(seconds: dict[str, float]) -> str:
    """One line: seconds from the launch at each stage, and the share of the probe the last (timed) step took."""
    marks = " . ".join(f"{name} {seconds[name]:.0f}" for name in _ordered(seconds))
    steps = [k for k in _ordered(seconds) if k.startswith("step")]
    if len(steps) >= 2 and seconds.get("end"):
        timed = seconds[steps[-1]] - seconds[steps[-2]]
        marks += f" (last step {timed:.0f} s, {100 * timed / seconds['end']:.0f}% of the probe)"
    return marks


def _ordered(seconds: dict[str, float]) -> list[str]:
    steps = sorted((k for k in seconds if k.startswith("step")), key=lambda k: int(k[4:]))
    return [s.name for s in STAGES if s.name in seconds] + steps + ["end"] * ("end" in seconds)
