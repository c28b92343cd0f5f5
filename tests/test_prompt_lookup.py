from autolade.engine.prompt_lookup import PromptLookupSource, SuffixIndex
from autolade.engine.steps import StepPlan


def test_suffix_index_longest_match_most_recent_first():
    idx = SuffixIndex(max_ngram=3)
    idx.extend([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    # suffix (5, 6, 7) occurred twice before: after the 2nd -> 1 2 ..., after the 1st -> 8 9 ...
    assert idx.drafts(max_len=3, max_drafts=2)[0] == [(1, 2, 5), (8, 9, 5)]
    assert idx.drafts(max_len=2, max_drafts=1)[0] == [(1, 2)]


def test_suffix_index_falls_back_to_shorter_suffix_and_incremental():
    idx = SuffixIndex(max_ngram=3)
    idx.extend([1, 2, 3, 4])
    assert idx.drafts(max_len=4, max_drafts=2)[0] == []  # 4 never occurred before
    idx.extend([2])
    assert idx.drafts(max_len=4, max_drafts=2)[0] == [(3, 4, 2)]  # only the 1-gram (2) matches
    assert idx.drafts(max_len=0, max_drafts=2)[0] == []


def test_suffix_index_scaled_draft_length_follows_match_length():
    idx = SuffixIndex(max_ngram=4)
    seq = [1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
    context = seq + [1, 2, 3, 4]
    idx.extend(context)
    # a 4-token match earns 2**4 = 16 tokens, capped by max_len
    assert idx.drafts(max_len=32, max_drafts=1, scaled=True)[0] == [tuple(context[4:20])]
    assert idx.drafts(max_len=5, max_drafts=1, scaled=True)[0] == [tuple(context[4:9])]
    assert idx.drafts(max_len=32, max_drafts=1)[0] == [tuple(context[4:])]  # unscaled: as long as max_len allows
    idx.extend([99, 24])
    # only the 1-token suffix (24) occurred before (followed by 1 2 3 4 99 24): 2**1 = 2 tokens
    assert idx.drafts(max_len=32, max_drafts=1, scaled=True)[0] == [(1, 2)]
    assert len(idx.drafts(max_len=32, max_drafts=1)[0][0]) == 6  # unscaled: everything after the earlier 24


def test_suffix_index_match_and_continuations():
    idx = SuffixIndex(max_ngram=3)
    assert idx.match() == (0, [])
    idx.extend([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    # (5, 6, 7) ended at 3 and 8 before (13 is the suffix itself): most recent first
    assert idx.match() == (3, [8, 3])
    assert idx.continuations([8, 3], length=2, max_drafts=3) == [(1, 2), (8, 9)]
    # a continuation that is a prefix of an earlier draft adds nothing
    idx2 = SuffixIndex(max_ngram=1)
    idx2.extend([1, 2, 3, 1, 2, 3, 1])
    assert idx2.match() == (1, [4, 1])
    assert idx2.continuations([4, 1], length=2, max_drafts=3) == [(2, 3)]
    idx2.extend([4])
    assert idx2.match() == (0, [])


def test_suffix_index_drafts_report_the_match_length_and_per_length_sizes():
    idx = SuffixIndex(max_ngram=3)
    idx.extend([5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    assert idx.drafts(max_len=2, max_drafts=1) == ([(1, 2)], 3)
    # lengths[m-1] sizes a draft after an m-token match; the last entry serves longer matches; 0 = no draft
    assert idx.drafts(max_len=9, max_drafts=2, lengths=(1, 4)) == ([(1, 2, 5, 6), (8, 9, 5, 6)], 3)
    assert idx.drafts(max_len=9, max_drafts=2, lengths=(1, 2, 0)) == ([], 3)
    assert idx.drafts(max_len=9, max_drafts=0) == ([], 0)


def test_suffix_index_follower_is_what_followed_the_last_token_the_time_before():
    idx = SuffixIndex(max_ngram=3)
    assert idx.follower() is None  # empty
    idx.extend([5, 6, 7, 5])
    assert idx.follower() == 6
    idx.extend([8, 5])
    assert idx.follower() == 8  # the most recent earlier occurrence
    idx.extend([9])
    assert idx.follower() is None  # 9 is new


def test_prompt_lookup_source_follows_the_plan_and_the_committed_tokens():
    source = PromptLookupSource(max_ngram=2, scaled=False)
    source.update(tokens=[1, 2, 3, 4])
    plan = StepPlan(window=0, guesses=0, draft_len=3, drafts=2)
    assert source.get_candidates(plan=plan, last=4).drafts == []  # 4 is new
    source.update(tokens=[1, 2])
    found = source.get_candidates(plan=plan, last=2)
    assert (found.drafts, found.match_len) == ([(3, 4, 1)], 2)
    assert source.get_candidates(plan=StepPlan(window=0, guesses=0, draft_len=0, drafts=2), last=2).drafts == []
    scaled = PromptLookupSource(max_ngram=2, scaled=True)
    scaled.update(tokens=[1, 2, 3, 4, 5, 9, 1])
    assert scaled.get_candidates(plan=plan, last=1).drafts == [(2, 3)]  # a 1-token match: at most 2**1 tokens


def test_a_step_that_drafts_nothing_after_a_match_reports_the_shadow_it_would_have_drafted():
    source = PromptLookupSource(max_ngram=2, scaled=False)
    source.update(tokens=[5, 6, 7, 8, 9, 1, 5, 6, 3, 5, 6])
    silent = StepPlan(window=0, guesses=0, draft_len=0, drafts=2, draft_lens=(0, 0), shadow_len=3)
    found = source.get_candidates(plan=silent, last=6)
    assert (found.drafts, found.match_len, found.shadow) == ([], 2, ((3, 5, 6), (7, 8, 9)))
    # drafting, or asked for no shadow: none
    drafting = StepPlan(window=0, guesses=0, draft_len=2, drafts=2, shadow_len=3)
    assert source.get_candidates(plan=drafting, last=6).shadow == ()
    blind = StepPlan(window=0, guesses=0, draft_len=0, drafts=2)
    assert (source.get_candidates(plan=blind, last=6).shadow, source.get_candidates(plan=blind, last=6).match_len) == ((), 0)
    source.update(tokens=[4])  # 4 is new: no match, no shadow
    assert source.get_candidates(plan=silent, last=4).shadow == ()
