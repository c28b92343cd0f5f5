"""The step curve as data: cost interpolation, spare compute, validation, token cost."""

from __future__ import annotations

import math

import pytest
from curves import BF16_CPU, FLAT_GPU, FP32_CPU

from autolade.errors import ProfileError
from autolade.records.curve import StepCurve, packed_tokens

# --- curve arithmetic --------------------------------------------------------------------


def test_cost_interpolates_clamps_below_and_extrapolates_past_the_largest_k():
    curve = StepCurve(points={100: {1: 10.0, 4: 16.0, 8: 40.0}, 300: {1: 20.0, 4: 26.0, 8: 60.0}})
    assert curve.cost(1, 100) == 10.0
    assert curve.cost(2, 100) == 12.0  # linear between k=1 and k=4
    assert curve.cost(100, 100) == 40.0 + 6.0 * 92  # the last segment (24 ms over 4 tokens) goes on
    assert StepCurve(points={100: {1: 10.0, 4: 12.0, 8: 11.0}}).cost(64, 100) == 11.0  # a dipping top: flat, never down
    assert StepCurve(points={100: {1: 10.0}}).cost(8, 100) == 10.0  # one point: nothing to go on
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


# --- the compiled step's curve -------------------------------------------------------------

COMPILED = StepCurve(points={300: {1: 20.0, 8: 30.0, 16: 40.0}}, compiled=True)


def test_compiled_flag_round_trips_and_is_validated():
    assert StepCurve.from_dict(COMPILED.to_dict()).compiled is True
    assert StepCurve.from_dict(FP32_CPU.to_dict()).compiled is False
    with pytest.raises(ProfileError, match="'compiled' must be bool"):
        StepCurve.from_dict({**COMPILED.to_dict(), "compiled": "yes"})


def test_warmup_round_trips_is_validated_and_read_from_an_older_curves_note():
    from dataclasses import replace

    from autolade.records.curve import breakeven_tokens

    timed = replace(COMPILED, warmup_s=54.1)
    assert StepCurve.from_dict(timed.to_dict()).warmup_s == 54.1
    assert StepCurve.from_dict(COMPILED.to_dict()).warmup_s is None
    for bad in (-1, "54 s", True, float("nan")):
        with pytest.raises(ProfileError, match="'warmup_s' must be seconds"):
            StepCurve.from_dict({**timed.to_dict(), "warmup_s": bad})
    # a curve stored before the field: its note, as measure_compiled_curve writes it, gives the warm-up
    older = {**COMPILED.to_dict(), "notes": ["compiled (default): warm-up 47.2 s for 1 graphs (buckets 1, 2); 50.7 s in all"]}
    del older["warmup_s"]
    assert StepCurve.from_dict(older).warmup_s == 47.2
    assert StepCurve.from_dict({**older, "compiled": False}).warmup_s is None  # an eager curve has none
    # break-even: warm-up / the most one step saves (at most one step per token)
    eager = StepCurve(points={128: {1: 32.9, 2: 34.7, 4: 52.0, 8: 61.5, 16: 70.8}})
    compiled = StepCurve(points={128: {1: 35.3, 2: 34.3, 4: 37.3, 8: 42.7, 16: 53.2}}, compiled=True, warmup_s=54.1)
    assert breakeven_tokens(eager, compiled) == pytest.approx(54100 / (61.5 - 42.7))  # k=8 saves the most
    assert breakeven_tokens(eager, replace(compiled, warmup_s=None)) is None
    dearer = StepCurve(points={128: {k: 2 * ms for k, ms in eager.points[128].items()}}, compiled=True, warmup_s=5.0)
    assert breakeven_tokens(eager, dearer) is None  # never won back


def test_as_run_prices_each_width_at_its_bucket():
    from autolade.records.curve import as_run

    run = as_run(COMPILED, ks=(1, 2, 4, 8, 12, 16, 32))
    assert run.points[300] == {1: 20.0, 2: 30.0, 4: 30.0, 8: 30.0, 12: 40.0, 16: 40.0}  # no point past the widest bucket
    assert run.cost(5) == 30.0  # a step function, not an interpolation between buckets
    assert run.compiled is True


def test_compile_pays_compares_each_width_at_its_bucket():
    from autolade.records.curve import compile_pays

    eager = StepCurve(points={300: {1: 50.0, 2: 52.0, 4: 55.0, 8: 60.0, 16: 70.0}})
    assert compile_pays(eager, COMPILED)  # 20/50, 30/52, 30/55, 30/60, 40/70: well under 0.95
    slow = StepCurve(points={300: {1: 60.0, 8: 80.0, 16: 90.0}}, compiled=True)
    assert not compile_pays(eager, slow)
    narrow = StepCurve(points={300: {1: 1.0, 8: 1.0}}, compiled=True)
    assert not compile_pays(eager, narrow)  # it does not reach a 16-token step: not priced as paying
    assert compile_pays(eager, narrow, ks=(1, 2, 4, 8))


# a compiled curve whose one-token bucket costs more than the 8-token one (Zen 4, bf16, inductor freezing)
DIPPING = StepCurve(points={300: {1: 43.0, 8: 35.0, 16: 45.0, 32: 60.0}, 600: {1: 45.0, 8: 37.0, 16: 47.0, 32: 64.0}},
                    compiled=True)


def test_a_bucket_that_a_wider_one_undercuts_is_not_run():
    from autolade.records.curve import bucket_cost, useful_buckets

    assert useful_buckets(DIPPING) == (8, 16, 32)  # a lone token runs padded to 8
    assert useful_buckets(COMPILED) == (1, 8, 16)
    tie = StepCurve(points={300: {1: 30.0, 8: 30.0, 16: 40.0}}, compiled=True)
    assert useful_buckets(tie) == (8, 16)  # a wider bucket at the same cost holds more drafts for it
    assert bucket_cost(DIPPING, 1) == bucket_cost(DIPPING, 8) == 36.0  # averaged over the two contexts
    assert bucket_cost(DIPPING, 9) == 46.0
    assert bucket_cost(DIPPING, 33) is None


def test_as_run_prices_a_width_at_its_cheapest_bucket_and_pads_lone_steps_for_free():
    from autolade.records.curve import as_run

    run = as_run(DIPPING, ks=(1, 2, 4, 8, 16, 32))
    assert run.points[300] == {1: 35.0, 2: 35.0, 4: 35.0, 8: 35.0, 16: 45.0, 32: 60.0}
    assert run.pads_single()  # c(2) == c(1) on a compiled run: the filler rides in the lone token's bucket
    assert not as_run(COMPILED, ks=(1, 2, 8, 16)).pads_single()  # there 2 tokens cost the 8-bucket, 1 token less
    eager_flat = StepCurve(points={300: {1: 30.0, 2: 30.0, 8: 40.0}})
    assert not eager_flat.pads_single()  # eager: a filler at the same cost is no gain to pay the mask for


def test_compile_pays_prices_a_lone_token_at_the_bucket_it_runs_in():
    from autolade.records.curve import compile_pays

    eager = StepCurve(points={300: {1: 38.0, 2: 37.0, 4: 40.0, 8: 47.0, 16: 54.0}, 600: {1: 40.0, 2: 39.0, 4: 42.0, 8: 49.0, 16: 56.0}})
    # by its own bucket the lone token is 44/39 = 1.13; run at 8 it is 36/39 = 0.92: mean ratio 0.83 with 16 at 0.85
    assert compile_pays(eager, DIPPING)
