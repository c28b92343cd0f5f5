"""Hardware probe (CPU; GPU parts where a GPU is lent)."""

from __future__ import annotations

import json

import pytest
import torch
from curves import cpu_profile

from autolade.errors import ProfileError
from autolade.machine.gpus import GpuInfo
from autolade.machine.hardware import probe_hardware


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


# --- probe -------------------------------------------------------------------------------


def test_probe_cpu_is_a_normal_path():
    hw = probe_hardware(device="cpu", quick=True)
    assert hw.device == "cpu" and not hw.is_gpu and hw.gpu is None
    assert hw.torch_threads == torch.get_num_threads()
    assert hw.fingerprint.startswith("cpu:") and f":t{hw.torch_threads}:" in hw.fingerprint
    assert hw.hardware_class.startswith("cpu:")
    assert hw.cpu_fp32_flops > 0 and hw.cpu_mem_bandwidth > 0
    text = hw.summary()
    assert "measured" in text and hw.fingerprint in text
    if not nvml_works():
        assert any(note.startswith("NVML not available: ") for note in hw.notes)
        assert "NVML not available" in text
    json.dumps(hw.to_dict())  # plain data


def test_probe_is_stable():
    a, b = probe_hardware(device="cpu", quick=True), probe_hardware(device="cpu", quick=True)
    assert a.fingerprint == b.fingerprint and a.hardware_class == b.hardware_class
    fast = probe_hardware(device="cpu", measure=False)  # generate()'s lookup: identity only
    assert fast.fingerprint == a.fingerprint and fast.cpu_fp32_flops is None


def test_probe_rejects_unknown_device():
    with pytest.raises(ProfileError, match="device must be"):
        probe_hardware(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ProfileError, match="torch.cuda is not available"):
            probe_hardware(device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_probe_gpu():
    hw = probe_hardware()
    assert hw.device == "cuda:0" and hw.fingerprint.startswith("cuda:")
    gpu = hw.gpu
    assert gpu is not None and gpu.name and gpu.memory_total > 0 and gpu.sm_count > 0
    assert gpu.max_sm_clock_mhz and gpu.max_mem_clock_mhz and gpu.bus_width_bits
    assert gpu.mem_bandwidth > 1e11 and gpu.peak_flops > 1e12
    assert "estimate" in hw.summary()


def test_fingerprint_ignores_measurements_but_not_threads_or_isa():
    a = cpu_profile()
    assert a.fingerprint == "cpu:AMD-EPYC-7B13-64-Core-Processor:t2:avx512_bf16"
    assert a.hardware_class == "cpu:AuthenticAMD:f25:avx512_bf16"
    assert cpu_profile(cpu_fp32_flops=3e11, notes=("busy",)).fingerprint == a.fingerprint
    four = cpu_profile(torch_threads=4)
    assert four.fingerprint != a.fingerprint and four.hardware_class == a.hardware_class
    amx = cpu_profile(cpu_flags=("avx512f", "avx512_bf16", "amx_bf16"))
    assert amx.isa_class == "amx" and amx.fingerprint != a.fingerprint and amx.hardware_class != a.hardware_class


def test_gpu_fingerprint_and_class():
    h200 = GpuInfo(index=0, name="NVIDIA H200", memory_total=141 * 2**30, sm_count=132, max_sm_clock_mhz=1980)
    hw = cpu_profile(device="cuda:0", gpus=(h200,))
    assert hw.gpu is h200
    assert hw.fingerprint == "cuda:NVIDIA-H200:132sm:141GiB"
    assert hw.hardware_class == "cuda:NVIDIA-H200"
    mig = GpuInfo(index=0, name="NVIDIA H200", memory_total=18 * 2**30, sm_count=16)
    sliced = cpu_profile(device="cuda:0", gpus=(mig,))
    assert sliced.fingerprint != hw.fingerprint and sliced.hardware_class == hw.hardware_class


def test_summary_gives_no_dtype_answer_of_its_own():
    # the dtype answer comes from the step curves (recommend_dtype), not from the matmul rates
    summary = cpu_profile(cpu_fp32_flops=1.9e11, cpu_bf16_flops=5.0e11).summary()
    assert "cpu matmul:" in summary and "recommended" not in summary
