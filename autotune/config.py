"""What the user asks for: CLI flags plus an optional tune.yaml, validated into one frozen TuneConfig.

tune.yaml (every section optional):
    model: qwen2.5-7b           # the CLI's --model wins
    gpu: H200                   # GPU type for the model when none is detected (sim backend)
    workload: {train_batch_size: 1024, ppo_mini_batch_size: 256, rollout_n: 5,
               max_prompt_length: 512, max_response_length: 1024, train_files: ..., val_files: ...}
    fixed: {actor_engine: fsdp}                     # pin knobs
    ranges: {ppo_micro_batch_size_per_gpu: [2, 4, 8], gpu_memory_utilization: {low: 0.4, high: 0.8}}
    tune_workload: [ppo_mini_batch_size]            # opt in to tuning a workload knob
    probe: {warmup_steps: 1, timed_steps: 2}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autotune.errors import ConfigError
from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.workload import Workload

TUNE_YAML_KEYS = {"model", "gpu", "workload", "fixed", "ranges", "tune_workload", "probe"}
PROBE_KEYS = {"warmup_steps", "timed_steps"}
_STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True, kw_only=True)
class ProbeBudget:
    warmup_steps: int = 1  # run, not timed (vLLM and allocator warm-up; compile)
    timed_steps: int = 2  # verl needs >= 3 steps in total: some OOMs appear only when vLLM wakes in step 2

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "timed_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "warmup_steps" else 1):
                raise ConfigError(f"probe.{name} must be an integer >= {0 if name == 'warmup_steps' else 1}, "
                                  f"but got {name}={value!r}")


@dataclass(frozen=True, kw_only=True)
class TuneYaml:
    model: str | None = None
    gpu: str | None = None
    workload: Workload = field(default_factory=Workload)
    fixed: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    tune_workload: tuple[str, ...] = ()
    probe: ProbeBudget = field(default_factory=ProbeBudget)


@dataclass(frozen=True, kw_only=True)
class TuneConfig:
    model: ModelSpec
    gpu: GpuSpec
    gpus_per_node: int
    nodes: int
    backend: str  # resolved: sim | torch | verl
    trials: int
    storage_url: str
    study_name: str
    out_dir: Path
    seed: int | None
    workload: Workload
    fixed: dict
    ranges: dict
    tune_workload: tuple[str, ...]
    probe: ProbeBudget

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, but got {type(value).__name__}: {value!r}")
    return value


def load_tune_yaml(path: Path | None) -> TuneYaml:
    """Parse and validate tune.yaml; every problem is one ConfigError line naming the key."""
    if path is None:
        return TuneYaml()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    data = _mapping(data, f"{path}")
    unknown = sorted(set(map(str, data)) - TUNE_YAML_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(TUNE_YAML_KEYS)}")
    workload_raw = _mapping(data.get("workload"), "workload")
    unknown = sorted(set(map(str, workload_raw)) - set(Workload.field_names()))
    if unknown:
        raise ConfigError(f"{path}: unknown workload key(s) {unknown}; allowed: {Workload.field_names()}")
    probe_raw = _mapping(data.get("probe"), "probe")
    unknown = sorted(set(map(str, probe_raw)) - PROBE_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown probe key(s) {unknown}; allowed: {sorted(PROBE_KEYS)}")
    tune_workload = data.get("tune_workload") or []
    if not isinstance(tune_workload, list) or not all(isinstance(k, str) for k in tune_workload):
        raise ConfigError(f"{path}: tune_workload must be a list of knob names, but got {tune_workload!r}")
    for key in ("model", "gpu"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string, but got {data[key]!r}")
    try:
        workload = Workload(**workload_raw)
        probe = ProbeBudget(**probe_raw)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for name in ("train_files", "val_files"):
        if not isinstance(getattr(workload, name), str):
            raise ConfigError(f"{path}: workload.{name} must be a path string, but got {getattr(workload, name)!r}")
    return TuneYaml(model=data.get("model"), gpu=data.get("gpu"), workload=workload,
                    fixed=_mapping(data.get("fixed"), "fixed"), ranges=_mapping(data.get("ranges"), "ranges"),
                    tune_workload=tuple(tune_workload), probe=probe)


def check_study_name(name: str) -> str:
    if not _STUDY_NAME.match(name):
        raise ConfigError(f"--study must be 1-128 letters, digits, '.', '_' or '-', but got {name!r}")
    return name


def default_study_name(model: ModelSpec, gpus_per_node: int, nodes: int, backend: str) -> str:
    return f"{model.name}-{nodes}x{gpus_per_node}-{backend}"
