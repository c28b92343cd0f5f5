"""Predict each tabulated setting's speedup on this machine: measured acceptance x measured step cost.

Over a generation, a setting commits T tokens in S steps of packed sizes k_i; greedy commits the
same T tokens in T one-token steps. So the speedup over greedy is

    (T / S) x c(1) / E_hist[c(k)],   E_hist[c(k)] = sum_k hist[k] c(k) / S,

with the acceptance (T/S and the packed-size histogram) from an ``AcceptanceTable`` (the same on
every machine) and c(k) from this machine's ``StepCurve``, read at one context (the table's
typical context unless given). Pricing the histogram rather than c(mean k) matters on a convex
curve: a mix of small and large steps costs more than steps of the mean size.

Past the curve's largest measured k, c(k) is extrapolated linearly from the last two measured ks
(never decreasing), and the prediction is flagged ``extrapolated``; ``choose`` never picks an
extrapolated one (a default slower than greedy is the failure to avoid).
"""

from __future__ import annotations

from dataclasses import dataclass

from .acceptance import GREEDY_SETTING, AcceptanceRow, AcceptanceTable, Setting
from .curve import StepCurve
from .errors import ProfileError

CHOOSE_MARGIN = 1.03  # a setting must be predicted this much faster than greedy to be chosen


@dataclass(frozen=True)
class Prediction:
    """One setting's predicted speedup over greedy on this machine."""

    setting: Setting  # what would run
    speedup: float  # predicted tokens/s over greedy's
    tokens_per_step: float  # measured: tokens / steps, all prompts pooled
    packed_per_step: float  # measured: the histogram's mean packed size
    step_cost_ms: float  # E_hist[c(k)] at the context used
    extrapolated: bool = False  # some packed size lay beyond the curve's largest k


def step_cost(curve: StepCurve, k: float, *, context: int) -> float:
    """c(k) in ms at ``context``: the curve's interpolation within its ks, linear past the last two."""
    ks = curve.ks
    if k <= ks[-1] or len(ks) < 2:
        return curve.cost(k, context)
    k0, k1 = ks[-2], ks[-1]
    c0, c1 = curve.cost(k0, context), curve.cost(k1, context)
    slope = max((c1 - c0) / (k1 - k0), 0.0)
    return c1 + slope * (k - k1)


def predict_row(row: AcceptanceRow, curve: StepCurve, *, context: int) -> Prediction:
    """Price one measured row on this curve at ``context``."""
    cost = sum(n * step_cost(curve, k, context=context) for k, n in row.packed_hist.items()) / row.steps
    tokens_per_step = row.tokens_per_step * row.sample_scale  # carried to the table's whole prompt sample
    return Prediction(
        setting=row.setting,
        speedup=tokens_per_step * curve.cost(1, context) / cost,
        tokens_per_step=tokens_per_step,
        packed_per_step=row.packed_mean,
        step_cost_ms=cost,
        extrapolated=max(row.packed_hist) > curve.ks[-1],
    )


def predict(table: AcceptanceTable, curve: StepCurve, *, context: int | None = None) -> list[Prediction]:
    """Every row of ``table`` priced by ``curve``, best first; greedy is always among them at 1.0.

    ``context``: the KV length to read c(k) at; None = the table's typical (median) context.
    Ties go to the smaller packed size.
    """
    if not isinstance(table, AcceptanceTable) or not isinstance(curve, StepCurve):
        raise ProfileError("predict needs an AcceptanceTable and a StepCurve")
    if not table.rows:
        raise ProfileError("the acceptance table has no rows: measure some settings first (`autolade accept`)")
    if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 0):
        raise ProfileError(f"context must be an integer >= 0, got {context!r}")
    ctx = table.context_median if context is None else context
    out = [predict_row(row, curve, context=ctx) for row in table.rows]
    if not any(p.setting.greedy for p in out):
        out.append(Prediction(setting=GREEDY_SETTING, speedup=1.0, tokens_per_step=1.0, packed_per_step=1.0,
                              step_cost_ms=curve.cost(1, ctx)))
    return sorted(out, key=lambda p: (-p.speedup, p.packed_per_step))


def choose(table: AcceptanceTable, curve: StepCurve, *, context: int | None = None,
           margin: float = CHOOSE_MARGIN) -> Prediction:
    """The best prediction that beats greedy by ``margin`` without extrapolating the curve; else greedy.

    The built-in default of the curve's device (``settings.builtin_default``), when the table has its
    row, is the incumbent: another setting displaces it only when predicted ``margin`` faster. A
    prediction a few percent off must not trade a setting measured on many machines for a guess
    (measured: fp32 code on the 2-core EPYC, lookup 10x1 predicted 1.03x the default, timed 0.89x)."""
    from .settings import builtin_default

    ranked = [p for p in predict(table, curve, context=context) if not p.extrapolated or p.setting.greedy]
    greedy = next(p for p in ranked if p.setting.greedy)
    config, policy = builtin_default(curve.device.split(":")[0])
    incumbent = next((p for p in ranked if policy is None and p.setting.policy == "static" and p.setting.config == config), None)
    best = next((p for p in ranked if not p.setting.greedy), None)
    if best is None:
        return greedy
    if incumbent is not None and best.speedup < margin * incumbent.speedup:
        best = incumbent
    return best if best.speedup >= margin * greedy.speedup else greedy


def format_predictions(predictions: list[Prediction]) -> str:
    """A readable ranking: one line per setting."""
    lines = [f"{'setting':<40}{'speedup':>9}{'tokens/step':>13}{'packed/step':>13}{'ms/step':>10}"]
    for p in predictions:
        mark = "  (curve extrapolated)" if p.extrapolated else ""
        lines.append(f"{p.setting.label:<40}{p.speedup:>8.2f}x{p.tokens_per_step:>13.2f}{p.packed_per_step:>13.1f}"
                     f"{p.step_cost_ms:>10.2f}{mark}")
    return "\n".join(lines)
