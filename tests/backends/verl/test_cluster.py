"""A multi-node `autotune train`: the Ray start lines in --dry-run, and a refusal in one line when the Ray cluster
this machine would join cannot hold nnodes x n_gpus_per_node (issue 32 item 6). The cluster is Ray's own
multi-node-on-one-machine double (ray.cluster_utils.Cluster) with declared GPUs."""

import os
import subprocess
import sys

import pytest

from autotune.backends.verl.cluster import cluster_shortfall

STUDY_ARGS = ["--model", "qwen2.5-7b", "--gpus", "8", "--backend", "sim", "--trials", "2", "--quiet"]


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "autotune", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})})


@pytest.fixture(scope="module")
def two_node_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    run = cli("run", *STUDY_ARGS, "--nodes", 2, "--out", root / "out")
    assert run.returncode == 0, run.stderr
    for name in ("train.parquet", "test.parquet"):
        (root / name).write_bytes(b"")
    return root / "out" / "best.yaml", [f"data.train_files={root / 'train.parquet'}",
                                        f"data.val_files={root / 'test.parquet'}"]


def test_dry_run_of_two_nodes_prints_the_ray_cluster_steps_first(two_node_export):
    config, data = two_node_export
    dry = cli("train", "--config", config, "--dry-run", *data)
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("# 2 nodes: start a Ray cluster first")
    assert "ray start --head --dashboard-host=0.0.0.0 --port=6379" in lines[1]
    assert "on the 1 other node(s): ray start --address=<head node IP>:6379" in lines[2]
    assert all(line.startswith("#") for line in lines[:-1])  # the output pastes into a shell as it is
    assert " -m verl.trainer.main_ppo " in lines[-1]
    one = cli("train", "--config", config, "--dry-run", "trainer.nnodes=1", *data)
    assert one.returncode == 0 and "ray start" not in one.stdout


def test_two_nodes_without_a_ray_cluster_is_refused_in_one_line(two_node_export, tmp_path):
    pytest.importorskip("ray")
    config, data = two_node_export
    # no cluster to join: a fresh temp dir has no ray_current_cluster, and no RAY_ADDRESS
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "autotune", "train", "--config", str(config), *data],
                          capture_output=True, text=True, timeout=120,
                          env={**env, "CUDA_VISIBLE_DEVICES": "", "RAY_TMPDIR": str(tmp_path)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "trainer.nnodes is 2, which needs a running Ray cluster, and none was found" in proc.stderr


def test_a_bad_node_count_is_one_line(two_node_export):
    config, data = two_node_export
    proc = cli("train", "--config", config, "--dry-run", "trainer.nnodes=two", *data)
    assert proc.returncode == 2 and "trainer.nnodes must be a whole number of at least 1, but is 'two'" in proc.stderr


# Ray's two-node Cluster runs in a process of its own: started in the test process, its gRPC threads stay behind,
# and a later test in this worker that forks (verl/judge.py's Pool) deadlocks in the child (seen in CI under xdist).
_CLUSTER = """
import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 8})
cluster.add_node(num_cpus=1, num_gpus=8)
cluster.wait_for_nodes()
print(cluster.address, flush=True)
sys.stdin.read()  # until the test closes it
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def ray_two_nodes():
    pytest.importorskip("ray")
    import shutil
    import tempfile

    # a Ray temp dir of its own (short: Ray's socket paths have a length limit), so that the address file this
    # cluster writes is never found by a plain ray.init() elsewhere
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    proc = subprocess.Popen([sys.executable, "-c", _CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RAY_TMPDIR": temp})
    try:
        address = proc.stdout.readline().strip()
        assert address, "the two-node Ray cluster did not start"
        yield address
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_the_cluster_is_read_for_its_nodes_and_gpus(ray_two_nodes, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_two_nodes)  # what ray.init() in verl's main_ppo would join
    assert cluster_shortfall(2, 8) is None
    assert cluster_shortfall(2, 16) == ("the Ray cluster has 2 node(s) and 16 GPUs; the job needs 2 x 16 = 32 "
                                        "(ray start --address=<head node IP>:6379 on the missing nodes)")
    assert cluster_shortfall(4, 4).startswith("the Ray cluster has 2 node(s) and 16 GPUs; the job needs 4 x 4 = 16")
