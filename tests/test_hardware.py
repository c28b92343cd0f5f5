"""Hardware probe, step-latency curve and the dtype advice (CPU; GPU parts where a GPU is lent)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from tiny import tiny_llama
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from autolade.config import LookaheadConfig
from autolade.errors import ProfileError
from autolade.hardware import (
    GpuInfo,
    HardwareProfile,
    StepCurve,
    gpu_mem_bandwidth,
    gpu_peak_flops,
    measure_step_curve,
    packed_tokens,
    plot_curve,
    probe_gpus,
    probe_hardware,
    recommend_dtype,
)

# Measured on this project's 2-core AMD EPYC (SmolLM2-135M, context 300), see docs/DESIGN.md.
DESIGN_KS = [1, 2, 4, 8, 16, 24, 32, 48, 64]
FP32_CPU = StepCurve(points={300: dict(zip(DESIGN_KS, [58, 117, 115, 102, 124, 125, 152, 181, 228]))})
BF16_CPU = StepCurve(points={300: dict(zip(DESIGN_KS, [40, 36, 41, 50, 55, 70, 79, 88, 93]))}, dtype="bfloat16")
FLAT_GPU = StepCurve(
    points={512: {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.1, 32: 10.3, 64: 10.8, 128: 11.5, 256: 14.0}}, device="cuda:0"
)


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


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


def test_gpu_derived_figures_are_estimates():
    flops, source = gpu_peak_flops(name="NVIDIA H100 80GB HBM3", sm_count=132, sm_clock_mhz=1980, compute_capability=(9, 0))
    assert flops == 989e12 and "spec table" in source
    flops, source = gpu_peak_flops(name="Some Future GPU", sm_count=108, sm_clock_mhz=1410, compute_capability=(8, 0))
    assert math.isclose(flops, 108 * 1410e6 * 2048) and "SMs" in source
    assert gpu_peak_flops(name="Mystery", sm_count=None, sm_clock_mhz=None, compute_capability=None) == (None, None)
    # RTX 3090: 9751 MHz (NVML), 384-bit bus -> the spec's 936 GB/s
    assert math.isclose(gpu_mem_bandwidth(mem_clock_mhz=9751, bus_width_bits=384), 936.1e9, rel_tol=1e-3)
    assert gpu_mem_bandwidth(mem_clock_mhz=None, bus_width_bits=384) is None


# --- measuring the curve -----------------------------------------------------------------




def test_measure_step_curve_tiny_llama(one_thread):
    model = tiny_llama(max_positions=256)
    curve = measure_step_curve(model, ks=(2, 4, 8), contexts=(16, 48), repeats=2, warmup=1, name="tiny")
    assert curve.contexts == [16, 48] and curve.ks == [1, 2, 4, 8]  # k=1 always measured
    assert all(ms > 0 for row in curve.points.values() for ms in row.values())
    assert curve.dtype == "float32" and curve.device == "cpu" and curve.model == "tiny"
    assert 1 <= curve.spare_compute() <= 8
    assert set(curve.spread) == {16, 48} and all(sp >= 0 for row in curve.spread.values() for sp in row.values())
    back = StepCurve.from_dict(json.loads(json.dumps(curve.to_dict())))
    assert back.ks == curve.ks and back.contexts == curve.contexts and back.notes == curve.notes
    assert back.spread.keys() == curve.spread.keys()
    assert math.isclose(back.cost(4, 16), curve.cost(4, 16), rel_tol=1e-3)


def test_measure_step_curve_sliding_window_model(one_thread):
    # Gemma 3 has sliding-window layers; the context (40) is past the window (8)
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    model = Gemma3ForCausalLM(config).eval()
    curve = measure_step_curve(model, ks=(1, 4), contexts=(40,), repeats=1, warmup=1)
    assert curve.ks == [1, 4]


def test_measure_step_curve_checks_limits():
    with pytest.raises(ProfileError, match="max_position_embeddings"):
        measure_step_curve(tiny_llama(max_positions=64), ks=(1, 32), contexts=(48,))
    with pytest.raises(ProfileError, match="repeats"):
        measure_step_curve(tiny_llama(), ks=(1,), contexts=(8,), repeats=0)


def test_plot_curve(tmp_path, foreign_backend):
    import matplotlib

    path = plot_curve(BF16_CPU, tmp_path / "out" / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == foreign_backend  # the caller's backend is left alone


# --- which dtype -------------------------------------------------------------------------

AMX_KS = [1, 2, 4, 8, 16, 32, 64]
# An Intel Xeon with AMX: a one-token step costs the same in both dtypes; 16 tokens cost 1.11x one in bf16, ~2x in fp32
AMX_FP32 = StepCurve(points={256: dict(zip(AMX_KS, [20.0, 24.0, 30.0, 34.0, 40.0, 60.0, 100.0]))})
AMX_BF16 = StepCurve(points={256: dict(zip(AMX_KS, [20.0, 20.4, 21.0, 21.6, 22.2, 30.0, 45.0]))}, dtype="bfloat16")


def window_table():
    """A synthetic acceptance table: greedy, and a window packing 16 that accepts 2 tokens a step."""
    from autolade.acceptance import GREEDY_SETTING, AcceptanceRow, AcceptanceTable, Setting

    def row(setting, k, tokens):
        return AcceptanceRow(setting=setting, tokens_per_step_mean=tokens / 100, tokens_per_step_sd=0.0,
                             packed_per_step_mean=float(k), packed_per_step_sd=0.0, packed_hist={k: 100}, steps=100,
                             tokens=tokens, context_min=128, context_median=256, context_max=400)

    window = Setting.of(LookaheadConfig(window=3, ngram=4, guesses=2, prompt_lookup=0))
    return AcceptanceTable(model_name="m", model_config_hash="abc123", tokenizer_fingerprint="v96:x", workload="chat",
                           dtype="float32", max_new_tokens=128, prompts=2, rows=(row(GREEDY_SETTING, 1, 100), row(window, 16, 200)))


def test_recommend_dtype_follows_the_step_curves_not_c1():
    table = window_table()
    dtype, why = recommend_dtype({"float32": AMX_FP32, "bfloat16": AMX_BF16}, table=table)
    assert dtype == "bfloat16" and "--dtype bfloat16" in why
    assert "c(1) 20.0 ms" in why and "float32 20.00 ms/token" in why  # the window loses to greedy in fp32 here
    # bf16 a little cheaper per step but just as steep as fp32: not worth fp32's outputs
    steep_bf16 = StepCurve(points={256: {k: 0.95 * ms for k, ms in AMX_FP32.points[256].items()}}, dtype="bfloat16")
    dtype, why = recommend_dtype({"float32": AMX_FP32, "bfloat16": steep_bf16}, table=table)
    assert dtype == "float32" and "only 1.05x" in why
    # without a table only greedy steps compare: the same c(1), so no reason to give up fp32
    dtype, why = recommend_dtype({"float32": AMX_FP32, "bfloat16": AMX_BF16})
    assert dtype == "float32" and "no acceptance table" in why
    # this project's 2-core EPYC: bf16 both cheaper per step and flatter
    assert recommend_dtype({"float32": FP32_CPU, "bfloat16": BF16_CPU}, table=table)[0] == "bfloat16"
    with pytest.raises(ValueError, match="autolade profile --dtype bfloat16"):
        recommend_dtype({"float32": AMX_FP32})


def test_stored_dtype_advice_reads_the_other_dtype_from_the_store():
    from autolade.curve import stored_dtype_advice
    from autolade.store import ProfileStore

    hw = cpu_profile()
    fp = {"name": "m", "config_hash": "abc123", "dtype": "float32"}
    with ProfileStore(":memory:") as store:
        dtype, why = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp)
        assert dtype is None and "autolade profile --dtype bfloat16" in why
        store.save_curve(AMX_BF16, hardware_fingerprint=hw.fingerprint, model_fingerprint={**fp, "dtype": "bfloat16"})
        from_fp32 = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp, table=window_table())
        store.save_curve(AMX_FP32, hardware_fingerprint=hw.fingerprint, model_fingerprint=fp)
        from_bf16 = stored_dtype_advice(AMX_BF16, store=store, hardware=hw, model_fingerprint={**fp, "dtype": "bfloat16"},
                                        table=window_table())
    assert from_fp32 == from_bf16 and from_fp32[0] == "bfloat16"  # one measurement, one answer, from either side


# --- curve arithmetic --------------------------------------------------------------------


def test_cost_interpolates_and_clamps():
    curve = StepCurve(points={100: {1: 10.0, 4: 16.0, 8: 40.0}, 300: {1: 20.0, 4: 26.0, 8: 60.0}})
    assert curve.cost(1, 100) == 10.0
    assert curve.cost(2, 100) == 12.0  # linear between k=1 and k=4
    assert curve.cost(100, 100) == 40.0  # clamped past the largest k
    assert curve.cost(0.5, 100) == 10.0
    assert curve.cost(4, 200) == 21.0  # linear in context too
    assert curve.cost(4, 10_000) == 26.0
    assert curve.cost(4) == 21.0  # context=None: mean over contexts


def test_spare_compute_and_speedup_bound():
    assert FP32_CPU.spare_compute() == 1  # k=2 already costs 2x
    assert BF16_CPU.spare_compute() == 8  # 50 ms <= 1.25 x 40 ms; 55 is not
    assert FLAT_GPU.spare_compute() == 128  # 14 ms at k=256 is past 1.25 x 10 ms
    k = packed_tokens(window=15, ngram=5, guesses=15)
    assert k == 1 + 4 * 15 + 15 * 4 == 121
    assert math.isclose(FLAT_GPU.speedup_bound(15, 5, 15), 5 * 10.0 / FLAT_GPU.cost(121))
    assert FP32_CPU.speedup_bound(15, 5, 15) < 1.5  # the A100 setting is hopeless here
    assert FP32_CPU.speedup_bound(0, 5, 15) == 1.0


def test_noisy_points():
    curve = StepCurve(points={128: {1: 10.0, 2: 11.0}}, spread={128: {1: 0.1, 2: 3.0}}, notes=("busy",))
    assert curve.noisy_points() == [(128, 2, 3.0)]
    assert StepCurve.from_dict(curve.to_dict()).notes == ("busy",)


def test_curve_validation():
    with pytest.raises(ProfileError, match="k=1"):
        StepCurve(points={128: {2: 5.0}})
    with pytest.raises(ProfileError, match="positive"):
        StepCurve(points={128: {1: 5.0, 2: float("nan")}})
    with pytest.raises(ProfileError, match="points"):
        StepCurve.from_dict({"points": "no"})
    with pytest.raises(ProfileError, match="version"):
        StepCurve.from_dict({"version": 9, "points": {"1": {"1": 1.0}}})


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


def test_token_cost_is_the_mean_marginal_cost_of_a_packed_token():
    assert FLAT_GPU.token_cost() == pytest.approx((10.3 - 10.0) / (31 * 10.0))  # ~0.001: packing is nearly free
    assert BF16_CPU.token_cost() == pytest.approx((BF16_CPU.cost(32) - 40) / (31 * 40))
    assert BF16_CPU.token_cost() > 10 * FLAT_GPU.token_cost()
    cheaper = StepCurve(points={64: {1: 20.0, 2: 15.0, 32: 18.0}})  # a one-token step dearer than 32 packed
    assert cheaper.token_cost() == 0.0
