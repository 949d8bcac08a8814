"""GPU table (peak dense bf16 FLOP/s, memory, bandwidths) and detection through pynvml.

Peak FLOP/s values are verl's `_DEVICE_FLOPS` (verl/utils/flops_counter.py:22-45, verl 0.9.1) so that
our MFU and verl's `perf/mfu/actor` use the same denominator. Memory and bandwidths are the vendors'
data sheets; usable memory is what `nvidia-smi` reports (H200: 143771 MiB measured, see
autotune/data/h200-train-probe.json's provenance in docs/calibration.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    peak_bf16_flops: float  # dense, per GPU (verl's _DEVICE_FLOPS)
    mem_gib: float  # usable device memory as the driver reports it
    hbm_bytes_per_s: float  # memory bandwidth (data sheet)
    intra_node_bytes_per_s: float  # NVLink (or PCIe) bandwidth per GPU, one direction
    inter_node_bytes_per_s: float  # network bandwidth per GPU, one direction
    host_link_bytes_per_s: float  # PCIe host<->device, one direction (offload traffic)
    source: str
    # The share of peak_bf16_flops its own GEMM libraries reach on a large bf16 GEMM, where a published measurement
    # says so; None: the H200's, measured here (calibration.py ThroughputConstants.matmul_peak_fraction)
    matmul_peak_fraction: float | None = None


_NVLINK4 = 450e9  # NVLink 4: 900 GB/s bidirectional per GPU
_IB_400G = 50e9  # one 400 Gb/s NIC per GPU
_PCIE5 = 55e9  # PCIe 5.0 x16 ~ 64 GB/s raw, ~55 GB/s achieved
_PCIE4 = 25e9

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(name="H200", peak_bf16_flops=989e12, mem_gib=143771 / 1024, hbm_bytes_per_s=4.8e12,
                intra_node_bytes_per_s=_NVLINK4, inter_node_bytes_per_s=_IB_400G, host_link_bytes_per_s=_PCIE5,
                source="https://www.nvidia.com/en-us/data-center/h200/"),
        GpuSpec(name="H100-80GB", peak_bf16_flops=989e12, mem_gib=81559 / 1024, hbm_bytes_per_s=3.35e12,
                intra_node_bytes_per_s=_NVLINK4, inter_node_bytes_per_s=_IB_400G, host_link_bytes_per_s=_PCIE5,
                source="https://www.nvidia.com/en-us/data-center/h100/"),
        GpuSpec(name="H800", peak_bf16_flops=989e12, mem_gib=81559 / 1024, hbm_bytes_per_s=3.35e12,
                intra_node_bytes_per_s=200e9, inter_node_bytes_per_s=_IB_400G, host_link_bytes_per_s=_PCIE5,
                source="NVIDIA H800 data sheet (NVLink 400 GB/s bidirectional)"),
        GpuSpec(name="H20", peak_bf16_flops=148e12, mem_gib=97871 / 1024, hbm_bytes_per_s=4.0e12,
                intra_node_bytes_per_s=_NVLINK4, inter_node_bytes_per_s=_IB_400G, host_link_bytes_per_s=_PCIE5,
                source="NVIDIA H20 data sheet; peak from verl _DEVICE_FLOPS"),
        GpuSpec(name="A100-80GB", peak_bf16_flops=312e12, mem_gib=81920 / 1024, hbm_bytes_per_s=2.039e12,
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9, host_link_bytes_per_s=_PCIE4,
                source="https://www.nvidia.com/en-us/data-center/a100/"),
        GpuSpec(name="A100-40GB", peak_bf16_flops=312e12, mem_gib=40960 / 1024, hbm_bytes_per_s=1.555e12,
                intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9, host_link_bytes_per_s=_PCIE4,
                source="https://www.nvidia.com/en-us/data-center/a100/"),
        GpuSpec(name="L40S", peak_bf16_flops=362.05e12, mem_gib=46068 / 1024, hbm_bytes_per_s=0.864e12,
                intra_node_bytes_per_s=_PCIE4, inter_node_bytes_per_s=25e9, host_link_bytes_per_s=_PCIE4,
                source="https://www.nvidia.com/en-us/data-center/l40s/"),
        GpuSpec(name="B200", peak_bf16_flops=2.25e15, mem_gib=183359 / 1024, hbm_bytes_per_s=8.0e12,
                intra_node_bytes_per_s=900e9, inter_node_bytes_per_s=_IB_400G, host_link_bytes_per_s=_PCIE5,
                source="https://www.nvidia.com/en-us/data-center/dgx-b200/"),
    )
}

DEFAULT_GPU = "H200"


# Short names people type. "H100" is the SXM 80 GB part (the one verl's _DEVICE_FLOPS "H100" entry and the
# device_tuning.rst tables mean); "A100" has two memory sizes and is asked, never guessed (get_gpu).
ALIASES = {
    "H100": "H100-80GB", "H100-SXM": "H100-80GB", "H100-SXM5": "H100-80GB", "H100-SXM-80GB": "H100-80GB",
    "H100-80G": "H100-80GB", "A100-80G": "A100-80GB", "A100-40G": "A100-40GB", "A100-SXM4-80GB": "A100-80GB",
    "A100-SXM4-40GB": "A100-40GB", "H200-141GB": "H200", "H200-SXM": "H200",
}


def _normal(name: str) -> str:
    text = name.strip().upper().replace("_", "-").replace(" ", "-")
    return text.removeprefix("NVIDIA-")


def get_gpu(name: str, detected: "DetectedGpus | None" = None) -> GpuSpec:
    """Case-insensitive lookup by table name, alias or the name nvidia-smi prints ("NVIDIA H100 80GB HBM3").

    A bare "A100" is ambiguous (40 or 80 GB): the detected GPU decides, else it is a one-line error."""
    key = _normal(name)
    for table_key, spec in GPUS.items():
        if table_key.upper() == key:
            return spec
    if key in ALIASES:
        return GPUS[ALIASES[key]]
    if key in ("A100", "A100-SXM4", "A100-PCIE", "A100-SXM"):
        found = match_device_name(detected.device_name) if detected is not None else None
        if found is not None and found.name.startswith("A100"):
            return found
        raise ConfigError(f"--gpu {name}: the A100 comes with 40 or 80 GB; give --gpu A100-40GB or --gpu A100-80GB")
    found = match_device_name(name) if len(key) > 3 else None
    if found is not None and not (found.name.startswith("A100") and "GB" not in key):
        return found
    raise ConfigError(f"unknown GPU type {name!r}; known: {', '.join(GPUS)} (and aliases: `autotune gpus`)")


def match_device_name(device_name: str) -> GpuSpec | None:
    """Map a driver name ("NVIDIA H200", "NVIDIA H100 80GB HBM3") to a table entry.

    Longest key first, as verl does with reverse-sorted keys, so "H200" wins over "H20".
    """
    upper = device_name.upper()
    for key in sorted(GPUS, key=len, reverse=True):
        family = key.split("-")[0]
        if family in upper and (("-" not in key) or key.split("-")[1] in upper.replace(" ", "")):
            return GPUS[key]
    for key in sorted(GPUS, key=len, reverse=True):
        if key.split("-")[0] in upper:
            return GPUS[key]
    return None


@dataclass(frozen=True, kw_only=True)
class DetectedGpus:
    count: int
    device_name: str
    total_mem_gib: float
    driver: str


def visible_device_ids(environ=None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset (every GPU), else the listed indices or UUIDs in
    order, cut at the first entry that is empty or not an index/UUID (CUDA ignores it and what follows:
    https://docs.nvidia.com/cuda/cuda-c-programming-guide/#cuda-environment-variables). NVML itself ignores
    the variable, so Slurm and container jobs would otherwise see the whole node."""
    environ = os.environ if environ is None else environ
    text = environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    ids = []
    for entry in (e.strip() for e in text.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        ids.append(entry)
    return ids


def visible_handles(pynvml, environ=None) -> list:
    """NVML handles of the GPUs this process's CUDA sees (CUDA_VISIBLE_DEVICES by index or UUID), in CUDA's order."""
    ids = visible_device_ids(environ)
    count = pynvml.nvmlDeviceGetCount()
    if ids is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for entry in ids:
        try:
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                           else pynvml.nvmlDeviceGetHandleByUUID(entry))
        except Exception:  # an index past the last GPU or an unknown UUID: CUDA stops there too
            break
    return handles


def detect_gpus(environ=None) -> DetectedGpus | None:
    """GPUs visible to this process (NVML, restricted to CUDA_VISIBLE_DEVICES); None when NVML or a GPU is
    absent."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, driver missing: no GPU here
        return None
    try:
        handles = visible_handles(pynvml, environ)
        count = len(handles)
        if count == 0:
            return None
        handle = handles[0]
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return DetectedGpus(count=count, device_name=name, total_mem_gib=total, driver=driver)
    finally:
        pynvml.nvmlShutdown()


def detect_host_mem_gib() -> float | None:
    """RAM this machine's processes may use (GiB): physical memory, capped by a cgroup limit (containers,
    Slurm jobs); None where neither can be read."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = None
    limits = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < 2**60:  # "max" or a huge sentinel mean no limit
            limits.append(int(text))
    candidates = [b for b in [physical, *limits] if b]
    return min(candidates) / GIB if candidates else None
