"""Hardware probe, step-latency curve and the dtype advice (CPU; GPU parts where a GPU is lent)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny import tiny_llama
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from autolade.config import LookaheadConfig
from autolade.errors import ProfileError
from autolade.machine.gpus import GpuInfo
from autolade.machine.hardware import HardwareProfile, probe_hardware
from autolade.machine.step_curve import measure_step_curve, plot_curve
from autolade.records.curve import StepCurve, packed_tokens
from autolade.tuning.dtype_advice import recommend_dtype

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
    from autolade.records.acceptance import AcceptanceRow, AcceptanceTable
    from autolade.records.grid import GREEDY_SETTING, Setting

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
    from autolade.store.db import ProfileStore
    from autolade.tuning.dtype_advice import stored_dtype_advice

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


def test_token_cost_is_the_mean_marginal_cost_of_a_packed_token():
    assert FLAT_GPU.token_cost() == pytest.approx((10.3 - 10.0) / (31 * 10.0))  # ~0.001: packing is nearly free
    assert BF16_CPU.token_cost() == pytest.approx((BF16_CPU.cost(32) - 40) / (31 * 40))
    assert BF16_CPU.token_cost() > 10 * FLAT_GPU.token_cost()
    cheaper = StepCurve(points={64: {1: 20.0, 2: 15.0, 32: 18.0}})  # a one-token step dearer than 32 packed
    assert cheaper.token_cost() == 0.0
