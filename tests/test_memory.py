"""autolade.engine.memory: the answer memory's index, drafts, evidence sizing and eviction."""

from __future__ import annotations

import pytest

from autolade.engine.memory import AnswerMemory, MemoryConfig, MemorySource
from autolade.engine.steps import StepPlan

PLAN = StepPlan(window=0, guesses=0, draft_len=16, drafts=3)


def test_longest_suffix_match_and_its_continuation():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1))
    mem.add([1, 2, 3, 4, 5, 6])
    mem.add([9, 3, 4, 7, 8])
    # context ends "2 3 4": the 3-gram occurs only in the first answer, so its continuation wins
    drafts, m = mem.drafts([0, 2, 3, 4])
    assert m == 3
    assert drafts == [(5, 6)]
    # context ends "9 3 4"... no: "x 3 4" matches the 2-gram in both answers, most recent first
    drafts, m = mem.drafts([0, 3, 4])
    assert m == 2
    assert [d[0] for d in drafts] == [7, 5]


def test_no_continuation_crosses_an_answer_boundary():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1))
    mem.add([1, 2, 3])
    mem.add([4, 5, 6])
    drafts, m = mem.drafts([1, 2, 3])  # "2 3" ends the first answer: nothing followed it
    assert drafts == [] or all(4 not in d for d in drafts)
    assert mem.drafts([2, 3, 4])[0] == []  # "3 4" spans the boundary: never indexed


def test_short_matches_draft_nothing():
    mem = AnswerMemory(MemoryConfig(min_ngram=2))
    mem.add([1, 2, 3])
    assert mem.drafts([7, 1]) == ([], 0)


def test_draft_length_follows_the_evidence():
    cfg = MemoryConfig(min_ngram=2, max_ngram=2, min_support=2, max_len=8)
    once = AnswerMemory(cfg)
    once.add([1, 2, 10, 11, 12, 13, 14, 15])
    # one occurrence after a 2-token match backs single_len(2) = 2 tokens
    assert once.drafts([1, 2])[0] == [(10, 11)]
    twice = AnswerMemory(cfg)
    twice.add([1, 2, 10, 11, 12, 13, 14, 15])
    twice.add([1, 2, 10, 11, 12, 13, 99])
    # two occurrences agree on 10..13, then disagree: the draft stops where support drops below 2
    assert twice.drafts([1, 2])[0] == [(10, 11, 12, 13)]


def test_the_most_frequent_continuation_comes_first():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1, drafts=2))
    mem.add([5, 6, 1])
    mem.add([5, 6, 2])
    mem.add([5, 6, 2])
    mem.add([5, 6, 3])  # most recent, but seen once
    drafts, _ = mem.drafts([5, 6])
    assert [d[0] for d in drafts] == [2, 3]


def test_eviction_keeps_the_newest_answers_within_the_bound():
    mem = AnswerMemory(MemoryConfig(max_tokens=100, min_support=1))
    for i in range(30):
        mem.add([1000 + i, 2000 + i, 3000 + i, 4000 + i, 5000 + i])
    assert mem.tokens <= 100
    kept = mem.answers()
    assert kept[-1][0] == 1029
    assert all(a[0] >= 1000 + 30 - len(kept) for a in kept)
    # evicted answers are gone from the index too
    assert mem.drafts([1000, 2000])[0] == []
    assert mem.drafts([1029, 2029])[0] == [(3029, 4029, 5029)]


def test_invalid_config_names_the_fix():
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        MemoryConfig(min_ngram=5, max_ngram=2)
    with pytest.raises(ValueError, match="positive"):
        MemoryConfig(scan=0)


def test_source_drafts_from_the_context_it_was_given():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1))
    mem.add([7, 8, 9, 10])
    src = MemorySource(mem)
    src.update(tokens=[1, 2, 3])
    assert src.get_candidates(plan=PLAN, last=3).drafts == []
    src.update(tokens=[7, 8])
    got = src.get_candidates(plan=PLAN, last=8)
    assert got.drafts == [(9, 10)] and got.match_len == 2
    # a plan without drafts (a plain greedy step) gets no memory drafts either
    assert src.get_candidates(plan=StepPlan(window=0, guesses=0, draft_len=0, drafts=0), last=8).drafts == []


