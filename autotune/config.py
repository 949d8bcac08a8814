"""What the user asks for: CLI flags plus an optional tune.yaml, validated into one frozen TuneConfig.

tune.yaml (every section optional):
    model: qwen2.5-7b           # the CLI's --model wins
    gpu: H200                   # GPU type for the model when none is detected (sim backend)
    workload: {train_batch_size: 1024, ppo_mini_batch_size: 256, rollout_n: 5,
               max_prompt_length: 512, max_response_length: 1024, train_files: ..., val_files: ...}
    fixed: {actor_engine: fsdp}                     # pin knobs
    ranges: {ppo_micro_batch_size_per_gpu: [2, 4, 8], gpu_memory_utilization: {low: 0.4, high: 0.8}}
    tune_workload: [ppo_mini_batch_size]            # opt in to tuning a workload knob
    probe: {warmup_steps: 1, timed_steps: 2, configs_per_launch: 4}   # verl: 4 configurations per launch
    search: {objective: throughput, warm_start: 3, prescreen: true, boundaries: true, learn: true, memory_margin_gib: 0}
    budget: {probes: 20, gpu_hours: 8, wall_time_s: 14400}   # whichever ends first
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from autotune.errors import ConfigError
from autotune.hardware import GpuSpec
from autotune.models import ModelSpec
from autotune.workload import Workload

if TYPE_CHECKING:
    from autotune.spaces.candidate import Candidate

TUNE_YAML_KEYS = {"model", "gpu", "workload", "fixed", "ranges", "tune_workload", "probe", "search", "budget"}
PROBE_KEYS = {"warmup_steps", "timed_steps", "configs_per_launch"}
BUDGET_KEYS = {"probes", "gpu_hours", "wall_time_s"}
OBJECTIVES = ("throughput", "throughput_and_memory")
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # fullmatch: `$` would let a final newline in
MAX_TUNE_YAML_BYTES = 1 << 20  # a tune.yaml is a few lines; this also stops --config /dev/zero
MAX_YAML_NODES = 100_000  # values after expanding aliases: a "billion laughs" file is refused, not expanded
MAX_PROBE_STEPS = 100  # a probe measures a few steps; more is a full training run
MAX_CONFIGS_PER_LAUNCH = 16


@dataclass(frozen=True, kw_only=True)
class ProbeBudget:
    warmup_steps: int = 1  # run, not timed (vLLM and allocator warm-up; compile)
    timed_steps: int = 2  # verl needs >= 3 steps in total: some OOMs appear only when vLLM wakes in step 2
    # configurations one launch measures, switching the per-step knobs between steps (autotune/verl/step_knobs.py);
    # None: the backend's default (verl 4, the others 1)
    configs_per_launch: int | None = None

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "timed_steps"):
            value = getattr(self, name)
            low = 0 if name == "warmup_steps" else 1
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_PROBE_STEPS:
                raise ConfigError(f"probe.{name} must be an integer >= {low} (at most {MAX_PROBE_STEPS}), "
                                  f"but got {name}={value!r}")
        n = self.configs_per_launch
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CONFIGS_PER_LAUNCH):
            raise ConfigError(f"probe.configs_per_launch must be an integer in 1..{MAX_CONFIGS_PER_LAUNCH}, "
                              f"but got {n!r}")


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    objective: str = "throughput"  # or throughput_and_memory: a Pareto front of tokens/s against peak memory
    memory_margin_gib: float = 0.0  # multi-objective pick: fastest trial with at least this much headroom
    warm_start: int = 3  # the cost model's top predictions enqueued after verl's default (0: none)
    prescreen: bool = True  # reject predicted OOMs before launch
    boundaries: bool = True  # infer OOMs from measured ones (monotone memory)
    learn: bool = True  # propose from the model corrected by every probe's phases (search/learned.py)
    confirm: int = 2  # leaders within noise probed again before export (search/confirm.py; 0: none)
    verify: bool = True  # after confirming, the export probed once more for the score shown (search/confirm.py)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"search.objective must be one of {', '.join(OBJECTIVES)}, but got {self.objective!r}")
        if not isinstance(self.memory_margin_gib, (int, float)) or isinstance(self.memory_margin_gib, bool) \
                or not 0 <= self.memory_margin_gib < math.inf:
            raise ConfigError(f"search.memory_margin_gib must be a number >= 0, but got {self.memory_margin_gib!r}")
        if not isinstance(self.warm_start, int) or isinstance(self.warm_start, bool) or not 0 <= self.warm_start <= 20:
            raise ConfigError(f"search.warm_start must be an integer in 0..20, but got {self.warm_start!r}")
        if not isinstance(self.confirm, int) or isinstance(self.confirm, bool) or not 0 <= self.confirm <= 10:
            raise ConfigError(f"search.confirm must be an integer in 0..10, but got {self.confirm!r}")
        for name in ("prescreen", "boundaries", "learn", "verify"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"search.{name} must be true or false, but got {getattr(self, name)!r}")

    @property
    def multi_objective(self) -> bool:
        return self.objective == "throughput_and_memory"


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Stop the search at whichever comes first (None: no limit of that kind)."""

    probes: int | None = None  # launched probes (rejected and inferred candidates cost none)
    gpu_hours: float | None = None  # probe wall time x GPUs of the job
    wall_time_s: float | None = None  # of this run

    def __post_init__(self) -> None:
        for name in ("probes", "gpu_hours", "wall_time_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf \
                    or (name == "probes" and not isinstance(value, int)):
                raise ConfigError(f"budget.{name} must be a positive {'integer' if name == 'probes' else 'number'}, "
                                  f"but got {name}={value!r}")


def with_budget(budget: Budget, duration_s: float | None, world_size: int) -> Budget:
    """`--budget 45m`: the job's GPUs held by probes for that long, as GPU-hours; it replaces tune.yaml's."""
    if duration_s is None:
        return budget
    return replace(budget, gpu_hours=duration_s / 3600 * world_size)


@dataclass(frozen=True, kw_only=True)
class TuneYaml:
    model: str | None = None
    gpu: str | None = None
    workload: Workload = field(default_factory=Workload)
    fixed: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    tune_workload: tuple[str, ...] = ()
    probe: ProbeBudget = field(default_factory=ProbeBudget)
    search: SearchOptions = field(default_factory=SearchOptions)
    budget: Budget = field(default_factory=Budget)


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
    search: SearchOptions = field(default_factory=SearchOptions)
    budget: Budget = field(default_factory=Budget)
    # from the user's own job (--from): their system values, measured first, and every key autotune does not
    # model, exported unchanged
    baseline: "Candidate | None" = None
    passthrough: dict = field(default_factory=dict)
    source: str | None = None
    env: dict = field(default_factory=dict)  # what the job's launch script exports: probes, best.yaml and train get it
    # RAM of one node where probes run (GiB): offloaded states must fit in it; None: not checked
    host_mem_gib: float | None = None
    # verl computes log-probs with its per-token loop where the probes run (no flash-attn cross-entropy:
    # autotune/verl/logprob_path.py); the time model prices it (model/cost.py logprob_loop_s)
    logprob_loop: bool = False

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def vllm_eager(self) -> bool:
        """The job runs vLLM without CUDA graphs (its rollout.enforce_eager, kept; model/cost.py prices it)."""
        from autotune.verl.rollout import vllm_eager

        return vllm_eager(self.passthrough)


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, but got {type(value).__name__}: {value!r}")
    return value


def _section(data: dict, name: str, allowed: set, path) -> dict:
    """One tune.yaml section as a mapping whose keys are all known."""
    raw = _mapping(data.get(name), name)
    unknown = sorted(set(map(str, raw)) - allowed)
    if unknown:
        raise ConfigError(f"{path}: unknown {name} key(s) {unknown}; allowed: {sorted(allowed)}")
    return raw


def _absolute_files(workload: Workload) -> Workload:
    """The data files as verl can open them from any folder: `~` expanded, relative to where autotune runs
    (autotune/verl/paths.py)."""
    from autotune.verl.paths import absolute_files

    return replace(workload, train_files=absolute_files(workload.train_files, Path.cwd()),
                   val_files=absolute_files(workload.val_files, Path.cwd()))


def load_tune_yaml(path: Path | None) -> TuneYaml:
    """Parse and validate tune.yaml; every problem is one ConfigError line naming the key."""
    if path is None:
        return TuneYaml(workload=_absolute_files(Workload()))
    data = _mapping(load_yaml_file(Path(path)), f"{path}")
    unknown = sorted(set(map(str, data)) - TUNE_YAML_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(TUNE_YAML_KEYS)}")
    workload_raw = _section(data, "workload", set(Workload.field_names()) | {"response_length"}, path)
    probe_raw = _section(data, "probe", PROBE_KEYS, path)
    tune_workload = data.get("tune_workload") or []
    if not isinstance(tune_workload, list) or not all(isinstance(k, str) for k in tune_workload):
        raise ConfigError(f"{path}: tune_workload must be a list of knob names, but got {tune_workload!r}")
    for key in ("model", "gpu"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be a string, but got {data[key]!r}")
    search_raw = _section(data, "search", {f.name for f in fields(SearchOptions)}, path)
    budget_raw = _section(data, "budget", BUDGET_KEYS, path)
    try:
        workload = Workload(**Workload.expand_response_length(workload_raw))
        probe = ProbeBudget(**probe_raw)
        search = SearchOptions(**search_raw)
        budget = Budget(**budget_raw)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for name in ("train_files", "val_files"):
        value = getattr(workload, name)
        if not (isinstance(value, str) or isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: workload.{name} must be a path or a list of paths, but got {value!r}")
    workload = _absolute_files(workload)
    return TuneYaml(model=data.get("model"), gpu=data.get("gpu"), workload=workload,
                    fixed=_mapping(data.get("fixed"), "fixed"), ranges=_mapping(data.get("ranges"), "ranges"),
                    tune_workload=tuple(tune_workload), probe=probe, search=search, budget=budget)


def load_yaml_file(path: Path):
    """A small YAML file, or one ConfigError line: not a regular file, too big, not UTF-8, not YAML, nested
    too deeply, or more than MAX_YAML_NODES values once aliases are expanded."""
    try:
        if path.exists() and not path.is_file():  # a folder, /dev/zero, a pipe
            raise ConfigError(f"cannot read --config {path}: not a regular file")
        with path.open("rb") as fh:
            raw = fh.read(MAX_TUNE_YAML_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read --config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_TUNE_YAML_BYTES:
        raise ConfigError(f"--config {path}: larger than {MAX_TUNE_YAML_BYTES >> 20} MiB; not a tune.yaml")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    _check_size(data, path)
    return data


def _check_size(data, path: Path) -> None:
    """Count values as if aliases were copied (iteratively: no recursion); refuse past MAX_YAML_NODES."""
    stack, seen = [data], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise ConfigError(f"{path}: more than {MAX_YAML_NODES} values once YAML aliases are expanded")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_study_name(name: str) -> str:
    if not _STUDY_NAME.fullmatch(name):
        raise ConfigError(f"--study must be 1-128 letters, digits, '.', '_' or '-', but got {name!r}")
    return name


def default_study_name(model: ModelSpec, gpus_per_node: int, nodes: int, backend: str) -> str:
    return f"{model.name}-{nodes}x{gpus_per_node}-{backend}"
