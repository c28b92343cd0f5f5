"""tools/recycle_carry.py: fresh vs carried token recycling tables, counted on a tiny random Llama."""

import sys
from pathlib import Path

import pytest
import torch
from tiny import tiny_llama

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import recycle_carry

from autolade.config import LookaheadConfig


class LinearCurve:
    """c(k) = 1 + 0.1 (k - 1), whatever the context."""

    def cost(self, k, context=None):
        return 1.0 + 0.1 * (k - 1)


def test_a_carried_table_drafts_what_earlier_prompts_taught():
    model = tiny_llama()
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:30].add(3).unsqueeze(0)
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)  # recycling is the only source
    found = recycle_carry.measure(model, [ids, ids], cfg, warm=[ids], max_new_tokens=40, curve=LinearCurve())
    fresh, carried, warmed = found["fresh"], found["carried"], found["warmed"]
    assert fresh["prompts"] == carried["prompts"] == warmed["prompts"] == 2 and warmed["warm_prompts"] == 1
    # the second prompt (the first again) drafts from the first's predictions; the warmed table from the start
    assert warmed["steps"] < carried["steps"] < fresh["steps"]
    assert carried["tokens_per_step"] == pytest.approx(2 * 39 / carried["steps"])
    assert carried["recycled_accepted"] > fresh["recycled_accepted"]
    assert carried["tokens_known"] > 30 and len(carried["rank_rates"]) == 8
    for row in found.values():  # priced on the curve: tokens/step over the mean relative step cost
        rel = 1.0 + 0.1 * (row["packed_per_step"] - 1)
        assert row["speedup_on_curve"] == pytest.approx(row["tokens_per_step"] / rel)


def test_a_setting_without_recycling_is_refused():
    with pytest.raises(SystemExit, match="recycle=N"):
        recycle_carry.main(["-c", "2,3,2,0"])
