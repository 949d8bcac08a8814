"""Which probe backend runs: the one asked for, or for `auto` the best one this machine can run."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from autotune.errors import install_hint
from autotune.errors import BackendUnavailable
from autotune.hardware import DetectedGpus
from autotune.backends.base import BACKEND_NAMES
from autotune.verl.keys import KNOB_PACKAGES  # a knob's package where verl runs

# Python packages each real backend needs on the probing machine.
REQUIREMENTS = {"verl": ("verl", "vllm", "ray"), "torch": ("torch", "transformers")}
EXTRAS = {"verl": install_hint("verl"), "torch": install_hint("torch")}


@dataclass(frozen=True)
class BackendChoice:
    name: str
    note: str | None  # one line for the user when the choice was made for them


def missing_requirements(name: str) -> list[str]:
    return [mod for mod in REQUIREMENTS.get(name, ()) if importlib.util.find_spec(mod) is None]


def knob_without_package(knob: str) -> str | None:
    """The package `knob`=True needs where it is missing on this machine, or None."""
    package = KNOB_PACKAGES.get(knob)
    return package if package and importlib.util.find_spec(package) is None else None


def knob_package_missing(candidate) -> str | None:
    """Why `candidate` cannot run here for want of a knob's package, or None."""
    for knob, package in KNOB_PACKAGES.items():
        if getattr(candidate, knob) and knob_without_package(knob):
            return f"{knob} needs {package.replace('_', '-')} (`pip install {package.replace('_', '-')}`), " \
                   "which is not installed"
    return None


def knobs_held_off() -> dict[str, bool]:
    """Knobs a real backend on this machine cannot turn on (their package is missing): held at False so the
    sampler does not spend trials on them (`sim` models every knob and holds none)."""
    return {knob: False for knob in KNOB_PACKAGES if knob_without_package(knob)}


def unavailable_reason(name: str, gpus: DetectedGpus | None) -> str | None:
    """Why `name` cannot run here, or None when it can."""
    if name == "sim":
        return None
    missing = missing_requirements(name)
    if missing:
        return f"the {name} backend needs {', '.join(missing)} ({EXTRAS[name]})"
    if gpus is None:
        return f"the {name} backend needs an NVIDIA GPU and none was found"
    return None


def choose_backend(requested: str, gpus: DetectedGpus | None) -> BackendChoice:
    if requested not in BACKEND_NAMES:
        raise BackendUnavailable(f"unknown backend {requested!r}; choose one of {', '.join(BACKEND_NAMES)}")
    if requested != "auto":
        reason = unavailable_reason(requested, gpus)
        if reason:
            raise BackendUnavailable(reason)
        return BackendChoice(requested, None)
    if gpus is None:
        return BackendChoice("sim", "no GPU found: simulating with the calibrated model")
    for name in ("verl", "torch"):
        if unavailable_reason(name, gpus) is None:
            return BackendChoice(name, f"{gpus.count} x {gpus.device_name} found: probing with the {name} backend")
    return BackendChoice("sim", f"{gpus.count} x {gpus.device_name} found but no probe backend is installed "
                                f"({EXTRAS['verl']} or {EXTRAS['torch']}): simulating with the calibrated model")
