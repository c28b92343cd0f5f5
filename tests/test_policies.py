import pytest

from autolade.config import LookaheadConfig
from autolade.errors import ConfigError
from autolade.runtime.policies import (
    AdaptiveParams,
    AdaptivePolicy,
    DraftLength,
    StaticPolicy,
    StepOutcome,
    StepPlan,
    make_policy,
)


def outcome(plan, *, packed, accepted=0, source="none", lookup=0, pool=0, window=0, ms=10.0, longest=0):
    return StepOutcome(plan=plan, packed=packed, nodes={"lookup": lookup, "pool": pool}, window_tokens=window,
                       accepted=accepted, accepted_from=source, step_s=ms / 1e3, forward_s=ms / 1e3, longest_draft=longest)


def test_draft_length_learns_only_from_drafts_that_hit_the_cap():
    length = DraftLength(start=8, low=2, high=12)
    plan = StepPlan(window=0, guesses=0, draft_len=8, drafts=1)
    length.update(outcome(plan, packed=9, accepted=8, source="lookup", lookup=8, longest=8))  # all accepted: +2
    assert length.value == 10
    plan = StepPlan(window=0, guesses=0, draft_len=10, drafts=1)
    length.update(outcome(plan, packed=3, accepted=0, lookup=2, longest=2))  # a short (scaled) draft: no signal
    assert length.value == 10
    length.update(outcome(plan, packed=11, accepted=3, source="lookup", lookup=10, longest=10))  # cut short: -1
    assert length.value == 9
    length.update(outcome(plan, packed=1))  # nothing drafted
    assert length.value == 9
    for _ in range(20):
        length.update(outcome(plan, packed=11, accepted=10, source="lookup", lookup=10, longest=10))
    assert length.value == 12  # capped at high


def test_static_plan_follows_config():
    plan = StaticPolicy(LookaheadConfig(window=5, ngram=3, guesses=2, prompt_lookup=7)).plan()
    assert (plan.window, plan.guesses, plan.draft_len, plan.drafts) == (5, 2, 7, 2)
    assert StaticPolicy(LookaheadConfig(window=0, prompt_lookup=0)).plan().window == 0


def _drive(pol, steps, *, tokens_at, ms_at):
    widths = []
    for _ in range(steps):
        plan = pol.plan()
        widths.append(plan.window)
        w = plan.window
        pol.update(outcome(plan, packed=1 + 6 * w, accepted=tokens_at(w) - 1, source="pool" if w else "none",
                           window=3 * w, ms=ms_at(w)))
    return widths


def test_adaptive_turns_window_off_when_it_does_not_pay_and_probes_back():
    cfg = LookaheadConfig(window=4, ngram=4, guesses=4)
    pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=2, probe_every=5, probe_steps=3))
    # the window never accepts anything and every width costs more: off wins
    widths = _drive(pol, 120, tokens_at=lambda w: 1, ms_at=lambda w: 10.0 + 5 * w)
    assert pol.current == 0
    assert widths[-40:].count(0) >= 24  # off except for the probes (5 off : 3 probing)
    assert any(w > 0 for w in widths[-40:])  # but still probing


def test_adaptive_grows_window_when_wider_pays():
    cfg = LookaheadConfig(window=2, ngram=3, guesses=8)
    pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=2, max_window=6, probe_every=4, probe_steps=3))
    _drive(pol, 200, tokens_at=lambda w: 1 + w, ms_at=lambda w: 10.0 + w)  # wider: more tokens, nearly free
    assert pol.current == 6
    assert pol.throughput(6) > pol.throughput(2)


def test_adaptive_keeps_a_width_that_pays_over_off():
    cfg = LookaheadConfig(window=3, ngram=3, guesses=3)
    pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=3, max_window=3, probe_every=4, probe_steps=3))
    _drive(pol, 100, tokens_at=lambda w: 2 if w else 1, ms_at=lambda w: 13.0 if w else 10.0)
    assert pol.current == 3


def test_make_policy_presets_and_errors(tmp_path):
    cfg = LookaheadConfig()
    assert make_policy(None, cfg).name == "static"
    assert make_policy("adaptive-cpu", cfg).params.start_window == 0
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


def test_adaptive_can_start_with_the_window_off_and_grow_when_it_pays():
    cfg = LookaheadConfig(window=2, ngram=3, guesses=2)
    pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=0, max_window=2, probe_every=6, probe_steps=3))
    assert pol.plan().window == 0
    widths = _drive(pol, 120, tokens_at=lambda w: 1 + w, ms_at=lambda w: 10.0 + w)  # the window pays
    assert widths[0] == 0 and pol.current == 2


