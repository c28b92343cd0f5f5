"""Predicting speedups from an acceptance table and a step curve (synthetic tables and curves)."""

from __future__ import annotations

import pytest

from autolade.config import LookaheadConfig
from autolade.errors import ProfileError
from autolade.records.acceptance import AcceptanceRow, AcceptanceTable
from autolade.records.curve import StepCurve
from autolade.records.grid import GREEDY_SETTING, Setting
from autolade.runtime.predict import choose, format_predictions, predict, predict_row, step_cost

LOOKUP = Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=2, prompt_lookup_drafts=1))
WINDOW = Setting.of(LookaheadConfig(window=4, ngram=4, guesses=4, prompt_lookup=0))


def row(setting: Setting, hist: dict[int, int], tokens: int, *, context: int = 100) -> AcceptanceRow:
    steps = sum(hist.values())
    return AcceptanceRow(
        setting=setting, tokens_per_step_mean=tokens / steps, tokens_per_step_sd=0.0,
        packed_per_step_mean=sum(k * n for k, n in hist.items()) / steps, packed_per_step_sd=0.0,
        packed_hist=hist, steps=steps, tokens=tokens, context_min=context // 2, context_median=context,
        context_max=2 * context,
    )  # fmt: skip


def table(*rows: AcceptanceRow) -> AcceptanceTable:
    return AcceptanceTable(model_name="m", model_config_hash="h", tokenizer_fingerprint="v96:x", workload="chat",
                           dtype="float32", max_new_tokens=128, prompts=10, rows=rows)


def curve(costs: dict[int, float], **more_contexts: dict[int, float]) -> StepCurve:
    points = {100: costs, **{int(k.removeprefix("ctx")): v for k, v in more_contexts.items()}}
    return StepCurve(points=points)


# 100 steps each: greedy; prompt lookup packing 3 and accepting 1.8 a step; the window packing 25 and accepting 2.0
GREEDY_ROW = row(GREEDY_SETTING, {1: 100}, 100)
LOOKUP_ROW = row(LOOKUP, {1: 40, 3: 60}, 180)
WINDOW_ROW = row(WINDOW, {25: 100}, 200)
FLAT = {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.2, 32: 10.5, 64: 11.0}
STEEP = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0, 16: 40.0, 32: 72.0, 64: 136.0}  # 2 ms per extra packed token


def test_flat_curve_picks_the_window():
    t = table(GREEDY_ROW, LOOKUP_ROW, WINDOW_ROW)
    ranked = predict(t, curve(FLAT))
    assert [p.setting.label for p in ranked] == ["W4 N4 G4", LOOKUP.label, "greedy"]
    assert ranked[0].speedup == pytest.approx(2.0 * 10.0 / (10.2 + (10.5 - 10.2) * 9 / 16))
    assert choose(t, curve(FLAT)).setting == WINDOW


def test_steep_curve_picks_prompt_lookup_or_greedy():
    t = table(GREEDY_ROW, LOOKUP_ROW, WINDOW_ROW)
    best = choose(t, curve(STEEP))
    assert best.setting == LOOKUP
    assert best.speedup == pytest.approx(1.8 * 10.0 / (0.4 * 10.0 + 0.6 * 14.0))
    assert predict(t, curve(STEEP))[-1].setting == WINDOW  # 2 tokens for 58 ms: far below greedy
    steeper = {k: 10.0 * k for k in STEEP}  # every packed token costs a whole forward
    assert choose(t, curve(steeper)).setting.greedy


def test_histogram_pricing_differs_from_mean_pricing_on_a_convex_curve():
    # mean packed size 5, but half the steps pack 9, where the curve has turned up
    convex = curve({1: 10.0, 5: 12.0, 9: 40.0})
    mixed = row(LOOKUP, {1: 50, 9: 50}, 150)
    (p,) = [x for x in predict(table(mixed), convex) if x.setting == LOOKUP]
    assert p.packed_per_step == 5.0
    assert p.step_cost_ms == pytest.approx((10.0 + 40.0) / 2)
    assert p.speedup == pytest.approx(1.5 * 10.0 / 25.0)  # 0.6: slower than greedy
    mean_priced = 1.5 * 10.0 / convex.cost(5, 100)  # 1.25: what c(mean k) would claim
    assert mean_priced > 1.0 > p.speedup


def test_greedy_is_always_a_candidate_at_one():
    ranked = predict(table(LOOKUP_ROW), curve(STEEP))
    greedy = [p for p in ranked if p.setting.greedy]
    assert len(greedy) == 1 and greedy[0].speedup == 1.0 and greedy[0].packed_per_step == 1.0
    measured = [p for p in predict(table(GREEDY_ROW, LOOKUP_ROW), curve(STEEP)) if p.setting.greedy]
    assert len(measured) == 1 and measured[0].speedup == pytest.approx(1.0)


