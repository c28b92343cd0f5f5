"""Token recycling: the next-token table, the best-first draft tree, the rank hit rates it learns."""

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

from autolade.config import LookaheadConfig
from autolade.engine.decode import lookahead_decode
from autolade.engine.drafter import Drafter
from autolade.engine.recycle import EMPTY, NextTokenTable, RankHits, RecycleSource
from autolade.engine.steps import StepPlan

PLAN = StepPlan(window=0, guesses=0, draft_len=0, drafts=0, recycle=4)


def logits_ranking(vocab: int, order: list[int]) -> torch.Tensor:
    """[V] logits whose top tokens are ``order``, best first."""
    out = torch.zeros(vocab)
    for rank, tok in enumerate(order):
        out[tok] = float(len(order) - rank)
    return out


def test_table_keeps_each_tokens_latest_top_k():
    table = NextTokenTable(k=2)
    assert (table.row(5) == EMPTY).all()  # nothing seen yet, even past the vocabulary
    table.observe([5, 7], torch.stack([logits_ranking(10, [3, 4]), logits_ranking(10, [1, 2])]))
    assert table.row(5).tolist() == [3, 4]
    assert table.row(7).tolist() == [1, 2]
    table.observe([5], logits_ranking(10, [9, 8])[None])  # a later prediction replaces the row
    assert table.row(5).tolist() == [9, 8]
    assert (table.row(6) == EMPTY).all()
    with pytest.raises(ValueError, match="k >= 1"):
        NextTokenTable(k=0)


def test_a_copy_is_independent_of_its_table():
    table = NextTokenTable(k=2)
    table.observe([5], logits_ranking(10, [3, 4])[None])
    table.hits.record(0)
    twin = table.copy()
    assert twin.row(5).tolist() == [3, 4] and twin.known == table.known == 1
    assert (twin.hits.hits, twin.hits.seen) == ([1.0, 0.0], 1.0)
    twin.observe([5, 6], torch.stack([logits_ranking(10, [1, 2]), logits_ranking(10, [7, 8])]))
    twin.hits.record(None)
    assert table.row(5).tolist() == [3, 4] and table.known == 1  # the original kept its rows
    assert (table.hits.hits, table.hits.seen) == ([1.0, 0.0], 1.0)  # and its rates
    assert twin.known == 2 and twin.hits.seen == 2.0
    assert NextTokenTable().known == 0


def test_the_rank_rates_travel_with_the_table():
    table = NextTokenTable(k=2)
    table.observe([1], logits_ranking(10, [2, 3])[None])
    first = RecycleSource(table)
    first.get_candidates(plan=PLAN, last=1)
    first.update(tokens=[3])  # the runner-up came next
    assert RecycleSource(table).hits.seen == 1 and RecycleSource(table).hits.hits == [0.0, 1.0]


def test_tree_is_grown_best_first_within_the_budget():
    table = NextTokenTable(k=3)
    table.observe([1, 2, 3], torch.stack([logits_ranking(10, [2, 5, 6]), logits_ranking(10, [3, 7, 8]),
                                          logits_ranking(10, [4, 9, 0])]))
    source = RecycleSource(table)
    # rates 0.45 / 0.12 / 0.06: the top-1 chain 1->2->3->4 is worth .45, .2, .09; rank 2 after 1 is .12
    found = source.get_candidates(plan=PLAN, last=1)
    assert found.drafts == [(2,), (2, 3), (5,), (2, 3, 4)]
    assert source.get_candidates(plan=StepPlan(window=0, guesses=0, draft_len=0, drafts=0), last=1).drafts == []
    assert source.get_candidates(plan=PLAN, last=4).drafts == []  # nothing known after 4


def test_a_priced_token_cuts_the_nodes_that_do_not_pay_for_it():
    table = NextTokenTable(k=3)
    table.observe([1, 2, 3], torch.stack([logits_ranking(10, [2, 5, 6]), logits_ranking(10, [3, 7, 8]),
                                          logits_ranking(10, [4, 9, 0])]))
    plan = StepPlan(window=0, guesses=0, draft_len=0, drafts=0, recycle=8)
    assert len(RecycleSource(table).get_candidates(plan=plan, last=1).drafts) == 8  # no curve: the budget alone
    assert len(RecycleSource(table, token_cost=0.0).get_candidates(plan=plan, last=1).drafts) == 8  # a GPU's flat curve
    priced = RecycleSource(table, token_cost=0.1)  # floor = 1 token/step x 0.1: worth .45, .2025, .12 pass
    assert priced.floor() == pytest.approx(0.1)
    assert priced.get_candidates(plan=plan, last=1).drafts == [(2,), (2, 3), (5,)]
    for _ in range(40):  # the top-1 chain came true, 3 tokens a step: the floor rises to ~0.3, rank 0 to ~0.8
        priced.get_candidates(plan=plan, last=1)
        priced.update(tokens=[2, 3, 4])
    assert priced.floor() == pytest.approx(0.3, abs=0.01)
    assert priced.hits.rate(0) > 0.8 and priced.hits.rate(1) < 0.1
    # the chain is worth packing to its end (nothing is known after 4); no runner-up earns its token
    assert priced.get_candidates(plan=plan, last=1).drafts == [(2,), (2, 3), (2, 3, 4)]


