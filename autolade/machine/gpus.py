"""The GPUs this machine has, as NVML (and torch, for the SM counts) reports them; never fails without one.

``probe_gpus()`` is what ``autolade.machine.hardware.probe_hardware`` calls: a missing driver or NVML, a
failing query, a MIG slice all end in notes, never an exception. Peak FLOP/s and memory bandwidth are
estimates, from a spec table or from clocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPU_PEAK_TFLOPS",
    "PER_SM_FLOPS_PER_CLOCK",
    "GpuInfo",
    "gpu_mem_bandwidth",
    "gpu_peak_flops",
    "probe_gpus",
]

# Dense bf16/fp16 tensor-core peak (TFLOP/s) from vendor spec sheets, matched by name substring,
# most specific first. Used when the GPU is named here; else SMs x clock x per-SM rate.
GPU_PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),
    ("T4", 65.0),
)

# Dense fp16/bf16 tensor FLOPs per SM per clock, by compute-capability major.minor.
PER_SM_FLOPS_PER_CLOCK = {
    (7, 0): 1024,  # Volta
    (7, 5): 1024,  # Turing
    (8, 0): 2048,  # A100
    (8, 6): 1024,  # GA10x
    (8, 7): 1024,  # Orin
    (8, 9): 1024,  # Ada
    (9, 0): 4096,  # Hopper
    (10, 0): 8192,  # Blackwell datacenter (approximate)
}


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML (and torch, for the SM count) reports it."""

    index: int  # CUDA device index
    name: str  # e.g. "NVIDIA H200"
    memory_total: int | None = None  # bytes
    memory_free: int | None = None  # bytes, at probe time
    sm_count: int | None = None  # streaming multiprocessors (torch; NVML has no direct query)
    compute_capability: tuple[int, int] | None = None  # (major, minor)
    max_sm_clock_mhz: int | None = None  # NVML max SM clock
    max_mem_clock_mhz: int | None = None  # NVML max memory clock
    bus_width_bits: int | None = None  # memory bus width
    driver_version: str | None = None  # NVIDIA driver
    cuda_version: str | None = None  # CUDA version the driver supports
    peak_flops: float | None = None  # dense bf16/fp16 tensor FLOP/s (estimate, see peak_flops_source)
    peak_flops_source: str | None = None  # "spec table" or "SMs x clock x per-SM rate"
    mem_bandwidth: float | None = None  # bytes/s, 2 x mem clock x bus width / 8 (DDR estimate)
    mig_profile: str | None = None  # MIG on: the slice's profile, e.g. "1g.10gb" (memory, SMs are the slice's)
    mig_instances: int | None = None  # MIG on: how many GPU instances NVML lists


# --- probing (NVML) --------------------------------------------------------------------------


