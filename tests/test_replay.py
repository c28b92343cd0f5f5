"""Offline replay of drafting rules (autolade/replay.py), on hand-made traces and a hand-made curve."""

import random

import pytest

from autolade.engine.memory import AnswerMemory, MemoryConfig
from autolade.errors import ConfigError
from autolade.records.curve import StepCurve
from autolade.tuning.replay import CostAwareLookup, HFPromptLookup, Lookup, Trace, WithMemory, replay

# 1 token 10 ms, 4 tokens 11 ms, 8 tokens 14 ms, 16 tokens 20 ms, 32 tokens 32 ms (a CPU-like curve)
CURVE = StepCurve(points={256: {1: 10.0, 4: 11.0, 8: 14.0, 16: 20.0, 32: 32.0}})
LINE = list(range(100, 120))


def copy_trace() -> Trace:
    """The output copies a 20-token line of the prompt twice: lookup's best case."""
    return Trace(prompt=tuple([1, 2] + LINE + [3]), output=tuple(LINE + [4] + LINE))


def noise_trace(seed: int = 0) -> Trace:
    rng = random.Random(seed)
    return Trace(prompt=tuple(rng.randrange(1000, 1030) for _ in range(50)),
                 output=tuple(rng.randrange(1000, 1030) for _ in range(60)))


def test_no_drafts_is_greedy_exactly():
    res = replay(lambda: Lookup(length=0), [noise_trace()], CURVE)
    assert res.steps == res.tokens == 59 and res.packed == 59
    assert res.tokens_per_step == 1.0 and res.speedup == pytest.approx(1.0)
    assert res.time_ms == pytest.approx(59 * 10.0)


def test_copy_trace_steps_and_price_by_hand():
    # After the first token (100, from the prefill) the suffix (100) matches the prompt's line:
    # a one-token draft of 8 accepts 8 + bonus = 9 tokens per step while the line lasts.
    trace = copy_trace()
    res = replay(lambda: Lookup(length=8, drafts=1), [trace], CURVE)
    assert res.tokens == len(trace.output) - 1 == 40
    assert res.tokens_per_step > 4.0  # almost every step accepts the whole draft
    # every step packs at most 1 + 8 tokens, so it costs at most c(9)
    assert res.time_ms <= res.steps * CURVE.cost(9) + 1e-9
    assert res.speedup == pytest.approx(res.greedy_ms / res.time_ms)
    assert res.speedup > 2.0


def test_oracle_sizing_bounds_the_rule_it_sizes():
    traces = [copy_trace(), noise_trace(1), noise_trace(2)]
    for make in (lambda: Lookup(length=16, drafts=3, scaled=True), lambda: Lookup(length=10, drafts=1)):
        plain, oracle = replay(make, traces, CURVE), replay(make, traces, CURVE, oracle=True)
        # the same accepted tokens every step, never more packed: never slower
        assert oracle.steps == plain.steps and oracle.tokens == plain.tokens
        assert oracle.packed <= plain.packed and oracle.speedup >= plain.speedup
        assert oracle.name.endswith("oracle-sized")
        # it packs exactly the root plus the accepted tokens: one packed token per new token
        assert oracle.packed == oracle.tokens
    # on noise nearly every draft is rejected: the oracle runs (almost) plain greedy steps
    noise = replay(lambda: Lookup(length=16, drafts=3), [noise_trace(3)], CURVE, oracle=True)
    assert noise.speedup >= 1.0 and noise.packed_per_step < 1.2


def test_hf_prompt_lookup_takes_the_earliest_occurrence():
    # "7" occurs twice before the end: HF drafts after the first one, autolade after the latest
    trace = Trace(prompt=(7, 1, 1, 1, 7, 2, 2, 2, 9), output=(7, 1, 1, 1, 5))
    hf = replay(lambda: HFPromptLookup(length=3, max_ngram=1), [trace], CURVE)
    ours = replay(lambda: Lookup(length=3, drafts=1, max_ngram=1), [trace], CURVE)
    assert hf.steps == 1 and hf.tokens_per_step == 4.0  # 1 1 1 accepted + bonus
    assert ours.steps > 1  # 2 2 2 rejected


def test_cost_aware_rule_learns_to_stop_drafting_on_noise_and_to_draft_on_copies():
    noise = replay(lambda: CostAwareLookup(CURVE), [noise_trace(4)], CURVE)
    fixed = replay(lambda: Lookup(length=16, drafts=3), [noise_trace(4)], CURVE)
    assert noise.packed_per_step < fixed.packed_per_step  # rejected drafts shrink its lengths
    copies = replay(lambda: CostAwareLookup(CURVE), [copy_trace()], CURVE)
    assert copies.tokens_per_step > 3.0 and copies.speedup > 2.0


def test_replay_needs_traces():
    with pytest.raises(ConfigError, match="at least one trace"):
        replay(lambda: Lookup(length=4), [], CURVE)


def test_bound_report_tables_per_set_with_ratios_to_scaled_lookup():
    from autolade.tuning.replay import bound_report

    text = bound_report({"copy": [copy_trace()], "noise": [noise_trace(5), noise_trace(6)]}, CURVE)
    assert text.startswith("step curve (float32, ms): c(1)=10.0, c(4)=11.0")
    assert "**copy** (1 prompts, 40 tokens)" in text and "**noise** (2 prompts, 118 tokens)" in text
    rows = [line for line in text.splitlines() if line.startswith("| lookup 16x3s (n-gram <= 4) |")]
    assert len(rows) == 2 and all(row.endswith("| 1.000 |") for row in rows)  # the reference row
    assert text.count("oracle-sized") == 4


def test_memory_replays_as_the_engine_drafts_it_cut_to_what_it_earned():
    # the output repeats an earlier answer the prompt never showed: only the memory can draft it
    answer = tuple(range(500, 540))
    trace = Trace(prompt=(1, 2, 3), output=(7, 8, 9, *answer))
    mem = AnswerMemory(MemoryConfig())
    for _ in range(3):
        mem.add((7, 8, 9, *answer))
    plain = replay(lambda: Lookup(length=16, drafts=3, scaled=True), [trace], CURVE)
    with_mem = replay(lambda: WithMemory(Lookup(length=16, drafts=3, scaled=True), mem), [trace] * 4, CURVE)
    assert plain.tokens_per_step == 1.0
    assert with_mem.tokens_per_step > 3.0
    # the source scored every draft against the output: the rank-0 drafts were right all along, so
    # the learned chance at their positions beats the starting guess and they are packed whole
    yields = mem.yields
    assert yields.passed[6][0][1] > 0 and yields.passed[6][0][1] == yields.reached[6][0][1]
    assert yields.length(6, 0, mem.config.min_alive) == mem.config.max_len
