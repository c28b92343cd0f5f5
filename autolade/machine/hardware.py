"""What this machine is, for tuning: NVML on NVIDIA GPUs, measured micro-benchmarks on CPUs.

``probe_hardware()`` never fails for lack of a GPU or of NVML: that is the normal CPU path,
recorded as a note. The step-latency curve lives in ``autolade.records.curve`` and is re-exported here.
"""

from __future__ import annotations

import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from autolade.errors import ProfileError
from autolade.machine.gpus import GpuInfo, gpu_mem_bandwidth, gpu_peak_flops, probe_gpus

__all__ = [
    "GpuInfo",
    "HardwareProfile",
    "command_line",
    "environment",
    "gpu_mem_bandwidth",
    "gpu_peak_flops",
    "load_average",
    "probe_gpus",
    "probe_hardware",
]

CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class HardwareProfile:
    """The machine a model runs on, as far as tuning cares."""

    device: str  # "cpu" or "cuda:N": where the model runs
    cpu_model: str  # /proc/cpuinfo "model name" (or platform.processor())
    cpu_vendor: str  # e.g. "AuthenticAMD", "GenuineIntel", "" when unknown
    cpu_family: str  # /proc/cpuinfo "cpu family", "" when unknown
    cpu_flags: tuple[str, ...]  # the flags of interest present (see CPU_FLAGS_OF_INTEREST)
    logical_cpus: int | None  # os.cpu_count()
    torch_threads: int  # torch.get_num_threads()
    torch_version: str  # torch.__version__
    gpus: tuple[GpuInfo, ...] = ()  # every GPU NVML sees (may be several; device says which runs)
    cpu_fp32_flops: float | None = None  # measured matmul FLOP/s, fp32 (CPU path only)
    cpu_bf16_flops: float | None = None  # measured matmul FLOP/s, bf16 (CPU path only)
    cpu_mem_bandwidth: float | None = None  # measured copy bandwidth, bytes/s (CPU path only)
    notes: tuple[str, ...] = field(default=())  # e.g. "NVML not available: <reason>"

    @property
    def is_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def gpu(self) -> GpuInfo | None:
        """The GPU the model runs on, if any."""
        if not self.is_gpu:
            return None
        index = int(self.device.partition(":")[2] or 0)
        return next((g for g in self.gpus if g.index == index), None)

    @property
    def isa_class(self) -> str:
        """The CPU's best matmul ISA: amx > avx512_bf16 > avx512 > avx2 > base."""
        flags = set(self.cpu_flags)
        for name, needed in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
            if needed in flags:
                return name
        return "base"

    @property
    def fingerprint(self) -> str:
        """What makes two machines "the same for tuning".

        GPU: name, SM count and memory (a MIG slice or a cut-down part differs). CPU: model
        name, torch threads and ISA class (threads change the curve as much as the chip).
        """
        gpu = self.gpu
        if gpu is not None:
            parts = ["cuda", _slug(gpu.name)]
            if gpu.sm_count:
                parts.append(f"{gpu.sm_count}sm")
            if gpu.memory_total:
                parts.append(f"{round(gpu.memory_total / 2**30)}GiB")
            if gpu.mig_profile:
                parts.append(f"mig-{_slug(gpu.mig_profile)}")
            return ":".join(parts)
        if self.is_gpu:
            return f"cuda:{_slug(self.device)}"
        return f"cpu:{_slug(self.cpu_model) or 'unknown'}:t{self.torch_threads}:{self.isa_class}"

    @property
    def hardware_class(self) -> str:
        """Coarser key for the nearest-hardware fallback: the GPU name, or CPU vendor/family + ISA."""
        gpu = self.gpu
        if gpu is not None:
            mig = f":mig-{_slug(gpu.mig_profile)}" if gpu.mig_profile else ""
            return f"cuda:{_slug(gpu.name)}{mig}"
        if self.is_gpu:
            return "cuda:unknown"
        vendor = _slug(self.cpu_vendor) or _slug(self.cpu_model.split(" ")[0] if self.cpu_model else "") or "unknown"
        family = f"f{self.cpu_family}" if self.cpu_family else "f?"
        return f"cpu:{vendor}:{family}:{self.isa_class}"

    def summary(self) -> str:
        lines = [f"device:        {self.device}  (fingerprint {self.fingerprint}, class {self.hardware_class})"]
        lines.append(f"cpu:           {self.cpu_model or 'unknown'}  [{', '.join(self.cpu_flags) or 'no flags of interest'}]")
        lines.append(f"threads:       torch {self.torch_threads} of {self.logical_cpus or '?'} logical CPUs; torch {self.torch_version}")
        if self.cpu_fp32_flops is not None:
            lines.append(f"cpu matmul:    fp32 {_giga(self.cpu_fp32_flops)}FLOP/s, bf16 {_giga(self.cpu_bf16_flops)}FLOP/s (measured)")
        if self.cpu_mem_bandwidth is not None:
            lines.append(f"cpu memory:    {_giga(self.cpu_mem_bandwidth)}B/s copy bandwidth (measured)")
        for gpu in self.gpus:
            mark = "*" if gpu is self.gpu else " "
            mem = f"{gpu.memory_total / 2**30:.1f} GiB" if gpu.memory_total else "? GiB"
            free = f", {gpu.memory_free / 2**30:.1f} GiB free" if gpu.memory_free is not None else ""
            lines.append(f"gpu {gpu.index}{mark}:        {gpu.name}, {mem}{free}, {gpu.sm_count or '?'} SMs, cc {_cc(gpu.compute_capability)}")
            lines.append(
                f"               clocks SM {gpu.max_sm_clock_mhz or '?'} MHz / mem {gpu.max_mem_clock_mhz or '?'} MHz, "
                f"bus {gpu.bus_width_bits or '?'} bit; driver {gpu.driver_version or '?'}, CUDA {gpu.cuda_version or '?'}"
            )
            if gpu.peak_flops:
                lines.append(f"               peak ~{gpu.peak_flops / 1e12:.0f} TFLOP/s bf16 (estimate: {gpu.peak_flops_source})")
            if gpu.mem_bandwidth:
                lines.append(f"               memory ~{gpu.mem_bandwidth / 1e9:.0f} GB/s (estimate: 2 x mem clock x bus width)")
        lines.extend(f"note:          {note}" for note in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprint"] = self.fingerprint
        data["hardware_class"] = self.hardware_class
        return data


def probe_hardware(
    *, device: str | None = None, quick: bool = False, measure: bool = True, nvml: Any = None, cuda: Any = None
) -> HardwareProfile:
    """Describe this machine. ``device=None`` picks "cuda:0" when torch sees a GPU, else "cpu".

    The CPU micro-benchmarks run only when the model runs on the CPU (``quick`` shortens them
    to ~0.2 s; ``measure=False`` skips them: the fingerprint never depends on them, so
    generate() can look up a profile in milliseconds). ``nvml`` / ``cuda``: stand-ins for pynvml and
    ``torch.cuda`` (``probe_gpus``); a failing NVML leaves a note, never an exception.
    """
    import os

    import torch

    cuda = cuda or torch.cuda
    if device is None:
        device = "cuda:0" if cuda.is_available() else "cpu"
    if device == "cuda":
        device = "cuda:0"
    if not re.fullmatch(r"cpu|cuda:\d+", device):
        raise ProfileError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    notes: list[str] = []
    if device.startswith("cuda") and not cuda.is_available():
        raise ProfileError(f"device {device} requested but torch.cuda is not available (torch {torch.__version__})")

    cpu = _cpu_info()
    gpus, nvml_notes = probe_gpus(nvml=nvml, cuda=cuda)
    notes.extend(nvml_notes)
    busy = _busy_note(os) if measure else None
    if busy:
        notes.append(busy)
    measured: dict[str, float | None] = {}
    if device == "cpu" and measure:  # measure=False: identity only (fingerprint), for generate()'s lookup
        measured = _cpu_benchmarks(torch, quick=quick)
        if measured.get("cpu_bf16_flops") is None:
            notes.append("bf16 matmul benchmark failed on this CPU")
    return HardwareProfile(
        device=device,
        cpu_model=cpu["model"],
        cpu_vendor=cpu["vendor"],
        cpu_family=cpu["family"],
        cpu_flags=cpu["flags"],
        logical_cpus=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        gpus=tuple(gpus),
        notes=tuple(notes),
        **measured,
    )


# --- CPU ------------------------------------------------------------------------------------


def _busy_note(os: Any) -> str | None:
    """Other processes running now make every CPU timing pessimistic; say so."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = os.cpu_count() or 1
    if load < 0.5:
        return None
    return (
        f"system busy while probing (1-min load average {load:.2f} on {cpus} CPUs): CPU timings may be "
        "pessimistic; on a small machine a competing process can stall each multi-threaded op by a scheduler tick"
    )


def _cpu_info() -> dict[str, Any]:
    info: dict[str, str] = {}
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if info:  # first processor block is enough
                        break
                    continue
                key, value = key.strip(), value.strip()
                if key in ("flags", "Features"):
                    flags.update(value.split())
                else:
                    info.setdefault(key, value)
    except OSError:
        pass
    model = info.get("model name") or info.get("Model") or platform.processor() or platform.machine()
    return {
        "model": model,
        "vendor": info.get("vendor_id", ""),
        "family": info.get("cpu family", ""),
        "flags": tuple(f for f in CPU_FLAGS_OF_INTEREST if f in flags),
    }


def _cpu_benchmarks(torch: Any, *, quick: bool) -> dict[str, float | None]:
    """Matmul FLOP/s (fp32, bf16) and copy bandwidth: short, warmed up, medians."""
    n = 256 if quick else 512
    budget = 0.08 if quick else 0.3  # seconds of timed runs per benchmark
    results: dict[str, float | None] = {}
    for key, dtype in (("cpu_fp32_flops", torch.float32), ("cpu_bf16_flops", torch.bfloat16)):
        try:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            seconds = _median_time(lambda a=a, b=b: torch.mm(a, b), budget=budget)
            results[key] = 2 * n**3 / seconds
        except RuntimeError:
            results[key] = None
    size = (16 if quick else 64) * 2**20  # bytes; well past the caches
    src = torch.empty(size // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), budget=budget)
    results["cpu_mem_bandwidth"] = 2 * size / seconds  # read + write
    return results


def _median_time(fn: Callable[[], Any], *, budget: float, warmup: int = 2, min_runs: int = 3, max_runs: int = 50) -> float:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget
    while len(times) < min_runs or (time.perf_counter() < deadline and len(times) < max_runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)



def _slug(text: str) -> str:
    """'AMD EPYC 7B13 64-Core Processor' -> 'AMD-EPYC-7B13-64-Core-Processor'."""
    text = re.sub(r"\((R|TM|tm|r)\)", "", text or "")
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-")


def _giga(value: float | None) -> str:
    return "? " if value is None else f"{value / 1e9:.1f} G"


def _cc(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "?"


# --- the environment of a measurement ---------------------------------------------------------


def load_average() -> float | None:
    """The 1-minute load average, rounded (None where the OS has none)."""
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def command_line() -> str:
    """This process's command line, as a shell would take it (``autolade`` for the console script)."""
    import shlex
    import sys
    from pathlib import Path

    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "autolade":
        argv[0] = "autolade"
    return shlex.join(argv)


def environment(model: Any, *, command: str | None = None) -> dict[str, Any]:
    """What a benchmark report records about where it ran: date, command, CPU model, versions, the
    model's device, dtype, name and attention implementation (and GPU name, fingerprint)."""
    import datetime as dt
    import os

    import torch
    import transformers

    param = next(model.parameters())
    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else command_line(),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_model": _cpu_info()["model"],
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "model": str(getattr(model.config, "_name_or_path", "") or getattr(model.config, "model_type", "")),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if param.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(param.device)
    try:
        from autolade.machine.models import model_fingerprint

        env["model_fingerprint"] = model_fingerprint(model)
    except Exception:
        pass
    return env