def test_adaptive_probe_backoff_probes_less_while_probes_lose_and_resets_on_a_switch():
    cfg = LookaheadConfig(window=2, ngram=3, guesses=2)
    lose = dict(tokens_at=lambda w: 1, ms_at=lambda w: 10.0 + 5 * w)  # the window never pays
    fixed = _drive(AdaptivePolicy(cfg, AdaptiveParams(start_window=0, max_window=2, probe_every=4, probe_steps=2)),
                   200, **lose)
    backoff_pol = AdaptivePolicy(cfg, AdaptiveParams(start_window=0, max_window=2, probe_every=4, probe_steps=2,
                                                     probe_backoff=2.0))
    backoff = _drive(backoff_pol, 200, **lose)
    probing = lambda widths: sum(w > 0 for w in widths)
    assert probing(fixed) >= 60  # 2 of every 6 steps
    # waits of 4, 8, 16, then 32 (8x probe_every) between 2-step probes: 7 probes in 200 steps
    assert probing(backoff) == 14
    assert backoff_pol.wait == 32.0 and backoff_pol.current == 0
    # when the text changes and a probe wins, the policy switches and the wait starts over
    for _ in range(40):
        _drive(backoff_pol, 1, tokens_at=lambda w: 1 + 2 * w, ms_at=lambda w: 10.0 + w)
        if backoff_pol.current:
            break
    assert backoff_pol.current == 1 and backoff_pol.wait == 4.0


def test_adaptive_probe_backoff_is_validated():
    with pytest.raises(ConfigError, match=r"probe_backoff must be a number in \[1.0, 4.0\]"):
        AdaptiveParams(probe_backoff=0.5)
    assert AdaptiveParams(probe_backoff=1.0).probe_backoff == 1.0


def _cost_aware(cost, **cfg):
    from autolade.runtime.policies import CostAwarePolicy

    config = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=1, prompt_lookup_ngram=4, **cfg)
    return CostAwarePolicy(config, cost=cost)


def _plain(pol, *, ms, m=0, shadow=(), emitted=(7,)):
    pol.update(StepOutcome(plan=pol.plan(), packed=1, window_tokens=0, accepted=0,
                           accepted_from="none", step_s=ms / 1e3, forward_s=ms / 1e3, match_len=m,
                           shadow=shadow, emitted=emitted))


def _lookup_step(pol, *, m, accepted, ms=None):
    """One step after an m-token match whose draft would get ``accepted`` tokens in; ``ms`` None: it
    takes what the policy's curve says it costs. Where the policy drafts nothing it gets the draft
    as the engine's shadow, then the plain steps that show what it would have accepted."""
    plan = pol.plan()
    length = plan.draft_lens[m - 1]
    if ms is None:
        ms = pol.cost(1 + length)
    if not length:
        draft = tuple(range(100, 100 + pol.max_len))
        out = draft[:accepted] + (-1,)  # the output follows the draft for ``accepted`` tokens
        _plain(pol, ms=ms, m=m, shadow=(draft,), emitted=out[:1])
        for tok in out[1 : pol.max_len]:
            _plain(pol, ms=pol.cost(1), emitted=(tok,))
        return length
    acc = min(accepted, length)
    pol.update(StepOutcome(plan=plan, packed=1 + length, nodes={"lookup": length}, window_tokens=0,
                           accepted=acc, accepted_from="lookup" if acc else "none", step_s=ms / 1e3,
                           forward_s=ms / 1e3, longest_draft=length, match_len=m))
    return length


def test_cost_aware_sizes_drafts_by_the_curve_and_by_what_gets_accepted():
    flat = lambda k: 10.0
    pol = _cost_aware(flat)
    assert pol.plan().draft_lens == (16, 16, 16, 16) and pol.plan().window == 0
    # a bumpy CPU curve: 2-3 packed tokens cost 2x one, 8 only 1.5x; no draft of 1-2 tokens is worth it
    from autolade.records.curve import StepCurve

    bumpy = StepCurve(points={256: {1: 40.0, 2: 80.0, 3: 85.0, 4: 70.0, 8: 60.0, 16: 80.0, 32: 110.0}})
    pol = _cost_aware(bumpy.cost)
    assert all(length == 0 or length >= 4 for length in pol.plan().draft_lens)  # never packs 2-4 tokens
    # drafts after one-token matches never accepted: it stops drafting after them (plain greedy steps)
    for _ in range(30):
        _lookup_step(pol, m=1, accepted=0)
    assert pol.plan().draft_lens[0] == 0
    # four-token matches always fully accepted: it keeps drafting long after them
    for _ in range(30):
        _lookup_step(pol, m=4, accepted=16)
    assert pol.plan().draft_lens[3] == 16
    assert pol.to_dict() == {"name": "cost-aware"}


def test_cost_aware_pools_what_every_match_length_measured():
    """Drafts that always fail after one-token matches lower the prior of the drafts after longer
    matches too: on a machine where a packed step costs ~1.45x one, it stops drafting after 2-token
    matches it has never tried, while a fresh policy still would; once 2-token matches show they
    pay, their own record outweighs the pooled prior."""
    costly = lambda k: 100.0 if k < 2 else 140.0 + k
    fresh = _cost_aware(costly)
    assert fresh.plan().draft_lens[1] > 0  # starting guess: a 2-token match gives a 4-token run
    pol = _cost_aware(costly)

    def forced(m, accepted):  # a 4-token draft after an m-token match, whatever the policy planned
        pol.update(StepOutcome(plan=pol.plan(), packed=5, nodes={"lookup": 4}, window_tokens=0,
                               accepted=accepted, accepted_from="lookup" if accepted else "none",
                               step_s=costly(5) / 1e3, forward_s=costly(5) / 1e3, longest_draft=4, match_len=m))

    for _ in range(10):
        forced(1, 0)
    assert pol.plan().draft_lens[0] == 0 and pol.plan().draft_lens[1] == 0
    assert pol.reached[2][1] == 0  # nothing measured after 2-token matches: the pooled prior did it
    for _ in range(6):  # 2-token matches turn out to be fully accepted
        forced(2, 4)
    assert pol.plan().draft_lens[1] >= 4 and pol.plan().draft_lens[0] == 0


