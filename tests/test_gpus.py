"""The GPU probe through stand-ins for pynvml and torch.cuda (several GPUs, MIG, failures), and the derived estimates."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

from autolade.machine.gpus import gpu_mem_bandwidth, gpu_peak_flops, probe_gpus
from autolade.machine.hardware import probe_hardware


def test_gpu_derived_figures_are_estimates():
    flops, source = gpu_peak_flops(name="NVIDIA H100 80GB HBM3", sm_count=132, sm_clock_mhz=1980, compute_capability=(9, 0))
    assert flops == 989e12 and "spec table" in source
    flops, source = gpu_peak_flops(name="Some Future GPU", sm_count=108, sm_clock_mhz=1410, compute_capability=(8, 0))
    assert math.isclose(flops, 108 * 1410e6 * 2048) and "SMs" in source
    assert gpu_peak_flops(name="Mystery", sm_count=None, sm_clock_mhz=None, compute_capability=None) == (None, None)
    # RTX 3090: 9751 MHz (NVML), 384-bit bus -> the spec's 936 GB/s
    assert math.isclose(gpu_mem_bandwidth(mem_clock_mhz=9751, bus_width_bits=384), 936.1e9, rel_tol=1e-3)
    assert gpu_mem_bandwidth(mem_clock_mhz=None, bus_width_bits=384) is None


# --- NVML, through stand-ins for pynvml and torch.cuda ----------------------------------------


class NVMLError(Exception):
    """pynvml's base error; NVMLError_NotSupported and the init errors derive from it."""


class NVMLError_NotSupported(NVMLError):  # pynvml names it so
    def __str__(self) -> str:
        return "Not Supported"


