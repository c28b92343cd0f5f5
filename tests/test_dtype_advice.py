"""Which dtype to run: float32 against bfloat16, priced on both step curves."""

from __future__ import annotations

import pytest
from curves import BF16_CPU, FP32_CPU, cpu_profile

from autolade.config import LookaheadConfig
from autolade.records.curve import StepCurve
from autolade.tuning.dtype_advice import recommend_dtype

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


def test_stored_dtype_advice_prices_each_dtype_on_the_steps_that_run():
    from autolade.store.db import ProfileStore
    from autolade.tuning.dtype_advice import stored_dtype_advice

    hw = cpu_profile()
    fp = {"name": "m", "config_hash": "abc123", "dtype": "float32"}
    # the fp32 step compiled: as flat as bf16's eager step and a tenth cheaper, so compiled steps pay in fp32
    fp32_compiled = StepCurve(points={256: {k: 0.9 * ms for k, ms in AMX_BF16.points[256].items()}}, compiled=True)
    with ProfileStore(":memory:") as store:
        store.save_curve(AMX_BF16, hardware_fingerprint=hw.fingerprint, model_fingerprint={**fp, "dtype": "bfloat16"})
        eager_only = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp, table=window_table())
        given = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp, table=window_table(),
                                    compiled=fp32_compiled)
        store.save_curve(fp32_compiled, hardware_fingerprint=hw.fingerprint, model_fingerprint=fp)
        stored = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp, table=window_table())
        # a compiled curve that costs more than the eager one is not what runs: the eager curve prices that dtype
        dear = StepCurve(points={256: {k: 2 * ms for k, ms in AMX_BF16.points[256].items()}}, dtype="bfloat16",
                         compiled=True)
        store.save_curve(dear, hardware_fingerprint=hw.fingerprint, model_fingerprint={**fp, "dtype": "bfloat16"})
        passed_over = stored_dtype_advice(AMX_FP32, store=store, hardware=hw, model_fingerprint=fp, table=window_table())
    assert eager_only[0] == "bfloat16" and "compiled" not in eager_only[1]
    assert given == stored and stored[0] == "float32"  # fp32 compiled decodes as fast as bf16 does: keep fp32's outputs
    # 2 tokens a step for c(16): 19.98 ms compiled in fp32, 22.2 ms eager in bf16
    assert "float32 9.99 ms/token (compiled, c(1) 18.0 ms" in stored[1] and "bfloat16 11.10 ms/token (c(1) 20.0" in stored[1]
    assert passed_over == stored


def test_isa_note_names_a_cpu_without_bf16_instructions():
    from autolade.tuning.dtype_advice import isa_note

    bare = cpu_profile(cpu_model="Intel(R) Xeon(R) Processor", cpu_vendor="GenuineIntel", cpu_family="6",
                       cpu_flags=("avx2", "avx512f", "avx512_vnni"))
    note = isa_note(bare, "bfloat16")
    assert note is not None and "no bf16 matmul instructions" in note and "autolade profile --dtype float32" in note
    assert isa_note(bare, "float32") is None  # fp32 needs nothing the chip lacks
    assert isa_note(cpu_profile(), "bfloat16") is None  # avx512_bf16
    assert isa_note(cpu_profile(cpu_flags=("avx2", "avx512f", "amx_tile", "amx_bf16")), "bfloat16") is None
    assert isa_note(cpu_profile(device="cuda:0"), "bfloat16") is None  # a GPU's bf16 is not the CPU's business
