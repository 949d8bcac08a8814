"""Devices, memory and clocks: synchronized phase timing, peak memory, OOM recognition, offload moves, and
the process group (torchrun's, or one of a single rank)."""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from autotune.hardware import GIB


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mem_gib(device: torch.device) -> float:
    """CUDA: max_memory_allocated (verl's actor/perf/max_memory_allocated_gb). CPU: peak RSS so far."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux reports KiB


def allocated_bytes(device: torch.device) -> int:
    """Bytes the CUDA caching allocator has handed out now; 0 on the CPU (no allocator statistics)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak_allocated_bytes(device: torch.device) -> int:
    """Peak of allocated_bytes since the last reset_peak_mem; 0 on the CPU."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def reset_peak_mem(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def total_device_mem_bytes(device: torch.device, override_gib: float | None) -> float:
    if override_gib is not None:
        return float(override_gib) * GIB
    if device.type != "cuda":
        raise ValueError("device_mem_gib is required when device is not cuda (it sizes the KV cache)")
    return float(torch.cuda.mem_get_info(device)[1])


def is_oom(exc: BaseException) -> bool:
    """A real CUDA OOM, or the allocator failures cuBLAS and NCCL report as plain RuntimeErrors."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text)


_SIZE = r"([\d.]+) (GiB|MiB|KiB)"


def oom_over_gib(message: str) -> float | None:
    """From torch's message: requested minus free ("Tried to allocate X ... of which Y is free")."""
    units = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024**2}
    tried = re.search(r"Tried to allocate " + _SIZE, message)
    if not tried:
        return None
    tried_gib = float(tried.group(1)) * units[tried.group(2)]
    free = re.search(r"of which " + _SIZE + " is free", message)
    free_gib = float(free.group(1)) * units[free.group(2)] if free else 0.0
    return max(tried_gib - free_gib, 0.0)


@dataclass
class PhaseClock:
    """Per-phase wall time (synchronized) and peak memory; remembers the phase an error escaped from."""

    device: torch.device
    test_raise_oom_in: str | None = None
    current: str | None = None
    peak_gib: float = 0.0

    @contextmanager
    def phase(self, name: str, seconds: dict[str, float], mem_gib: dict[str, float]) -> Iterator[None]:
        self.current = name
        synchronize(self.device)
        reset_peak_mem(self.device)
        start_s = time.perf_counter()
        if name == self.test_raise_oom_in:  # test double for the OOM path, set only by tests
            raise torch.OutOfMemoryError(f"test double: simulated out of memory in {name}")
        yield
        synchronize(self.device)
        seconds[name] = time.perf_counter() - start_s
        mem_gib[name] = peak_mem_gib(self.device)
        self.peak_gib = max(self.peak_gib, mem_gib[name])
        self.current = None


@contextmanager
def resident(module: torch.nn.Module, device: torch.device, *, offload: bool, pinned: bool) -> Iterator[None]:
    """Parameters on the device for the duration, on the CPU otherwise (verl's param_offload:
    load_fsdp_model_to_gpu / offload_fsdp_model_to_cpu around each actor or ref call). `pinned`: verl's
    FSDP2 copies, `.to(..., non_blocking=True)`, which land in pinned host blocks and copy back
    asynchronously on the same stream (utils/fsdp_utils.py offload_fsdp2_model_to_cpu); else pageable
    copies of exact size (see move_optimizer_state)."""
    if offload:
        module.to(device, non_blocking=pinned)
    try:
        yield
    finally:
        if offload:
            module.to("cpu", non_blocking=pinned)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str, *, pinned: bool = True) -> None:
    """verl's optimizer_offload: Adam moments live on the CPU between update phases.

    verl sends them with `.to("cpu", non_blocking=True)` (offload_fsdp_optimizer), which lands in pinned
    blocks rounded up to a power of two, one per tensor: FSDP2's per-parameter shards. FSDP1, which this
    probe runs as FSDP2, has one flat parameter per layer and rounds far less (model/host_memory.py);
    `pinned=False` copies to exact-size pageable memory instead, nearer FSDP1's host footprint."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=pinned)


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item())


def init_dist(device_kind: str) -> Dist:
    """The process group: torchrun's, or one of a single rank, since verl wraps the actor in FSDP even
    on one GPU and FSDP2 needs a group (mixed precision then works as verl's: bf16 compute copies
    gathered per layer, fp32 master weights and gradients)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise EnvironmentError("the torch backend was asked for cuda, but torch.cuda.is_available() is False")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not torch.distributed.is_initialized():
        if world_size > 1:
            torch.distributed.init_process_group(backend)
        else:
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    return Dist(rank=torch.distributed.get_rank(), world_size=world_size, device=device)