def test_cost_aware_learns_from_the_drafts_it_did_not_pack():
    """Where it drafts nothing after a match, the engine still hands it the draft (a shadow) and the
    tokens each step emits: it scores the shadow as a packed draft would have been scored, for free,
    and starts drafting once shadows show drafting pays; shadows that fail keep it at plain steps."""
    costly = lambda k: 100.0 if k < 2 else 175.0 + k  # a packed step costs ~1.8x a plain one
    pol = _cost_aware(costly)
    assert pol.plan().draft_lens == (0, 0, 0, 0) and pol.plan().shadow_len == 16
    # two shadows after a 3-token match (the second draft of two matches), watched over three steps
    _plain(pol, ms=100.0, m=3, shadow=((5, 6, 7), (1, 2, 3, 4)), emitted=(1,))
    _plain(pol, ms=100.0, m=3, shadow=((2, 9, 5),), emitted=(2,))
    _plain(pol, ms=100.0, emitted=(9,))
    _plain(pol, ms=100.0, emitted=(4,))
    assert pol.reached[3][1:5] == [2, 2, 2, 0] and pol.passed[3][1:5] == [2, 2, 0, 0]
    assert pol.watching == []  # the first shadow failed at 3, the second at 3 too
    for _ in range(6):  # 4-token matches whose drafts would be fully accepted
        _lookup_step(pol, m=4, accepted=16)
    assert pol.plan().draft_lens[3] == 16
    for _ in range(12):  # one-token matches whose drafts would fail at once
        _lookup_step(pol, m=1, accepted=0)
    assert pol.plan().draft_lens[0] == 0 and pol.reached[1][1] == 12 and pol.passed[1][1] == 0


def test_cost_aware_needs_a_curve_and_takes_no_parameters():
    from autolade.runtime.policies import needs_cost

    cfg = LookaheadConfig(window=0, prompt_lookup=16)
    with pytest.raises(ConfigError, match="autolade profile --model"):
        make_policy("cost-aware", cfg)
    with pytest.raises(ConfigError, match="takes no parameters"):
        make_policy({"name": "cost-aware", "max_draft": 4}, cfg, cost=lambda k: 1.0)
    assert make_policy("cost-aware", cfg, cost=lambda k: 1.0).name == "cost-aware"
    assert needs_cost("cost-aware") and needs_cost({"name": "cost-aware"})
    assert not needs_cost("adaptive-cpu") and not needs_cost(None) and not needs_cost({"name": "lookup"})
    # no prompt lookup configured: nothing to size, plain greedy steps
    assert make_policy("cost-aware", LookaheadConfig(window=0, prompt_lookup=0), cost=lambda k: 1.0).plan().draft_len == 0


def test_cost_aware_corrects_the_curve_by_what_the_steps_measure():
    """A curve that says packed steps are nearly free, on a machine where they cost 2x one: after
    the steps it measures, it stops drafting after weak matches (plain greedy steps) and keeps the
    long drafts that still pay; where the curve is right nothing changes."""
    curve = lambda k: 100.0 + 2.0 * k  # c(9) = 1.16x c(1)
    real = lambda k: 100.0 if k < 2 else 200.0 + 2.0 * k  # every packed step costs 2x one
    trusting = _cost_aware(curve)
    for i in range(40):
        _lookup_step(trusting, m=1, accepted=int(i % 4 == 0))  # measured = curve: no correction
    assert trusting.plan().draft_lens[0] > 0 and set(trusting.measured.values()) == {1.0}
    pol = _cost_aware(curve)
    for i in range(40):  # weak one-token matches: a quarter of drafts get one token in
        _lookup_step(pol, m=1, accepted=int(i % 4 == 0), ms=real(1 + pol.plan().draft_lens[0]))
        _lookup_step(pol, m=4, accepted=16, ms=real(1 + pol.plan().draft_lens[3]))
        plain = pol.plan()  # a step with no match at all: a plain greedy step
        pol.update(StepOutcome(plan=plain, packed=1, window_tokens=0, accepted=0,
                               accepted_from="none", step_s=0.1, forward_s=0.1, match_len=0))
    assert pol.step_cost(9) == pytest.approx(real(9), rel=0.1) and pol.step_cost(1) == pytest.approx(100.0, rel=0.1)
    assert pol.plan().draft_lens[0] == 0  # 1 + 0.25 tokens for 2x the time: greedy steps instead
    assert pol.plan().draft_lens[3] == 16  # 17 tokens for ~2.3x the time: still drafts