class FakeNvml:
    """A pynvml-like module: each GPU a dict; ``unsupported`` names queries that raise NotSupported."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus, *, init_error=None, unsupported=(), broken=()):
        self.gpus, self.init_error, self.unsupported, self.broken = gpus, init_error, set(unsupported), set(broken)
        self.calls: list[str] = []

    def _call(self, name, value):
        self.calls.append(name)
        if name in self.unsupported:
            raise NVMLError_NotSupported()
        return value

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self):
        return self._call("driver", b"550.54.15")

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self._call("cuda", 12040)

    def nvmlSystemGetCudaDriverVersion(self):
        return self._call("cuda", 12040)

    def nvmlDeviceGetCount(self):
        return self._call("count", len(self.gpus))

    def nvmlDeviceGetHandleByIndex(self, index):
        if index in self.broken:
            raise NVMLError("GPU is lost")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle):
        return self._call("name", handle["name"].encode())

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._call("memory", SimpleNamespace(total=handle["memory"], free=handle["memory"] // 2))

    def nvmlDeviceGetMaxClockInfo(self, handle, which):
        return self._call("clock", handle["sm_clock"] if which == self.NVML_CLOCK_SM else handle["mem_clock"])

    def nvmlDeviceGetMemoryBusWidth(self, handle):
        return self._call("bus", handle["bus"])

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._call("cc", handle["cc"])

    def nvmlDeviceGetMigMode(self, handle):
        return self._call("mig", (1, 1) if handle.get("mig") else (0, 0))

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return self._call("mig", 7)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        slices = handle.get("mig") or []
        if index >= len(slices):
            raise NVMLError("Not Found")
        return slices[index]

    def nvmlDeviceGetAttributes(self, handle):
        return self._call("attributes", SimpleNamespace(multiprocessorCount=handle["sms"], gpuInstanceSliceCount=1))


class FakeCuda:
    def __init__(self, sms):
        self.sms = sms

    def is_available(self):
        return True

    def device_count(self):
        return len(self.sms)

    def get_device_properties(self, index):
        return SimpleNamespace(multi_processor_count=self.sms[index], major=9, minor=0)


H200 = {"name": "NVIDIA H200", "memory": 141 * 2**30, "sm_clock": 1980, "mem_clock": 3201, "bus": 6144, "cc": (9, 0)}
L4 = {"name": "NVIDIA L4", "memory": 24 * 2**30, "sm_clock": 2040, "mem_clock": 6251, "bus": 192, "cc": (8, 9)}
MIG_SLICE = {"name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "memory": 10 * 2**30, "sms": 16}
H100_MIG = {"name": "NVIDIA H100 80GB HBM3", "memory": 80 * 2**30, "sm_clock": 1980, "mem_clock": 2619, "bus": 5120,
            "cc": (9, 0), "mig": [MIG_SLICE, MIG_SLICE]}


def test_nvml_several_gpus_profile_fingerprint_and_class():
    nvml = FakeNvml([H200, L4])
    hw = probe_hardware(device="cuda:1", measure=False, nvml=nvml, cuda=FakeCuda([132, 58]))
    assert [g.name for g in hw.gpus] == ["NVIDIA H200", "NVIDIA L4"]
    assert hw.gpu.name == "NVIDIA L4" and hw.gpu.sm_count == 58 and hw.gpu.compute_capability == (8, 9)
    assert hw.fingerprint == "cuda:NVIDIA-L4:58sm:24GiB" and hw.hardware_class == "cuda:NVIDIA-L4"
    assert hw.gpus[0].driver_version == "550.54.15" and hw.gpus[0].cuda_version == "12.4"
    assert hw.gpus[0].peak_flops == 989e12 and hw.gpus[0].mem_bandwidth == 2 * 3201e6 * 6144 / 8
    assert hw.notes == () and nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"
    assert "gpu 1*" in hw.summary()
    json.dumps(hw.to_dict())
    # the default device is the first GPU
    assert probe_hardware(measure=False, nvml=FakeNvml([H200, L4]), cuda=FakeCuda([132, 58])).device == "cuda:0"


def test_nvml_mig_slice_is_its_own_hardware():
    hw = probe_hardware(device="cuda:0", measure=False, nvml=FakeNvml([H100_MIG]), cuda=FakeCuda([16]))
    gpu = hw.gpu
    assert gpu.mig_profile == "1g.10gb" and gpu.mig_instances == 2
    assert gpu.memory_total == 10 * 2**30 and gpu.sm_count == 16  # the slice's, not the part's
    assert hw.fingerprint == "cuda:NVIDIA-H100-80GB-HBM3:16sm:10GiB:mig-1g.10gb"
    assert hw.hardware_class == "cuda:NVIDIA-H100-80GB-HBM3:mig-1g.10gb"
    assert gpu.peak_flops == 16 * 1980e6 * 4096  # SMs x clock, never the whole part's spec sheet
    assert any("MIG on, 2 instance(s)" in note for note in hw.notes)
    # without torch's SM count the slice's comes from NVML's attributes
    gpus, _ = probe_gpus(nvml=FakeNvml([H100_MIG]), cuda=SimpleNamespace(is_available=lambda: False))
    assert gpus[0].sm_count == 16


def test_nvml_unsupported_fields_stay_unknown_with_a_note():
    nvml = FakeNvml([L4], unsupported={"clock", "bus", "cuda", "mig"})
    hw = probe_hardware(device="cuda:0", measure=False, nvml=nvml, cuda=FakeCuda([58]))
    gpu = hw.gpu
    assert gpu.max_sm_clock_mhz is None and gpu.bus_width_bits is None and gpu.mem_bandwidth is None
    assert gpu.cuda_version is None and gpu.mig_profile is None
    assert gpu.peak_flops == 121e12  # the spec table needs only the name
    assert hw.fingerprint == "cuda:NVIDIA-L4:58sm:24GiB"
    assert hw.notes == ("GPU 0: NVML does not report max_sm_clock_mhz, max_mem_clock_mhz, bus_width_bits (left unknown)",)
    assert "clocks SM ? MHz" in hw.summary()


def test_nvml_failures_degrade_to_notes():
    driver = type("NVMLError_DriverNotLoaded", (NVMLError,), {"__str__": lambda self: "Driver Not Loaded"})
    gpus, notes = probe_gpus(nvml=FakeNvml([H200], init_error=driver()), cuda=FakeCuda([132]))
    assert gpus == [] and notes == ["NVML not available: Driver Not Loaded (no NVIDIA driver on this machine)"]
    gpus, notes = probe_gpus(nvml=FakeNvml([H200], unsupported={"count"}), cuda=FakeCuda([132]))
    assert gpus == [] and notes == ["NVML not available: query failed (Not Supported)"]
    # one lost GPU of two: the other is still reported
    nvml = FakeNvml([H200, L4], broken={0})
    gpus, notes = probe_gpus(nvml=nvml, cuda=FakeCuda([132, 58]))
    assert [g.name for g in gpus] == ["NVIDIA L4"] and notes == ["GPU 0: NVML query failed (GPU is lost); left out"]
    assert nvml.calls[-1] == "shutdown"
    # the GPU the model runs on was left out: the fingerprint still names CUDA, never crashes
    hw = probe_hardware(device="cuda:0", measure=False, nvml=FakeNvml([H200], broken={0}), cuda=FakeCuda([132]))
    assert hw.gpu is None and hw.fingerprint == "cuda:cuda-0" and hw.hardware_class == "cuda:unknown"
    assert "NVML found no GPU" in hw.notes
    hw = probe_hardware(device="cpu", measure=False, nvml=FakeNvml([], init_error=driver()))
    assert hw.notes == ("NVML not available: Driver Not Loaded (no NVIDIA driver on this machine)",)
    assert hw.fingerprint.startswith("cpu:")