def probe_gpus(*, nvml: Any = None, cuda: Any = None) -> tuple[list[GpuInfo], list[str]]:
    """Every GPU NVML sees, and notes on what it could not tell; never raises.

    ``nvml``: a pynvml-like module (default: ``import pynvml`` from nvidia-ml-py); ``cuda``: a
    ``torch.cuda``-like object for the SM counts (default: ``torch.cuda``). Both are parameters so
    that tests hand in stand-ins: several GPUs, MIG slices, unsupported queries, a failing init.
    A GPU whose queries fail is left out with a note; the others are still reported.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # from nvidia-ml-py
        except ImportError as exc:
            return [], [f"NVML not available: nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py"]
    if cuda is None:
        import torch

        cuda = torch.cuda
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], [f"NVML not available: {exc or type(exc).__name__} (no NVIDIA driver on this machine)"]
    notes: list[str] = []
    gpus: list[GpuInfo] = []
    try:
        driver = _nvml_call(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda_raw = _nvml_call(nvml.nvmlSystemGetCudaDriverVersion_v2) or _nvml_call(nvml.nvmlSystemGetCudaDriverVersion)
        cuda_version = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if cuda_raw else None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return [], [f"NVML not available: query failed ({exc or type(exc).__name__})"]
        for index in range(count):
            try:
                gpu, missing = _nvml_gpu(nvml, cuda, index, driver, cuda_version)
            except Exception as exc:
                notes.append(f"GPU {index}: NVML query failed ({exc or type(exc).__name__}); left out")
                continue
            gpus.append(gpu)
            if missing:
                notes.append(f"GPU {index}: NVML does not report {', '.join(missing)} (left unknown)")
            if gpu.mig_profile:
                notes.append(f"GPU {index}: MIG on, {gpu.mig_instances} instance(s); memory and SMs are slice "
                             f"{gpu.mig_profile}'s (the first instance)")
        if not gpus:
            notes.append("NVML found no GPU")
        return gpus, notes
    finally:
        _nvml_call(nvml.nvmlShutdown)


def _nvml_gpu(nvml: Any, cuda: Any, index: int, driver: str | None, cuda_version: str | None) -> tuple[GpuInfo, list[str]]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    memory = _nvml_call(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    sm_clock = _nvml_call(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
    mem_clock = _nvml_call(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
    bus = _nvml_call(lambda: nvml.nvmlDeviceGetMemoryBusWidth(handle))
    cc = _nvml_call(lambda: tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle)))
    mig_profile, mig_instances, mig_sms, mig_memory = _nvml_mig(nvml, handle)
    if mig_memory is not None:
        memory = mig_memory
    sm_count = mig_sms
    if _nvml_call(cuda.is_available) and index < (_nvml_call(cuda.device_count) or 0):
        props = cuda.get_device_properties(index)
        sm_count = props.multi_processor_count
        cc = cc or (props.major, props.minor)
    # a MIG slice has a share of the part's peak: never the spec table's whole-GPU number
    peak, source = gpu_peak_flops(name="" if mig_profile else name, sm_count=sm_count, sm_clock_mhz=sm_clock,
                                  compute_capability=cc)
    info = GpuInfo(
        index=index,
        name=name,
        memory_total=getattr(memory, "total", None),
        memory_free=getattr(memory, "free", None),
        sm_count=sm_count,
        compute_capability=cc,
        max_sm_clock_mhz=sm_clock,
        max_mem_clock_mhz=mem_clock,
        bus_width_bits=bus,
        driver_version=driver,
        cuda_version=cuda_version,
        peak_flops=peak,
        peak_flops_source=source,
        mem_bandwidth=gpu_mem_bandwidth(mem_clock_mhz=mem_clock, bus_width_bits=bus),
        mig_profile=mig_profile,
        mig_instances=mig_instances,
    )
    fields = (("memory", memory), ("max_sm_clock_mhz", sm_clock), ("max_mem_clock_mhz", mem_clock),
              ("bus_width_bits", bus), ("compute_capability", cc))
    return info, [key for key, value in fields if value is None]


def _nvml_mig(nvml: Any, handle: Any) -> tuple[str | None, int | None, int | None, Any]:
    """(MIG profile like "1g.10gb", instances, the first instance's SMs, its memory info), or Nones when MIG is off."""
    mode = _nvml_call(lambda: nvml.nvmlDeviceGetMigMode(handle))
    enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
    if not mode or mode[0] != enabled:
        return None, None, None, None
    slots = _nvml_call(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
    instances = [h for i in range(slots) if (h := _nvml_call(lambda i=i: nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)))]
    if not instances:
        return "none", 0, None, None
    first = instances[0]
    mig_name = _nvml_call(lambda: _text(nvml.nvmlDeviceGetName(first))) or ""
    match = re.search(r"\d+g\.\d+gb", mig_name)
    attributes = _nvml_call(lambda: nvml.nvmlDeviceGetAttributes(first))
    sms = getattr(attributes, "multiprocessorCount", None)
    profile = match.group(0) if match else (f"{getattr(attributes, 'gpuInstanceSliceCount', '?')}g" if attributes else "unknown")
    return profile, len(instances), sms, _nvml_call(lambda: nvml.nvmlDeviceGetMemoryInfo(first))


def gpu_peak_flops(
    *, name: str, sm_count: int | None, sm_clock_mhz: int | None, compute_capability: tuple[int, int] | None
) -> tuple[float | None, str | None]:
    """Dense bf16 tensor FLOP/s: the spec table by name, else SMs x clock x per-SM rate. Both estimates."""
    for needle, tflops in GPU_PEAK_TFLOPS:
        if needle.lower() in name.lower():
            return tflops * 1e12, f"spec table ({needle})"
    rate = PER_SM_FLOPS_PER_CLOCK.get(tuple(compute_capability)) if compute_capability else None
    if rate and sm_count and sm_clock_mhz:
        return sm_count * sm_clock_mhz * 1e6 * rate, f"{sm_count} SMs x {sm_clock_mhz} MHz x {rate} FLOP/clock"
    return None, None


def gpu_mem_bandwidth(*, mem_clock_mhz: int | None, bus_width_bits: int | None) -> float | None:
    """Bytes/s = 2 (DDR) x memory clock x bus width / 8. An estimate: HBM3e parts may differ from spec."""
    if not mem_clock_mhz or not bus_width_bits:
        return None
    return 2 * mem_clock_mhz * 1e6 * bus_width_bits / 8


def _nvml_call(fn: Callable[[], Any]) -> Any:
    """One optional NVML query: None when this GPU or driver doesn't support it."""
    try:
        return fn()
    except Exception:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
