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

A recycling setting packs what the machine's price of a packed token lets through (``generate()``
cuts recycled drafts at ``StepCurve.token_cost``), so its table counts it at several prices (rows of
one config differing in ``Setting.token_cost``): the prediction reads them at this curve's price,
linearly between the two nearest counted prices. Priced at full budget on a 2-core CPU, SmolLM2's
chat row predicted 2.07 tokens/step where the machine's cut packs half the tokens and gets 1.78.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autolade.errors import ProfileError
from autolade.records.acceptance import AcceptanceRow, AcceptanceTable
from autolade.records.curve import StepCurve
from autolade.records.grid import GREEDY_SETTING, Setting
from autolade.runtime.defaults import builtin_default

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
    price: float | None = None  # the packed-token price its priced rows were read at; None: none counted at a price


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
    """Price one measured row on this curve at ``context``; where the curve pads a lone token
    (``StepCurve.pads_single``: c(2) < c(1)), a drafting setting's one-token steps run, and cost, two
    tokens (``generate(pad_single=None)``; plain greedy keeps its one-token steps, the reference)."""
    lone = 2 if curve.pads_single() and not row.setting.greedy else 1
    cost = sum(n * step_cost(curve, max(k, lone), context=context) for k, n in row.packed_hist.items()) / row.steps
    tokens_per_step = row.tokens_per_step * applied_scale(row)  # carried to the table's whole prompt sample
    return Prediction(
        setting=row.setting,
        speedup=tokens_per_step * curve.cost(1, context) / cost,
        tokens_per_step=tokens_per_step,
        packed_per_step=row.packed_mean,
        step_cost_ms=cost,
        extrapolated=max(row.packed_hist) > curve.ks[-1],
    )


def applied_scale(row: AcceptanceRow) -> float:
    """The row's ``sample_scale`` where it applies. The scale is measured on replayed prompt-lookup settings:
    how much more the whole prompt sample copies than the row's few prompts. A setting that drafts by prompt
    lookup gains with that; one that does not (the window, recycling alone) is read as counted. Carrying the
    lookup's factor to every row made W2 N3 G2 + recycle 16 (no lookup) the 1.5B's code pick at 2.19 tokens/step
    where 10 held-out prompts gave it 1.99-2.17, behind scaled lookup + recycle 16 (BENCHMARKS.md, issue 39)."""
    return row.sample_scale if row.setting.config.prompt_lookup > 0 else 1.0


def predict_priced(rows: list[AcceptanceRow], curve: StepCurve, *, context: int) -> Prediction:
    """One setting from its rows (one config and policy, each counted at its own ``token_cost``): a lone
    row as counted; priced rows read at this curve's price of a packed token, linearly between the two
    nearest counted prices (an unpriced row counts as price 0; past the last price, the last row)."""
    setting = next((r.setting for r in rows if r.setting.token_cost is None), rows[0].setting.unpriced)  # what runs
    if not any(r.setting.token_cost is not None for r in rows):
        return replace(predict_row(rows[0], curve, context=context), setting=setting)
    price = curve.token_cost()
    ordered = sorted(rows, key=lambda r: r.setting.price)
    lo = next((r for r in reversed(ordered) if r.setting.price <= price), ordered[0])
    hi = next((r for r in ordered if r.setting.price >= price), ordered[-1])
    a, b = predict_row(lo, curve, context=context), predict_row(hi, curve, context=context)
    span = hi.setting.price - lo.setting.price
    t = min(max((price - lo.setting.price) / span, 0.0), 1.0) if span > 0 else 0.0

    def mix(x: float, y: float) -> float:
        return x + t * (y - x)

    return Prediction(setting=setting, speedup=mix(a.speedup, b.speedup), tokens_per_step=mix(a.tokens_per_step, b.tokens_per_step),
                      packed_per_step=mix(a.packed_per_step, b.packed_per_step), step_cost_ms=mix(a.step_cost_ms, b.step_cost_ms),
                      extrapolated=a.extrapolated or b.extrapolated, price=price)


def setting_rows(table: AcceptanceTable, setting: Setting) -> list[AcceptanceRow]:
    """The rows of ``table`` that run ``setting``'s config under its policy, at every counted price."""
    return [r for r in table.rows if r.setting.config == setting.config and r.setting.policy == setting.policy]


def predict_setting(table: AcceptanceTable, setting: Setting, curve: StepCurve, *, context: int | None = None) -> Prediction:
    """``setting`` (a config and policy the table counted) priced on ``curve``, at this curve's packed-token price."""
    rows = setting_rows(table, setting)
    if not rows:
        raise ProfileError(f"the acceptance table has no row for {setting.label!r}")
    return predict_priced(rows, curve, context=table.context_median if context is None else context)


