"""The Ray cluster a multi-node `autotune train` runs on (issue 32 item 6).

verl runs on more than one node only inside a Ray cluster started beforehand (verl docs/start/multinode.rst,
"Option 1: Launch Manually": `ray start --head --dashboard-host=0.0.0.0` on the head, `ray start --address=<head>:6379`
on each other node, then the trainer on the head). `ray.init()` with no address, as verl's main_ppo calls it, joins
the cluster `ray start` left on this machine (/tmp/ray/ray_current_cluster) or `RAY_ADDRESS`; without one it starts a
single-node Ray that never holds `nnodes x n_gpus_per_node` GPUs, and verl waits on its placement group for ever.
"""

from __future__ import annotations

import json
import subprocess
import sys

RAY_PORT = 6379  # `ray start --head`'s default GCS port

# Finds the cluster verl's ray.init() (no address) would join, as Ray resolves it, and asks it for its GPUs and nodes;
# never starts one. Ray reads RAY_ADDRESS, else the address `ray start` left in <temp>/ray/ray_current_cluster,
# <temp> being RAY_TMPDIR, else TMPDIR on Linux, else /tmp (ray/_private/services.py get_ray_address_from_environment,
# ray/_common/utils.py get_default_system_temp_dir). address="auto" would also scan the process table for any GCS,
# which finds clusters verl would not join (a test's, another user's).
_PROBE = """
import json, os, sys
address = os.environ.get("RAY_ADDRESS") or ""
if not address or address == "auto":
    temp = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    path = os.path.join(temp or "/tmp", "ray", "ray_current_cluster")
    address = open(path).read().strip() if os.path.exists(path) else ""
if not address:
    sys.exit(3)
import ray
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
print(json.dumps({"gpus": ray.cluster_resources().get("GPU", 0),
                  "nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}))
"""


def ray_start_lines(nodes: int) -> list[str]:
    """Shell comments: what to run on each node before the trainer (verl docs/start/multinode.rst)."""
    return [f"# {nodes} nodes: start a Ray cluster first (verl docs/start/multinode.rst), then run the line below on "
            "the head node",
            f"#   on the head node:  ray start --head --dashboard-host=0.0.0.0 --port={RAY_PORT}",
            f"#   on the {nodes - 1} other node(s): ray start --address=<head node IP>:{RAY_PORT}",
            f"#   then:              ray status   (lists {nodes} active nodes)"]


def cluster_shortfall(nodes: int, gpus_per_node: int, *, python: str = sys.executable,
                      timeout_s: float = 60.0) -> str | None:
    """Why the Ray cluster this machine would join cannot hold the job (None when it can)."""
    need = nodes * gpus_per_node
    start = f"start one: ray start --head on this node, ray start --address=<this node's IP>:{RAY_PORT} on the others"
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"the Ray cluster did not answer in {timeout_s:.0f} s (ray status tells why)"
    if proc.returncode == 3:
        return f"trainer.nnodes is {nodes}, which needs a running Ray cluster, and none was found; {start}"
    if proc.returncode != 0:
        if "No module named 'ray'" in proc.stderr:
            return "Ray is not installed here (verl installs it: pip install verl)"
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1][:200]
        return f"trainer.nnodes is {nodes}, and the Ray cluster this machine would join did not answer ({last}); {start}"
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"could not read the Ray cluster's resources ({proc.stdout.strip()[-200:]!r})"
    if found["gpus"] < need or found["nodes"] < nodes:
        return (f"the Ray cluster has {found['nodes']} node(s) and {found['gpus']:.0f} GPUs; the job needs {nodes} x "
                f"{gpus_per_node} = {need} (ray start --address=<head node IP>:{RAY_PORT} on the missing nodes)")
    return None
