"""generate(compile=...): compiled runners kept per model, the choice from the stored curves, exactness."""

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

from autolade.api import generate
from autolade.compiling import CompiledRunners, check_compile
from autolade.config import LookaheadConfig
from autolade.engine.compiled import MIN_CAPACITY
from autolade.errors import ConfigError

GREEDY = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)  # one-token steps: a single graph


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(seed=5)


def test_runners_are_kept_per_model_and_capacity_class(llama):
    runners = CompiledRunners()
    wide = LookaheadConfig(window=4, ngram=4, guesses=4)  # packs 45: buckets up to 64
    a = runners.get(llama, tokens=40 + 100, config=wide)
    assert runners.get(llama, tokens=300 + 100, config=wide) is a  # another prompt length: the same graphs
    assert a.capacity == MIN_CAPACITY and a.buckets[-1] == 64
    big = runners.get(llama, tokens=1500, config=wide)
    assert big is not a and big.capacity == 2048
    assert runners.get(llama, tokens=100, config=LookaheadConfig(window=7, ngram=5, guesses=7)).buckets[-1] == 128
    assert len(runners.of(llama)) == 3 and runners.of(tiny_llama()) == []


def test_check_compile():
    assert check_compile(None) is None and check_compile(True) is True
    with pytest.raises(ConfigError, match="compile must be True, False or None"):
        check_compile("yes")


def test_generate_compiled_matches_hf_and_reports_the_warm_up_once(llama):
    ids = repetitive_prompt(seed=2)
    ref = hf_greedy(llama, ids, 24)
    first = generate(llama, ids, max_new_tokens=24, config=GREEDY, memory=False, pad_single=False, compile=True)
    again = generate(llama, repetitive_prompt(seed=4, length=33), max_new_tokens=24, config=GREEDY, memory=False,
                     pad_single=False, compile=True)
    eager = generate(llama, ids, max_new_tokens=24, config=GREEDY, memory=False, pad_single=False, compile=False)
    assert first.sequences[0, ids.shape[1]:].tolist() == ref == eager.sequences[0, ids.shape[1]:].tolist()
    c1, c2 = first.stats.compiled, again.stats.compiled
    # a CPU's one graph of dynamic width: its narrowest step is 2 rows, the lone token and one padding row
    assert c1["dynamic"] and c1["buckets"][0] == 2 and c1["steps_per_bucket"] == {2: 23} and c1["graphs"] == 1
    assert c1["warmup_s"] > 0 and c2["warmup_s"] == 0 and c2["graphs"] == 1  # paid once, no recompile
    assert "compiled steps" in first.stats.summary() and eager.stats.compiled is None


def test_generate_follows_the_stored_curves_unless_told(llama):
    from test_settings import _save_curve

    ids = repetitive_prompt(seed=2)
    assert generate(llama, ids, max_new_tokens=6, config=GREEDY, memory=False, pad_single=False).stats.compiled is None
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6}})
    _save_curve(llama, {256: {1: 8.0, 8: 10.0, 16: 12.0}}, compiled=True)
    chosen = generate(llama, ids, max_new_tokens=6, config=GREEDY, memory=False, pad_single=False)
    assert chosen.stats.compiled is not None
    told = generate(llama, ids, max_new_tokens=6, config=GREEDY, memory=False, pad_single=False, compile=False)
    assert told.stats.compiled is None
    assert chosen.sequences.tolist() == told.sequences.tolist()


def test_a_lone_token_runs_in_the_cheaper_wider_bucket_the_stored_curve_shows(llama):
    """Where the stored compiled curve has the 8-token bucket cheaper than the 1-token one (Zen 4, bf16), a decode
    compiles no 1-token graph: lone steps run at 8, carrying a free filler draft; the output is HF's."""
    from test_settings import _save_curve

    from autolade.runtime.settings import stored_buckets, stored_pads_single

    _save_curve(llama, {256: {1: 23.3, 2: 22.0, 4: 25.7, 8: 30.4, 16: 33.6}})
    _save_curve(llama, {256: {1: 12.0, 8: 10.0, 16: 14.0}}, compiled=True)
    assert stored_buckets(llama) == (8, 16)
    assert stored_pads_single(llama, compiled=True)  # c(2) = c(1) = the 8-bucket's: a filler rides free
    ids = repetitive_prompt(seed=6)
    lookup = LookaheadConfig(window=0, guesses=0, prompt_lookup=4)
    res = generate(llama, ids, max_new_tokens=30, config=lookup, memory=False)
    assert res.sequences[0, ids.shape[1]:].tolist() == hf_greedy(llama, ids, 30)
    assert res.stats.compiled["buckets"] == [8, 16] and set(res.stats.compiled["steps_per_bucket"]) == {8}
    assert res.stats.padded is True


def test_a_batch_compiles_as_one_graph_and_follows_the_stored_curves(llama):
    """A left-padded batch through generate(compile=True): each row HF's greedy alone, one graph (kept for the next
    batch: no second warm-up); with compile=None the stored curves decide, as for one sequence."""
    from test_settings import _save_curve

    prompts = [repetitive_prompt(seed=1, length=30)[0], repetitive_prompt(seed=2, length=44)[0]]
    t = max(len(p) for p in prompts)
    ids, mask = torch.zeros((2, t), dtype=torch.long), torch.zeros((2, t), dtype=torch.long)
    for b, p in enumerate(prompts):  # left-padded, as a tokenizer pads for generation
        ids[b, t - len(p):], mask[b, t - len(p):] = p, 1
    lookup = LookaheadConfig(window=0, guesses=0, prompt_lookup=4)
    first = generate(llama, ids, attention_mask=mask, max_new_tokens=20, config=lookup, memory=False, compile=True)
    for b, p in enumerate(prompts):
        assert first.sequences[b, t:].tolist() == hf_greedy(llama, p[None], 20), f"row {b}"
    summary = first.stats[0].compiled
    assert summary["batched"] and summary["graphs"] == 1 and summary["warmup_s"] > 0 and summary["steps"] >= 10
    assert generate(llama, ids, attention_mask=mask, max_new_tokens=8, config=lookup, memory=False).stats[0].compiled is None
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6}})
    _save_curve(llama, {256: {1: 8.0, 8: 10.0, 16: 12.0}}, compiled=True)
    chosen = generate(llama, ids, attention_mask=mask, max_new_tokens=8, config=lookup, memory=False)
    assert chosen.stats[1].compiled["warmup_s"] == 0 and chosen.stats[1].compiled["graphs"] == 1, "the graph was kept"
    assert chosen.sequences[:, t:].tolist() == first.sequences[:, t : t + 8].tolist()
    with pytest.raises(ConfigError, match="compile must be"):
        generate(llama, ids[:1], max_new_tokens=4, compile=1)