def predict(table: AcceptanceTable, curve: StepCurve, *, context: int | None = None) -> list[Prediction]:
    """Every setting of ``table`` priced by ``curve``, best first; greedy is always among them at 1.0.
    A setting counted at several prices is one prediction, read at this curve's price (``predict_priced``).

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
    groups: dict[tuple, list[AcceptanceRow]] = {}
    for row in table.rows:
        groups.setdefault((row.setting.config, row.setting.policy), []).append(row)
    out = [predict_priced(rows, curve, context=ctx) for rows in groups.values()]
    if not any(p.setting.greedy for p in out):
        out.append(Prediction(setting=GREEDY_SETTING, speedup=1.0, tokens_per_step=1.0, packed_per_step=1.0,
                              step_cost_ms=curve.cost(1, ctx)))
    return sorted(out, key=lambda p: (-p.speedup, p.packed_per_step))


def choose(table: AcceptanceTable, curve: StepCurve, *, context: int | None = None,
           margin: float = CHOOSE_MARGIN) -> Prediction:
    """The best prediction that beats greedy by ``margin`` without extrapolating the curve; else greedy.

    The built-in default of the curve's device (``defaults.builtin_default``), when the table has its
    row, is the incumbent: another setting displaces it only when predicted ``margin`` faster. A
    prediction a few percent off must not trade a setting measured on many machines for a guess
    (measured: fp32 code on the 2-core EPYC, lookup 10x1 predicted 1.03x the default, timed 0.89x).
    Among the other settings predicted within ``margin`` of the best, the one that packs the fewest tokens
    a step wins: the counts rest on a few prompts, and a wider step carries more of what the curve does
    not see (host work per packed token, a curve read under load). Measured: the 1.5B bf16 code table put
    W7 N2 G7 + scaled lookup 16x3 (11.6 packed) 1% ahead of scaled lookup + recycle 16 (7.2 packed); on 10
    held-out prompts the two accepted the same tokens a step and the narrower one ran 12% faster (issue 39)."""
    ranked = [p for p in predict(table, curve, context=context) if not p.extrapolated or p.setting.greedy]
    greedy = next(p for p in ranked if p.setting.greedy)
    config, policy = builtin_default(curve.device.split(":")[0])
    incumbent = next((p for p in ranked if policy is None and p.setting.policy == "static" and p.setting.config == config), None)
    best = next((p for p in ranked if not p.setting.greedy), None)
    if best is None:
        return greedy
    near = [p for p in ranked if not p.setting.greedy and margin * p.speedup >= best.speedup]  # a tie, within the error
    best = incumbent if incumbent in near else min(near, key=lambda p: (p.packed_per_step, -p.speedup))
    return best if best.speedup >= margin * greedy.speedup else greedy


def format_predictions(predictions: list[Prediction]) -> str:
    """A readable ranking: one line per setting."""
    lines = [f"{'setting':<40}{'speedup':>9}{'tokens/step':>13}{'packed/step':>13}{'ms/step':>10}"]
    for p in predictions:
        mark = "  (curve extrapolated)" if p.extrapolated else ""
        if p.setting.config.recycle and p.price is None:
            mark += "  (recycling counted unpriced: optimistic where the curve cuts its drafts)"
        elif p.price is not None:
            mark += f"  (read at {p.price:.3f}/packed token)"
        lines.append(f"{p.setting.label:<40}{p.speedup:>8.2f}x{p.tokens_per_step:>13.2f}{p.packed_per_step:>13.1f}"
                     f"{p.step_cost_ms:>10.2f}{mark}")
    return "\n".join(lines)


# --- predicted profiles ---------------------------------------------------------------------

PREDICTED = "predicted"  # a Profile whose notes start with this was chosen from a table, not tuned


def policy_spec(setting: Setting) -> dict[str, Any] | None:
    """The Profile/generate() policy spec that runs ``setting``: None (static) or ``{"name": "lookup"}``."""
    return None if setting.policy == "static" else {"name": setting.policy}


def predicted_settings(table: AcceptanceTable, curve: Any) -> tuple[Any, Any]:
    """(the chosen Prediction, its ranking): ``predict.choose`` over the table's settings on this curve."""
    return choose(table, curve), predict(table, curve)


def predicted_note(prediction: Any, table: AcceptanceTable, table_source: str) -> str:
    """The notes of a predicted Profile (they start with ``PREDICTED``: resolution ranks it below a tuned one)."""
    return (f"{PREDICTED} by autolade profile from acceptance table {table_source} "
            f"(created {table.created}): {prediction.setting.label} at {prediction.speedup:.2f}x greedy "
            f"({prediction.tokens_per_step:.2f} tokens/step, {prediction.packed_per_step:.1f} packed/step)")


def is_predicted(profile: Any) -> bool:
    return profile.notes.startswith(PREDICTED)


def covered(table: AcceptanceTable, config: Any, policy: dict | None) -> Setting | None:
    """The table's Setting that runs exactly ``config`` under ``policy`` (None/static or plain lookup), or None."""
    name = "static" if policy is None or policy == {"name": "static"} else policy.get("name")
    if policy is not None and name == "lookup" and set(policy) != {"name"}:
        return None  # lookup with its own parameters: not the tabulated default
    for row in table.rows:
        if row.setting.config == config and row.setting.policy == name:
            return row.setting.unpriced  # what runs; a recycling setting's rows at each price are read together
    return None
