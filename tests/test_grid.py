"""Settings and the candidate grids of acceptance tables (the tables themselves: test_acceptance.py)."""

from __future__ import annotations

import math

import pytest

from autolade.config import GREEDY, SCALED_LOOKUP, LookaheadConfig
from autolade.errors import ProfileError
from autolade.records.grid import PRICES, Setting, compact_grid, default_grid


def test_setting_labels_and_policies():
    assert Setting.of(GREEDY).label == "greedy" and Setting.of(GREEDY).greedy
    assert Setting.of(SCALED_LOOKUP).label == "lookup 16x3 scaled"
    assert Setting.of(LookaheadConfig(window=4, ngram=4, guesses=4)).label == "W4 N4 G4 + lookup 10x2"
    assert Setting.of(SCALED_LOOKUP, policy="lookup").label == "policy lookup: lookup 16x3 scaled"
    for timed in ("adaptive", "cost-aware"):
        with pytest.raises(ProfileError, match="cannot be tabulated"):
            Setting(label="x", config=SCALED_LOOKUP, policy=timed)


def test_a_recycling_setting_carries_the_price_it_was_counted_at():
    recycle = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    priced = Setting.of(recycle, token_cost=0.025)
    assert priced.label == "recycle 16, priced 0.025" and priced.price == 0.025
    assert priced.unpriced == Setting.of(recycle) and Setting.of(recycle).price == 0.0
    assert priced.to_dict()["token_cost"] == 0.025 and "token_cost" not in Setting.of(recycle).to_dict()
    for bad in (-0.01, 1.5, math.nan, "0.1", True):
        with pytest.raises(ProfileError, match="token_cost must be a number"):
            Setting(label="x", config=recycle, token_cost=bad)
    with pytest.raises(ProfileError, match="recycles none"):
        Setting.of(SCALED_LOOKUP, token_cost=0.01)  # nothing to price: a second row of the same setting


def test_default_grid_is_small_unique_and_covers_the_families():
    grid = default_grid()
    assert 25 <= len(grid) <= 60
    assert len({s.label for s in grid}) == len(grid)
    # every recycling config is counted unpriced and at each price; nothing else carries a price
    priced = [s for s in grid if s.token_cost is not None]
    assert {s.token_cost for s in priced} == set(PRICES)
    assert all(s.config.recycle for s in priced)
    for s in (s for s in grid if s.config.recycle):
        assert {t.token_cost for t in grid if t.config == s.config} == {None, *PRICES}
    configs = [s.config for s in grid]
    assert GREEDY in configs and SCALED_LOOKUP in configs
    assert any(s.policy == "lookup" for s in grid)
    windows = {c.window for c in configs if c.lookahead}
    assert windows == {1, 2, 4, 7, 10, 15}
    assert {c.ngram for c in configs if c.lookahead} == {2, 3, 4, 5}
    assert all(c.guesses <= c.window for c in configs if c.lookahead)


def test_compact_grid_is_a_subset_of_the_full_one():
    full = {s.label for s in default_grid()}
    compact = [s.label for s in compact_grid()]
    assert len(compact) == len(set(compact)) == 31 and set(compact) <= full