def test_context_defaults_to_the_tables_median_and_can_be_given():
    # at context 100 the curve is flat (the window wins); at 2000 it is steep (prompt lookup wins)
    c = curve(FLAT, ctx2000=STEEP)
    t = table(GREEDY_ROW, LOOKUP_ROW, WINDOW_ROW)
    assert t.context_median == 100
    assert choose(t, c).setting == WINDOW
    assert choose(t, c, context=2000).setting == LOOKUP
    far = table(GREEDY_ROW, LOOKUP_ROW, row(WINDOW, {25: 100}, 200, context=2000))
    assert far.context_median == 100  # the median of the rows' medians (100, 100, 2000)


def test_beyond_the_curve_extrapolates_linearly_and_is_never_chosen():
    short = curve({1: 10.0, 4: 12.0, 8: 20.0})
    assert step_cost(short, 16, context=100) == pytest.approx(36.0)  # 20 + 2 ms/token x 8
    assert step_cost(short, 6, context=100) == pytest.approx(16.0)  # inside: interpolated
    big = row(Setting.of(LookaheadConfig(window=1, ngram=5, guesses=1, prompt_lookup=0)), {9: 100}, 400)
    (p,) = [x for x in predict(table(big), short) if not x.setting.greedy]
    assert p.extrapolated and p.speedup == pytest.approx(4.0 * 10.0 / 22.0)
    assert choose(table(big), short).setting.greedy  # 1.8x predicted, but only by extrapolating


def test_a_curve_where_two_tokens_cost_less_than_one_prices_lone_steps_at_two():
    """generate() pads a drafting setting's one-token steps there (pad_single), so the prediction does too;
    plain greedy, the reference, keeps its one-token steps."""
    inverted = curve({1: 12.0, 2: 10.0, 4: 11.0, 8: 13.0, 16: 16.0, 32: 22.0, 64: 34.0})
    assert inverted.pads_single() and not curve(STEEP).pads_single() and not curve(FLAT).pads_single()
    assert not StepCurve(points={100: {1: 12.0, 4: 10.0}}).pads_single()  # c(2) not measured: no claim
    p = predict_row(LOOKUP_ROW, inverted, context=100)
    assert p.step_cost_ms == pytest.approx((40 * 10.0 + 60 * inverted.cost(3, 100)) / 100)  # lone steps at c(2)
    assert p.speedup == pytest.approx(1.8 * 12.0 / p.step_cost_ms)
    g = predict_row(GREEDY_ROW, inverted, context=100)
    assert g.step_cost_ms == 12.0 and g.speedup == 1.0


def test_margin():
    slight = row(LOOKUP, {2: 100}, 102)  # 1.02 tokens/step on a flat curve
    assert predict(table(slight), curve(FLAT))[0].speedup == pytest.approx(1.02)
    assert choose(table(slight), curve(FLAT)).setting.greedy
    assert choose(table(slight), curve(FLAT), margin=1.01).setting == LOOKUP


def test_bad_arguments():
    with pytest.raises(ProfileError, match="no rows"):
        predict(table(), curve(FLAT))
    with pytest.raises(ProfileError, match="context"):
        predict(table(LOOKUP_ROW), curve(FLAT), context=-5)
    with pytest.raises(ProfileError, match="AcceptanceTable"):
        predict({"rows": []}, curve(FLAT))


def test_format_predictions_lists_every_setting():
    text = format_predictions(predict(table(GREEDY_ROW, LOOKUP_ROW, WINDOW_ROW), curve(STEEP)))
    assert text.splitlines()[0].startswith("setting")
    assert all(label in text for label in ("greedy", LOOKUP.label, "W4 N4 G4"))


def test_the_builtin_default_is_displaced_only_by_a_clear_margin():
    """On a CPU the built-in default (scaled lookup) keeps its place unless another setting is
    predicted at least 3% faster: a few percent of prediction error must not trade it for a guess."""
    from autolade.runtime.defaults import CPU_DEFAULT

    default = Setting.of(CPU_DEFAULT)
    steep = curve(STEEP)
    base = row(default, {1: 40, 3: 60}, 180)
    close = row(LOOKUP, {1: 40, 3: 60}, 183)  # 1.7% more tokens at the same cost
    clear = row(LOOKUP, {1: 40, 3: 60}, 195)  # 8% more
    assert choose(table(GREEDY_ROW, base, close), steep).setting == default
    assert choose(table(GREEDY_ROW, base, clear), steep).setting == LOOKUP
    # without the default's row the best setting wins as before
    assert choose(table(GREEDY_ROW, close), steep).setting == LOOKUP
    # a GPU curve has no tabulated incumbent (its default is adaptive)
    gpu = StepCurve(points=steep.points, device="cuda:0")
    assert choose(table(GREEDY_ROW, base, close), gpu).setting == LOOKUP


