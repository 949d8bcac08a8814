"""--executor ray on a real local Ray instance with fake GPUs (simulated probes): several probes in flight,
one shared study, nothing lost or run twice; a two-node job reserves whole nodes."""

import pytest

ray = pytest.importorskip("ray")

from autotune.config import ProbeBudget, SearchOptions, TuneConfig  # noqa: E402
from autotune.hardware import get_gpu  # noqa: E402
from autotune.models import get_model  # noqa: E402
from autotune.search.ray_executor import run_study_ray  # noqa: E402
from autotune.workload import Workload  # noqa: E402


def _cfg(tmp_path, *, gpus_per_node=8, nodes=1, trials=12):
    return TuneConfig(model=get_model("qwen2.5-7b"), gpu=get_gpu("H200"), gpus_per_node=gpus_per_node, nodes=nodes,
                      backend="sim", trials=trials, storage_url=f"sqlite:///{tmp_path / 'a.db'}", study_name="r",
                      out_dir=tmp_path, seed=0, workload=Workload(), fixed={}, ranges={}, tune_workload=(),
                      probe=ProbeBudget(), search=SearchOptions(warm_start=2))


@pytest.fixture
def local_ray():
    ray.init(num_cpus=4, num_gpus=16, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_probes_run_as_ray_tasks_two_at_a_time(tmp_path, local_ray):
    seen = []
    study = run_study_ray(_cfg(tmp_path), on_trial=lambda t: seen.append(t.number))
    states = [t.state.name for t in study.trials]
    assert len(study.trials) == 12 and "RUNNING" not in states
    assert sorted(seen) == list(range(12)), "every trial reported once"
    assert study.trials[0].user_attrs["baseline"] and study.trials[0].user_attrs["state"] == "simulated"
    launched = [t for t in study.trials if t.user_attrs.get("launched")]
    assert launched and all(t.user_attrs["state"] in ("simulated", "oom") for t in launched)
    spans = [(t.datetime_start, t.datetime_complete) for t in launched]
    assert any(a[0] < b[0] < a[1] for a in spans for b in spans if a != b), "two probes were in flight at once"
    keys = [tuple(sorted(t.user_attrs["candidate"].items())) for t in launched if "duplicate_of" not in t.user_attrs]
    assert len(keys) == len(set(keys)), "no configuration probed twice"


def test_a_two_node_job_reserves_whole_nodes(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 8})
    cluster.add_node(num_cpus=2, num_gpus=8)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        study = run_study_ray(_cfg(tmp_path, nodes=2, trials=5))
        assert len(study.trials) == 5 and all(t.state.name != "RUNNING" for t in study.trials)
        assert any(t.user_attrs.get("state") == "simulated" for t in study.trials)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_cli_executor_ray_runs_and_exports(tmp_path):
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "autotune", "run", "--model", "qwen2.5-7b", "--gpus", "8", "--backend",
                           "sim", "--executor", "ray", "--trials", "8", "--out", str(tmp_path), "--quiet"],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "CUDA_VISIBLE_DEVICES": "",
                                                                             "RAY_DISABLE_DOCKER_CPU_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["trials_total"] == 8 and doc["best"] is not None and (tmp_path / "best.yaml").is_file()
