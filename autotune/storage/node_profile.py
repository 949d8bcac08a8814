"""What studies learned about a kind of node, kept for the next study on the same kind (issue 29 item 4).

A node profile holds, per GRPO phase, the log of measured over predicted seconds of every measured probe of every
study run on one kind of node, the step's seconds outside the timed phases, what a launch cost each study beyond
its timed steps, and each fit's measured over predicted GPU peak. The kind is the key: GPU type,
NVIDIA driver, torch, vLLM and verl versions, the attention implementation, the probe backend and the time model's
revision (model/cost.py MODEL_REVISION: the residuals are against it); any difference (a verl upgrade, flash-attention
instead of SDPA, a model that prices a new cause) is another kind, so nothing is reused across it. Simulated
probes never enter a profile.

The profiles are small JSON files, one per kind, in `$AUTOTUNE_PROFILE_DIR` or `~/.cache/autotune/node-profiles/`,
for the user to read and delete. Each file keeps every study's own rows under the study's name, so a resumed study
replaces its rows instead of counting them twice.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from autotune.model.cost import MODEL_REVISION

PROFILE_ATTR = "node_profile"  # the study attribute: the profile a study started from (or why none)
PROFILE_DIR_ENV = "AUTOTUNE_PROFILE_DIR"
MIN_PROFILE_PROBES = 2  # one probe's residual is as much its configuration's as the node's
# how a profile's rows are keyed (profile_row) and priced; another layout starts new profiles, as a new time model
# does. 2026-12-08: each probe priced at the prompt and response lengths it measured (search/node_prior.py)
PROFILE_ROWS = "2026-12-08-measured-lengths"
EAGER_SUFFIX = "@eager"


def profile_row(phase: str, eager_decode: bool) -> str:
    """The profile row a phase's residual is kept in and read from. vLLM's eager decode (rollout.enforce_eager) is
    host-bound: every decode step launches its kernels layer by layer at the host CPU's pace, which the time model
    prices with one constant fitted on the H200 node (model/cost.py _rollout_s). So an eager job's gen residual
    measures the host, not what a job with CUDA graphs will see on the node: on one H100 (2026-12-07,
    benchmarks/results/h100-2026-12-07-verl-profile) gen ran x0.64 of the model on an eager job and x0.98-1.23 on
    a job with CUDA graphs. The other phases do not depend on the decode mode and share one row."""
    return f"{phase}{EAGER_SUFFIX}" if phase == "gen" and eager_decode else phase


def decode_mode(eager_decode: bool) -> str:
    return "eager" if eager_decode else "CUDA graphs"


@dataclass(frozen=True)
class NodeKind:
    """What decides how verl's phases run on a node, apart from the job."""

    gpu: str
    driver: str
    torch: str
    vllm: str
    verl: str
    attention: str
    backend: str
    # residuals are measured against one revision of the time model: another revision starts another profile
    model: str = MODEL_REVISION
    rows: str = PROFILE_ROWS

    @property
    def id(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return f"{self.gpu}-{self.backend}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    def describe(self) -> str:
        return (f"{self.gpu}, driver {self.driver}, torch {self.torch}, vLLM {self.vllm}, verl {self.verl}, "
                f"{self.attention} attention, {self.backend} probes, time model {self.model}")


def package_version(name: str) -> str:
    """The installed distribution's version ("none" when absent), without importing it."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def attention_of(passthrough: dict) -> str:
    """The attention implementation the job's model runs: the job's own `model.override_config.attn_implementation`,
    else flash-attention where the package is installed (verl's and transformers' preference), else SDPA."""
    from importlib.util import find_spec

    chosen = passthrough.get("actor_rollout_ref.model.override_config.attn_implementation")
    if chosen:
        return str(chosen)
    return "flash_attention_2" if find_spec("flash_attn") is not None else "sdpa"


def detect_kind(backend: str, passthrough: dict, detected=None) -> NodeKind | None:
    """This node's kind for a study of `backend` (`detected`: hardware.detect_gpus() when already read); None for
    the sim (it measures nothing) or without an NVIDIA GPU."""
    if backend == "sim":
        return None
    from autotune.hardware import detect_gpus, match_device_name

    detected = detected or detect_gpus()
    if detected is None:
        return None
    spec = match_device_name(detected.device_name)
    return NodeKind(gpu=spec.name if spec else detected.device_name, driver=detected.driver,
                    torch=package_version("torch"), vllm=package_version("vllm"), verl=package_version("verl"),
                    attention=attention_of(passthrough), backend=backend)


@dataclass
class NodeProfile:
    kind: NodeKind
    # study name -> {"phases": {profile row: [log residual, ...]}, "other_s": [seconds, ...], "when": iso date};
    # a profile row is a phase, or a phase in one regime (profile_row)
    studies: dict = field(default_factory=dict)

    def rows(self, row: str) -> list[float]:
        return [r for s in self.studies.values() for r in s.get("phases", {}).get(row, [])]

    @property
    def probes(self) -> int:
        return sum(s.get("probes", 0) for s in self.studies.values())

    def prior(self, eager_decode: bool = False) -> dict:
        """Per phase, for a job of this decode mode: the median log residual and the spread of the residuals (what
        a new study starts from). A phase whose rows are all of the other decode mode has no prior."""
        phases = sorted({p.removesuffix(EAGER_SUFFIX) for s in self.studies.values() for p in s.get("phases", {})})
        out = {}
        for phase in phases:
            rows = self.rows(profile_row(phase, eager_decode))
            if len(rows) >= MIN_PROFILE_PROBES:
                out[phase] = {"log_mean": statistics.median(rows), "log_sd": statistics.pstdev(rows), "n": len(rows)}
        others = [o for s in self.studies.values() for o in s.get("other_s", [])]
        launches = [s["launch_overhead_s"] for s in self.studies.values() if s.get("launch_overhead_s")]
        # the memory gate's rule within a study (the largest measured/predicted peak of a fit) taken per study, and
        # the median of the studies' (one job's large micro-batches should not narrow every later job's space)
        worst = [max(max(s["peak_over_predicted"]), 1.0) for s in self.studies.values() if s.get("peak_over_predicted")]
        return {"phases": out, "other_s": statistics.median(others) if others else None,
                "launch_overhead_s": statistics.median(launches) if launches else None,
                "peak_under": statistics.median(worst) if worst else None}

    def summary(self, eager_decode: bool = False) -> dict:
        """What a study of a job in this decode mode stores of the profile it started from: reproducible if the
        file changes later."""
        prior = self.prior(eager_decode)
        return {"id": self.kind.id, "kind": asdict(self.kind), "probes": self.probes, "studies": len(self.studies),
                "decode": decode_mode(eager_decode), "phases": prior["phases"], "other_s": prior["other_s"],
                "launch_overhead_s": prior["launch_overhead_s"], "peak_under": prior["peak_under"]}


def profile_dir() -> Path:
    if os.environ.get(PROFILE_DIR_ENV):
        return Path(os.environ[PROFILE_DIR_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "autotune" / "node-profiles"


def profile_path(kind: NodeKind) -> Path:
    return profile_dir() / f"{kind.id}.json"


def load_profile(kind: NodeKind) -> NodeProfile | None:
    """The profile of this kind of node, or None (none yet, or a file that is not one: never an error)."""
    path = profile_path(kind)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("kind") != asdict(kind) or not isinstance(doc.get("studies"), dict):
            return None
        return NodeProfile(kind=kind, studies=doc["studies"])
    except (OSError, ValueError, AttributeError):
        return None


def record_study(kind: NodeKind, study_name: str, phases: dict[str, list[float]], other_s: list[float],
                 probes: int, launch_overhead_s: float | None = None,
                 peak_over_predicted: list[float] = ()) -> Path | None:
    """Put one study's rows into its kind's profile (replacing what the same study put there before), with what a
    launch cost it beyond its timed steps (storage/tuning_cost.launch_overhead_s; start-up, warm-up, teardown) and
    its fits' measured over predicted GPU peaks; None when the profile folder cannot be written (the study goes on
    without it)."""
    clean = {p: [float(r) for r in rows if math.isfinite(r)] for p, rows in phases.items()}
    peaks = [float(r) for r in peak_over_predicted if math.isfinite(r) and r > 0]
    profile = load_profile(kind) or NodeProfile(kind=kind)
    profile.studies[study_name] = {"phases": clean, "other_s": [float(o) for o in other_s], "probes": probes,
                                   "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                   **({"launch_overhead_s": float(launch_overhead_s)} if launch_overhead_s else {}),
                                   **({"peak_over_predicted": peaks} if peaks else {})}
    path = profile_path(kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"kind": asdict(kind), "studies": profile.studies}, indent=1, sort_keys=True),
                       encoding="utf-8")
        tmp.replace(path)  # atomic: a reader never sees half a file
    except OSError:
        return None
    return path


def summary_for(kind: NodeKind, none_yet: str, eager_decode: bool = False) -> dict:
    """What a study (or an estimate) of a job in this decode mode on this kind of node starts from: its profile's
    summary, or `none_yet` and the kind (so that a study can leave its probes in the profile at its end)."""
    profile = load_profile(kind)
    summary = profile.summary(eager_decode) if profile is not None else None
    if summary and summary["phases"]:
        return summary
    return {"none": f"{none_yet} ({kind.describe()})", "id": kind.id, "kind": asdict(kind)}


def phase_factors(summary: dict | None) -> dict[str, float]:
    """measured/predicted per phase by a profile's summary ({} without one)."""
    if not summary or summary.get("none"):
        return {}
    return {phase: math.exp(v["log_mean"]) for phase, v in summary.get("phases", {}).items()}


