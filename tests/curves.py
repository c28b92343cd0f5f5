"""Step curves and a CPU hardware profile shared by the curve, hardware and dtype-advice tests."""

from autolade.machine.hardware import HardwareProfile
from autolade.records.curve import StepCurve

# Measured on this project's 2-core AMD EPYC (SmolLM2-135M, context 300), see docs/DESIGN.md.
DESIGN_KS = [1, 2, 4, 8, 16, 24, 32, 48, 64]
FP32_CPU = StepCurve(points={300: dict(zip(DESIGN_KS, [58, 117, 115, 102, 124, 125, 152, 181, 228]))})
BF16_CPU = StepCurve(points={300: dict(zip(DESIGN_KS, [40, 36, 41, 50, 55, 70, 79, 88, 93]))}, dtype="bfloat16")
FLAT_GPU = StepCurve(
    points={512: {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.1, 32: 10.3, 64: 10.8, 128: 11.5, 256: 14.0}}, device="cuda:0"
)


def cpu_profile(**changes) -> HardwareProfile:
    base = dict(
        device="cpu",
        cpu_model="AMD EPYC 7B13 64-Core Processor",
        cpu_vendor="AuthenticAMD",
        cpu_family="25",
        cpu_flags=("avx2", "avx512f", "avx512_bf16"),
        logical_cpus=2,
        torch_threads=2,
        torch_version="2.13.0",
        cpu_fp32_flops=1e11,
    )
    base.update(changes)
    return HardwareProfile(**base)