def test_rank_hits_are_learned_from_what_came_next():
    table = NextTokenTable(k=2)
    table.observe([1, 2], torch.stack([logits_ranking(10, [2, 3]), logits_ranking(10, [5, 4])]))
    source = RecycleSource(table)
    before = [source.hits.rate(r) for r in range(2)]
    for _ in range(30):
        source.get_candidates(plan=PLAN, last=1)
        source.update(tokens=[3])  # the runner-up came next every time
    assert source.hits.seen == 30 and source.hits.hits == [0.0, 30.0]
    assert source.hits.rate(1) > 0.5 > before[1] and source.hits.rate(0) < before[0]
    found = source.get_candidates(plan=StepPlan(window=0, guesses=0, draft_len=0, drafts=0, recycle=2), last=1)
    assert found.drafts == [(3,), (2,)]  # the learned rates reorder the tree
    source.update(tokens=[2, 5])  # 1->2 at rank 0, then 2->5 scored against the row of 2 it drafted from: rank 0
    assert source.hits.hits == [2.0, 30.0] and source.hits.seen == 32


def test_update_without_a_drafting_step_scores_nothing():
    source = RecycleSource(NextTokenTable(k=2))
    source.update(tokens=[1, 2, 3])  # the prompt
    assert source.hits.seen == 0
    source.get_candidates(plan=PLAN, last=9)  # nothing known after 9: nothing drafted, so no miss either
    source.update(tokens=[4])
    assert source.hits.seen == 0
    assert RankHits(3).rate(0) == pytest.approx(RankHits.PRIOR[0])


def pair_keys(table: NextTokenTable) -> list[tuple[int, int]]:
    """The table's (previous, token) pairs, least recently predicted first."""
    return [tuple(key) for key in table.known_pairs()[0].tolist()]


def test_pair_rows_are_kept_per_previous_token_and_preferred():
    table = NextTokenTable(k=2)
    table.observe([5, 5], torch.stack([logits_ranking(10, [3, 4]), logits_ranking(10, [1, 2])]), previous=[7, 8])
    assert table.row(5, 7).tolist() == [3, 4]  # after "7 5"
    assert table.row(5, 8).tolist() == [1, 2]  # after "8 5"
    assert table.row(5).tolist() == [1, 2]  # no previous token: the token's latest row
    assert table.row(5, 9).tolist() == [1, 2]  # an unseen pair: the same
    table.observe([6], logits_ranking(10, [2, 1])[None], previous=[EMPTY])  # no previous token known: no pair row
    assert pair_keys(table) == [(7, 5), (8, 5)]
    table.observe([6], logits_ranking(10, [0, 9])[None])  # without previous: rows per token only
    assert pair_keys(table) == [(7, 5), (8, 5)]
    # a pair row older than `since` loses to a token row written since: this generation's evidence first
    since = table.clock + 1
    table.observe([5], logits_ranking(10, [9, 8])[None], previous=[8])
    assert table.row(5, 8, since=since).tolist() == [9, 8]  # the pair was re-predicted: fresh
    assert table.row(5, 7, since=since).tolist() == [9, 8]  # stale pair, fresher token row
    assert table.row(5, 7).tolist() == [3, 4]  # since=0: every pair row counts
    with pytest.raises(ValueError, match="max_pairs must be >= 0"):
        NextTokenTable(max_pairs=-1)


def test_pair_rows_are_capped_least_recently_predicted_first():
    table = NextTokenTable(k=1, max_pairs=4)
    one = logits_ranking(10, [1])[None]
    for prev in (1, 2, 3, 4):
        table.observe([9], one, previous=[prev])
    table.observe([9], one, previous=[1])  # re-predicted: now the newest
    table.observe([9], one, previous=[5])  # over the cap: the oldest quarter goes, down to 3
    assert pair_keys(table) == [(4, 9), (1, 9), (5, 9)]
    assert set(table.pair_stamps) == set(table.pairs)
    unpaired = NextTokenTable(k=1, max_pairs=0)
    unpaired.observe([9], one, previous=[1])
    assert unpaired.pairs == {} and unpaired.row(9, 1).tolist() == [1]
    twin = table.copy()
    twin.observe([9], logits_ranking(10, [2])[None], previous=[6])
    assert (6, 9) not in pair_keys(table) and (6, 9) in pair_keys(twin) and table.max_pairs == twin.max_pairs == 4