def _source_after(mem: AnswerMemory, context: list[int]) -> MemorySource:
    src = MemorySource(mem)
    src.update(tokens=context)
    return src


def test_drafts_that_keep_failing_are_cut_to_nothing_and_still_scored():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, max_len=8))
    mem.add([7, 8, 9, 10, 11, 12, 13])
    src = _source_after(mem, [1, 7, 8])
    assert src.get_candidates(plan=PLAN, last=8).drafts == [(9, 10)]  # a 2-token match backs 2 tokens
    src.update(tokens=[50, 7, 8])
    for _ in range(30):  # the output never follows the memory: "7 8" is followed by 50, not 9
        src.get_candidates(plan=PLAN, last=8)
        src.update(tokens=[50, 7, 8])
    assert mem.yields.reached[2][0][1] >= 30 and mem.yields.passed[2][0][1] == 0
    assert src.get_candidates(plan=PLAN, last=8).drafts == []  # nothing packed any more...
    src.update(tokens=[9, 10, 7, 8])  # ...but still looked up and scored: this time it was right
    assert mem.yields.passed[2][0][1] == 1 and mem.yields.passed[2][0][2] == 1


def test_drafts_that_keep_being_right_grow_past_the_prior_cut():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1, max_len=16))
    answer = list(range(100, 116))
    mem.add([5, 6, 7, 8, 9, *answer])
    src = _source_after(mem, [5, 6, 7, 8, 9])  # a 5-token match: one occurrence backs 16 tokens
    first = src.get_candidates(plan=PLAN, last=9).drafts
    assert len(first) == 1 and 0 < len(first[0]) < 16  # unproven: cut where the prior's chance drops below min_alive
    src.update(tokens=[*answer, 5, 6, 7, 8, 9])
    for _ in range(10):
        src.get_candidates(plan=PLAN, last=9)
        src.update(tokens=[*answer, 5, 6, 7, 8, 9])  # the output is the remembered answer, every time
    assert src.get_candidates(plan=PLAN, last=9).drafts == [tuple(answer)]


def test_min_alive_zero_packs_what_the_evidence_allows():
    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1, max_len=16, min_alive=0.0))
    mem.add([5, 6, 7, 8, 9, *range(100, 116)])
    src = _source_after(mem, [5, 6, 7, 8, 9])
    assert src.get_candidates(plan=PLAN, last=9).drafts == [tuple(range(100, 116))]
    with pytest.raises(ValueError, match="0 <= min_alive < 1"):
        MemoryConfig(min_alive=1.5)


def test_a_priced_source_packs_what_pays_at_its_tokens_per_step():
    """With a token cost from the step curve the floor is tokens/step x cost: free packing (0) packs
    everything the evidence allows; dear packing cuts an unproven draft to what the prior backs."""
    answer = list(range(100, 116))
    free = MemorySource(AnswerMemory(MemoryConfig(min_ngram=2, min_support=1)), token_cost=0.0)
    dear = MemorySource(AnswerMemory(MemoryConfig(min_ngram=2, min_support=1)), token_cost=0.2)
    for src in (free, dear):
        src.memory.add([5, 6, 7, 8, 9, *answer])
        src.update(tokens=[5, 6, 7, 8, 9])
    assert free.floor() == 0.0 and free.get_candidates(plan=PLAN, last=9).drafts == [tuple(answer)]
    assert dear.floor() == pytest.approx(0.2)  # no step seen yet: 1 token a step
    assert dear.get_candidates(plan=PLAN, last=9).drafts == [tuple(answer[:2])]  # prior 0.5, 0.25 >= 0.2 > 0.125
    for _ in range(3):  # steps of 3 tokens each raise the floor: each packed token must now pay for 3
        dear.update(tokens=[1, 2, 3])
    assert 0.2 < dear.floor() < 0.6
    # min_alive=0 turns the cut off whatever the curve says (the memory before the cut existed)
    off = MemorySource(AnswerMemory(MemoryConfig(min_ngram=2, min_support=1, min_alive=0.0)), token_cost=0.2)
    off.memory.add([5, 6, 7, 8, 9, *answer])
    off.update(tokens=[5, 6, 7, 8, 9])
    assert off.floor() == 0.0 and off.get_candidates(plan=PLAN, last=9).drafts == [tuple(answer)]