def test_a_near_tie_goes_to_the_setting_that_packs_fewer_tokens():
    """Predicted within the margin of the best, the narrower step wins (the counts rest on a few prompts and
    a wide step carries more of what the curve does not see); a clear lead keeps the wide one."""
    gentle = curve({1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 11.0, 32: 12.0, 64: 14.0})
    narrow = row(LOOKUP, {3: 100}, 200)  # 2.00 tokens/step at 10 ms
    tie = row(WINDOW, {16: 100}, 222)  # 2.22 tokens at 11 ms: 2.02x, 1% ahead
    lead = row(WINDOW, {16: 100}, 240)  # 2.18x, 9% ahead
    ranked = predict(table(GREEDY_ROW, narrow, tie), gentle)
    assert ranked[0].setting == WINDOW and ranked[0].speedup == pytest.approx(2.018, abs=1e-3)
    assert choose(table(GREEDY_ROW, narrow, tie), gentle).setting == LOOKUP
    assert choose(table(GREEDY_ROW, narrow, lead), gentle).setting == WINDOW
    assert choose(table(GREEDY_ROW, narrow, tie), gentle, margin=1.0).setting == WINDOW


RECYCLE = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)


def priced_rows() -> tuple[AcceptanceRow, ...]:
    """One recycling config counted unpriced (packs 17, 3 tokens/step) and cut at two prices (the dearer, the less packed)."""
    return (row(Setting.of(RECYCLE), {17: 100}, 300), row(Setting.of(RECYCLE, token_cost=0.01), {9: 100}, 200),
            row(Setting.of(RECYCLE, token_cost=0.05), {3: 100}, 150))


def test_a_recycling_setting_is_read_at_the_curves_price_between_the_counted_ones():
    line = {1: 10.0, 64: 10.0 + 63 * 0.3}  # c(k) = 10 + 0.3 (k - 1): a packed token costs 0.03 of a step
    c = curve(line)
    assert c.token_cost() == pytest.approx(0.03)
    full, cheap, dear = priced_rows()
    (p,) = [x for x in predict(table(GREEDY_ROW, *priced_rows()), c) if x.setting.config == RECYCLE]
    assert p.setting == Setting.of(RECYCLE) and p.price == pytest.approx(0.03)  # what runs: the unpriced label
    # halfway from 0.01 to 0.05: the mean of the two rows' predictions, not the unpriced row's optimism
    a = 2.0 * 10.0 / (10.0 + 0.3 * 8)
    b = 1.5 * 10.0 / (10.0 + 0.3 * 2)
    assert p.speedup == pytest.approx((a + b) / 2)
    assert p.tokens_per_step == pytest.approx(1.75) and p.packed_per_step == pytest.approx(6.0)
    unpriced = 3.0 * 10.0 / (10.0 + 0.3 * 16)
    assert unpriced > p.speedup  # the full-budget count would have over-predicted it
    assert "read at 0.030" in format_predictions([p])


def test_prices_near_zero_read_the_unpriced_row_and_past_the_last_the_dearest():
    flat = curve(FLAT)  # ~0.0016 per token: between the unpriced row (price 0) and 0.01, nearer the unpriced one
    (p,) = [x for x in predict(table(*priced_rows()), flat) if x.setting.config == RECYCLE]
    assert p.tokens_per_step == pytest.approx(3.0 - (3.0 - 2.0) * flat.token_cost() / 0.01) and p.tokens_per_step > 2.5
    steep = curve({1: 10.0, 64: 10.0 + 63 * 2.0})  # 0.2 per token: past the dearest price counted
    (q,) = [x for x in predict(table(*priced_rows()), steep) if x.setting.config == RECYCLE]
    assert q.tokens_per_step == pytest.approx(1.5) and q.packed_per_step == pytest.approx(3.0)


def test_an_unpriced_recycling_row_alone_is_predicted_as_counted_and_flagged():
    (p,) = [x for x in predict(table(priced_rows()[0]), curve(STEEP)) if x.setting.config == RECYCLE]
    assert p.price is None and p.tokens_per_step == pytest.approx(3.0)
    assert "counted unpriced" in format_predictions([p])


def test_choose_and_predict_setting_see_the_priced_prediction():
    from autolade.runtime.predict import predict_setting

    c = curve({1: 10.0, 64: 10.0 + 63 * 0.3})
    t = table(GREEDY_ROW, LOOKUP_ROW, *priced_rows())
    p = predict_setting(t, Setting.of(RECYCLE), c)
    assert p.price == pytest.approx(0.03) and p.setting == Setting.of(RECYCLE)
    # unpriced, recycling (3 tokens for 17 packed) would beat lookup; priced, lookup wins
    lookup = next(x for x in predict(t, c) if x.setting == LOOKUP)
    assert 3.0 * 10.0 / (10.0 + 0.3 * 16) > lookup.speedup > p.speedup
    assert choose(t, c).setting == LOOKUP
    with pytest.raises(ProfileError, match="no row"):
        predict_setting(t, WINDOW, c)
