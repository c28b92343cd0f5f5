import pytest

from autolade.config import LookaheadConfig
from autolade.errors import ConfigError
from autolade.policies import (
    AdaptiveParams,
    AdaptivePolicy,
    CostModel,
    StaticPolicy,
    StepOutcome,
    make_policy,
)


def outcome(plan, *, packed, accepted=0, source="none", lookup=0, pool=0, window=0, ms=10.0):
    return StepOutcome(plan, packed, lookup, pool, window, accepted, source, ms / 1e3, ms / 1e3)


def test_static_plan_follows_config():
    plan = StaticPolicy(LookaheadConfig(window=5, ngram=3, guesses=2, prompt_lookup=7)).plan()
    assert (plan.window, plan.guesses, plan.draft_len, plan.drafts) == (5, 2, 7, 2)
    assert StaticPolicy(LookaheadConfig(window=0, prompt_lookup=0)).plan().window == 0


def test_cost_model_from_curve_and_online():
    costs = CostModel({1: 10.0, 8: 12.0, 32: 30.0})
    assert costs.cost(1) == 1.0
    assert costs.cost(8) == pytest.approx(1.2)
    assert costs.cost(16) == pytest.approx((12 + (30 - 12) * 8 / 24) / 10, rel=0.05)
    costs.observe(8, 0.040)  # this machine: a k=8 step costs 40 ms
    assert costs.cost(8) == pytest.approx(4.0)
    assert CostModel().cost(11) == pytest.approx(1.2)  # the prior slope


def test_adaptive_turns_window_off_when_it_does_not_pay_and_probes_back():
    cfg = LookaheadConfig(window=4, ngram=4, guesses=4)
    pol = AdaptivePolicy(cfg, AdaptiveParams(probe_every=5, probe_steps=2), curve_ms={1: 10, 64: 40})
    for _ in range(40):  # window steps that never accept anything, at 2x the cost
        plan = pol.plan()
        packed = 1 + 6 * plan.window if plan.window else 1
        pol.update(outcome(plan, packed=packed, window=3 * plan.window, ms=20.0 if plan.window else 10.0))
    windows = [pol.plan().window]
    for _ in range(12):
        plan = pol.plan()
        windows.append(plan.window)
        pol.update(outcome(plan, packed=1 + 6 * plan.window if plan.window else 1, ms=10.0))
    assert 0 in windows  # switched off
    assert any(w > 0 for w in windows)  # and probed again


def test_adaptive_grows_window_when_pool_pays():
    cfg = LookaheadConfig(window=2, ngram=3, guesses=8)
    pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=2, max_window=6), curve_ms={1: 10, 128: 11})
    for _ in range(30):
        plan = pol.plan()
        pol.update(outcome(plan, packed=1 + 4 * plan.window, accepted=2, source="pool", pool=4, window=2 * plan.window))
    assert pol.plan().window == 6


def test_make_policy_presets_and_errors(tmp_path):
    cfg = LookaheadConfig()
    assert make_policy(None, cfg).name == "static"
    assert make_policy("adaptive-cpu", cfg).params.max_window == 4
    assert make_policy({"name": "adaptive", "max_window": 2}, cfg).params.max_window == 2
    assert make_policy("lookup", cfg).plan().window == 0
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("nope", cfg)
    with pytest.raises(ConfigError, match="unknown adaptive policy parameter"):
        make_policy({"name": "adaptive", "wndow": 3}, cfg)
    with pytest.raises(ConfigError, match="max_window"):
        make_policy({"name": "adaptive", "max_window": 10**6}, cfg)
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        make_policy(str(bad), cfg)
