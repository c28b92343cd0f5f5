"""Which dtype to run a model in on this machine: float32 against bfloat16, priced on both step curves."""

from __future__ import annotations

from typing import Any

from autolade.records.curve import StepCurve, running_curve

# bf16 is recommended over fp32 only when its step curve predicts decoding at least this much
# faster: it gives up fp32 greedy's outputs (a bf16 model is exactly greedy in bf16) for the speed.
DTYPE_MARGIN = 1.10


def recommend_dtype(curves: dict[str, StepCurve], *, table: Any = None) -> tuple[str, str]:
    """(dtype, why) from this model's step curves in float32 and bfloat16 on this machine.

    What decides decoding speed is the step curve, not a raw matmul rate: each dtype's predicted
    time per token is c(1) / s, s the speedup ``autolade.runtime.predict.choose`` predicts from the
    acceptance ``table`` (an ``AcceptanceTable`` of this model; either dtype's: acceptance barely
    depends on it) on that dtype's curve; without a table, greedy's c(1). bf16 wins when that is
    ``DTYPE_MARGIN`` x faster than fp32's. On an AMX Xeon, say, c(1) is the same in both dtypes
    but bf16 packs 16 tokens for 1.11 x c(1) and fp32 for ~2 x c(1): with a table whose windows
    accept, bf16 decodes faster although its one-token step is no cheaper.
    """
    missing = [d for d in ("float32", "bfloat16") if d not in curves]
    if missing:
        raise ValueError(f"recommend_dtype needs step curves for float32 and bfloat16; missing {', '.join(missing)} "
                         f"(measure it with `autolade profile --dtype {missing[0]}`)")
    seen = {dtype: _per_token(curves[dtype], table) for dtype in ("float32", "bfloat16")}
    ratio = seen["float32"][0] / seen["bfloat16"][0]
    basis = "" if table is not None else "; no acceptance table, so greedy steps only (`autolade accept` measures one)"
    detail = "; ".join(
        f"{dtype} {ms:.2f} ms/token ({'compiled, ' if curves[dtype].compiled else ''}c(1) {curves[dtype].cost(1):.1f} ms, "
        f"{label})" for dtype, (ms, label) in seen.items()
    ) + basis
    if ratio >= DTYPE_MARGIN:
        return "bfloat16", (f"step curves predict {ratio:.2f}x float32's decoding speed for this model ({detail}); "
                            "outputs then match bf16 greedy, not fp32 greedy (pass --dtype bfloat16 to choose it)")
    return "float32", (f"step curves predict bfloat16 at only {ratio:.2f}x float32's decoding speed for this model ({detail}): "
                       "bf16 would cost precision for little speed")


def _per_token(curve: StepCurve, table: Any) -> tuple[float, str]:
    """(predicted ms per token, the setting that gives it): the table's choice on this curve, else greedy."""
    if table is None:
        return curve.cost(1), "greedy"
    from autolade.runtime.predict import choose

    best = choose(table, curve)
    return curve.cost(1, table.context_median) / best.speedup, f"{best.setting.label} at {best.speedup:.2f}x greedy"


def stored_dtype_advice(curve: StepCurve, *, store: Any, hardware: Any, model_fingerprint: dict[str, str],
                        table: Any = None, compiled: StepCurve | None = None) -> tuple[str | None, str]:
    """(dtype, why) for this machine and model: ``curve`` (this dtype's eager curve) against the other dtype's
    latest stored one, priced with the acceptance ``table`` if given (see ``recommend_dtype``);
    ``(None, how to measure it)`` when the other curve is not stored yet.

    Each dtype is priced on the steps ``generate()`` would run in it: its compiled curve (``compiled`` for this
    dtype, else the latest stored one) where ``records.curve.compile_pays`` says compiled steps pay, else the eager
    curve, as settings resolution decides."""
    if curve.dtype not in ("float32", "bfloat16"):
        return None, f"no dtype advice for {curve.dtype}: it compares float32 and bfloat16 step curves"
    other = "bfloat16" if curve.dtype == "float32" else "float32"
    key = dict(hardware_fingerprint=hardware.fingerprint, model_fingerprint=model_fingerprint)
    stored = store.latest_curve(**key, dtype=other)
    if stored is None:
        return None, (f"no {other} step curve of this model on this machine yet: run `autolade profile --dtype {other}` "
                      "to compare the two dtypes")
    mine = compiled if compiled is not None else store.latest_curve(**key, dtype=curve.dtype, compiled=True)
    return recommend_dtype({curve.dtype: running_curve(curve, mine),
                            other: running_curve(stored, store.latest_curve(**key, dtype=other, compiled=True))},
                           table=table)


def isa_note(hardware: Any, dtype: str) -> str | None:
    """A note for a bf16 decode on a CPU that shows no bf16 matmul instructions (``avx512_bf16``, AMX), else None.

    There a bf16 step converts its operands to fp32 (the 2-core AVX-512 Xeon without them measured bf16 matmuls at
    a fifth of fp32's rate, a 16-token step at 3.8x one against 2.2x in fp32; BENCHMARKS.md), so fp32 may decode as
    fast, with fp32 greedy's tokens. A fact about the chip, not a measurement: the measured answer is
    ``stored_dtype_advice``, which the note names the commands for."""
    if hardware.is_gpu or dtype != "bfloat16" or hardware.isa_class in ("amx", "avx512_bf16"):
        return None
    return ("this CPU shows no bf16 matmul instructions (avx512_bf16, AMX): bf16 steps convert to fp32 and wide steps "
            "cost more than in fp32, which may decode as fast with fp32 greedy's tokens; `autolade profile --dtype "
            "bfloat16` then `autolade profile --dtype float32` measures both and says which to run")
