"""The sim study most search tests start from: Qwen2.5-7B on one node of 8 H200s, verl's default workload."""

from __future__ import annotations

from pathlib import Path

from autotune.config import ProbeBudget, TuneConfig
from autotune.hardware import get_gpu
from autotune.models import get_model
from autotune.workload import Workload


def sim_cfg(tmp_path: Path, trials=12, **kw) -> TuneConfig:
    base = dict(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=8, nodes=1, backend="sim",
                trials=trials, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="s", out_dir=tmp_path,
                seed=3, workload=Workload(), fixed={}, ranges={}, tune_workload=(), probe=ProbeBudget())
    base.update(kw)
    return TuneConfig(**base)