def test_the_tree_drafts_from_pair_rows_along_its_paths():
    table = NextTokenTable(k=1)
    table.observe([2], logits_ranking(10, [6])[None], previous=[1])  # after "1 2" comes 6
    table.observe([1], logits_ranking(10, [5])[None], previous=[0])  # after "0 1" comes 5
    for tok, nxt in {1: [2], 2: [3], 3: [4]}.items():  # and per token, predicted since: 1 -> 2 -> 3 -> 4
        table.observe([tok], logits_ranking(10, nxt)[None])
    source = RecycleSource(table)
    source.update(tokens=[0, 1])  # the context ends "0 1"
    assert source.get_candidates(plan=PLAN, last=1).drafts == [(5,)]  # nothing known after "1 5" or 5
    source.update(tokens=[5])  # the pair row's rank 0 came next
    source.update(tokens=[1])  # now "5 1": no pair row, the token's row: 1 -> 2, then "1 2" -> 6
    assert source.get_candidates(plan=PLAN, last=1).drafts == [(2,), (2, 6)]
    source.update(tokens=[2, 6])  # both at rank 0 of the rows drafted from
    assert source.hits.hits == [3.0] and source.hits.seen == 3


def test_the_drafter_teaches_pairs_from_the_tree_and_the_prompt():
    config = LookaheadConfig(window=0, prompt_lookup=0, recycle=4)
    drafter = Drafter(config=config, prompt=[3, 4, 5])
    drafter.observe_prompt([3, 4, 5], torch.zeros(2, 10))
    assert pair_keys(drafter.recycler.table) == [(3, 4), (4, 5)]
    tree = drafter.tree(StepPlan(window=0, guesses=0, draft_len=0, drafts=0, recycle=0)).tree
    tree.add((7, 8))
    tree.add((9,))
    drafter.observe(tree, torch.zeros(4, 10))  # root 5 after 4; 7 and 9 after 5; 8 after 7
    assert pair_keys(drafter.recycler.table)[-4:] == [(4, 5), (5, 7), (7, 8), (5, 9)]


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def test_recycled_drafts_are_accepted_and_credited_and_the_output_is_greedys(llama):
    ids = repetitive_prompt(seed=2)
    ref = hf_greedy(llama, ids, 64)
    out, log = lookahead_decode(llama, ids, config=LookaheadConfig(window=0, prompt_lookup=0, recycle=16),
                                max_new_tokens=64)
    assert out == ref
    assert any(s.accepted_from == "recycle" and s.accepted > 0 for s in log.steps)
    assert len(log.steps) < 63


def test_a_table_carried_over_drafts_from_the_first_step(llama):
    ids = repetitive_prompt(seed=2)
    table = NextTokenTable()
    lookahead_decode(llama, ids, config=LookaheadConfig(window=0, prompt_lookup=0, recycle=16), max_new_tokens=32,
                     recycled=table)
    drafter = Drafter(config=LookaheadConfig(window=0, prompt_lookup=0, recycle=16), prompt=ids[0].tolist(),
                      recycled=table)
    assert len(drafter.tree(PLAN).tree) > 1  # the carried table drafts before this decode's first forward
    out, _ = lookahead_decode(llama, ids, config=LookaheadConfig(window=0, prompt_lookup=0, recycle=16),
                              max_new_tokens=32, recycled=table)
    assert out == hf_greedy(llama, ids, 32)


def test_the_prefill_seeds_the_table_with_the_prompts_predictions(llama):
    ids = repetitive_prompt(seed=4)
    table = NextTokenTable()
    out, _ = lookahead_decode(llama, ids, config=LookaheadConfig(window=0, prompt_lookup=0, recycle=8), max_new_tokens=1,
                              recycled=table)
    assert out == hf_greedy(llama, ids, 1)
    prompt = ids[0].tolist()
    with torch.inference_mode():
        top = llama(ids).logits[0].topk(table.k).indices  # [T, k]
    last_seen = {tok: i for i, tok in enumerate(prompt)}  # a token's row holds its latest occurrence's prediction
    for tok, i in last_seen.items():
        assert table.row(tok).tolist() == top[i].tolist()
