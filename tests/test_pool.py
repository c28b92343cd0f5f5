from autolade.engine.pool import NgramPool, PoolSource
from autolade.engine.steps import StepPlan


def test_pool_lru_cap_and_order():
    pool = NgramPool(cap=2)
    pool.add(1, (2, 3))
    pool.add(1, (4, 5))
    pool.add(1, (2, 3))  # refresh: now most recent
    pool.add(1, (6, 7))  # evicts (4, 5), the least recently used
    assert pool.get(1, 5) == [(6, 7), (2, 3)]
    assert pool.get(1, 1) == [(6, 7)]
    assert pool.get(9, 3) == [] and pool.get(1, 0) == []
    assert len(pool) == 2


def test_pool_seed_and_resize():
    pool = NgramPool(cap=4)
    pool.seed([1, 2, 3, 1, 2, 4], n=3)
    assert pool.get(1, 4) == [(2, 4), (2, 3)]
    assert pool.get(2, 4) == [(4,)] or pool.get(2, 4) == [(3, 1)]  # last full 3-gram after 2 is (2,3,1)
    pool.resize(1)
    assert pool.get(1, 4) == [(2, 4)]


def test_pool_source_drafts_up_to_g_ngrams_after_the_last_token():
    source = PoolSource(cap=4)
    source.pool.add_many([1, 1, 2], [(2, 3), (4, 5), (6, 7)])
    plan = StepPlan(window=3, guesses=1, draft_len=0, drafts=0)
    assert source.get_candidates(plan=plan, last=1).drafts == [(4, 5)]
    wide = StepPlan(window=3, guesses=5, draft_len=0, drafts=0)
    assert source.get_candidates(plan=wide, last=1).drafts == [(4, 5), (2, 3)]
    assert source.get_candidates(plan=StepPlan(window=0, guesses=0, draft_len=0, drafts=0), last=1).drafts == []
    source.update(tokens=[1, 2, 3])  # accepted tokens teach the pool nothing (the window feeds it)
    assert source.get_candidates(plan=wide, last=1).drafts == [(4, 5), (2, 3)] and len(source.pool) == 3