def profile_peak_under(summary: dict | None) -> float:
    """How far measured GPU peaks ran above the memory model on this kind of node, by a profile's summary (1: no
    profile, or no peak above the model)."""
    if not summary or summary.get("none"):
        return 1.0
    return max(summary.get("peak_under") or 1.0, 1.0)


def describe_summary(summary: dict | None) -> str:
    """One line for `show` and `estimate`: the profile a study started from, or why there was none."""
    if not summary:
        return "node profile: none (the study predates profiles)"
    if summary.get("none"):
        return f"node profile: none ({summary['none']})"
    phases = ", ".join(f"{p} x{math.exp(v['log_mean']):.2f}" for p, v in sorted(summary["phases"].items()))
    decode = f" (gen: rows of {summary['decode']} decoding, as this job's)" if summary.get("decode") else ""
    launch = (f"; a launch cost {summary['launch_overhead_s']:.0f} s beyond its timed steps (median of the studies)"
              if summary.get("launch_overhead_s") else "")
    under = profile_peak_under(summary)
    memory = (f"; GPU peaks up to x{under:.2f} of the memory model's (the memory gate starts there)"
              if under > 1.0 else "")
    return (f"node profile {summary['id']}: {summary['probes']} measured probe(s) of {summary['studies']} earlier "
            f"study(ies) on this kind of node; measured/predicted {phases or 'n/a'}{decode}{launch}{memory}")
