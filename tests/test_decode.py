"""The decode loop against transformers' greedy decoding, token for token, on tiny models: Llama and Qwen2
(every path: window, pool, prompt lookup, the policies) and Gemma 3 (sliding window)."""

import itertools

import pytest
import torch
from tiny import ARCHS, hf_greedy, repetitive_prompt, tiny_gemma3, tiny_llama

from autolade.config import LookaheadConfig
from autolade.engine.clock import DeviceClock
from autolade.engine.decode import lookahead_decode
from autolade.engine.drafter import Drafter
from autolade.engine.steps import StepPlan

SETTINGS = [
    LookaheadConfig(window=0, guesses=0, prompt_lookup=0),  # plain greedy through the loop
    LookaheadConfig(window=0, prompt_lookup=10),  # prompt lookup only
    LookaheadConfig(window=1, ngram=2, guesses=1, prompt_lookup=0),
    LookaheadConfig(window=4, ngram=4, guesses=4),
    LookaheadConfig(window=7, ngram=5, guesses=7, prompt_lookup=6, prompt_lookup_drafts=3),
    LookaheadConfig(window=3, ngram=3, guesses=8, seed_pool_from_prompt=False),
    LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=12),  # token recycling alone
    LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=4, recycle=24),  # every source at once
]


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module", params=list(ARCHS))
def dense(request):
    """Each dense architecture's tiny model in turn (Llama, Qwen2)."""
    return ARCHS[request.param]()


@pytest.fixture(scope="module")
def gemma():
    return tiny_gemma3(sliding_window=16)


@pytest.mark.parametrize("config", SETTINGS, ids=lambda c: f"W{c.window}N{c.ngram}G{c.guesses}L{c.prompt_lookup}R{c.recycle}")
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_hf_greedy(dense, config, seed):
    ids = repetitive_prompt(seed=seed)
    ref = hf_greedy(dense, ids, 48)
    out, log = lookahead_decode(dense, ids, config=config, max_new_tokens=48)
    assert out == ref
    assert len(log.steps) <= 47


@pytest.mark.parametrize("config", SETTINGS[1:4], ids=lambda c: f"W{c.window}N{c.ngram}G{c.guesses}")
def test_gemma3_beyond_sliding_window_matches_hf(gemma, config):
    """Context (40 + 60 tokens) far beyond the 16-token sliding window of two of the three layers."""
    ids = repetitive_prompt(seed=3)
    ref = hf_greedy(gemma, ids, 60)
    out, _ = lookahead_decode(gemma, ids, config=config, max_new_tokens=60)
    assert out == ref


def test_drafts_are_accepted_on_repetitive_output(llama):
    """Random tiny models fall into loops; the loop must be drafted and accepted (fewer steps)."""
    ids = repetitive_prompt(seed=0)
    out, log = lookahead_decode(llama, ids, config=LookaheadConfig(window=4, ngram=4, guesses=4), max_new_tokens=96)
    assert sum(s.accepted for s in log.steps) > 0
    assert len(log.steps) < 95
    assert out == hf_greedy(llama, ids, 96)


def test_eos_stops_and_is_kept(llama):
    ids = repetitive_prompt(seed=0)
    ref = hf_greedy(llama, ids, 30)
    eos = ref[10]
    first = ref.index(eos)
    out, log = lookahead_decode(llama, ids, config=LookaheadConfig(), max_new_tokens=30, eos_ids=[eos])
    assert out == ref[: first + 1]
    assert log.stop_reason == "eos"


def test_max_new_tokens_exact(llama):
    ids = repetitive_prompt(seed=1)
    for n in (0, 1, 2, 17):
        out, log = lookahead_decode(llama, ids, config=LookaheadConfig(window=4, ngram=3, guesses=4), max_new_tokens=n)
        assert len(out) == n
        assert log.stop_reason == "max_new_tokens"


def test_stop_callback(llama):
    ids = repetitive_prompt(seed=1)
    ref = hf_greedy(llama, ids, 30)
    out, log = lookahead_decode(
        llama, ids, config=LookaheadConfig(), max_new_tokens=30, stop=lambda toks: len(toks) >= 5
    )
    assert out[:5] == ref[:5] and len(out) >= 5
    assert log.stop_reason == "stop"


def test_bfloat16_plain_greedy_is_bitwise_hf(llama):
    """window=0 runs the very same one-token forward as HF: identical even in bf16."""
    model = tiny_llama(dtype=torch.bfloat16)
    ids = repetitive_prompt(seed=2)
    out, _ = lookahead_decode(model, ids, config=LookaheadConfig(window=0, prompt_lookup=0), max_new_tokens=32)
    assert out == hf_greedy(model, ids, 32)


@pytest.mark.parametrize("policy", ["adaptive", "adaptive-cpu", "lookup", "cost-aware"])
def test_policies_keep_output_exact(dense, gemma, policy):
    from autolade.runtime.policies import make_policy

    # a bumpy CPU-like c(k) for the cost-aware policy: 3 packed tokens cost more than 8
    bumpy = {1: 40.0, 2: 65.0, 3: 90.0, 4: 66.0, 8: 65.0, 16: 80.0, 32: 100.0}
    cost = lambda k: bumpy[min(bumpy, key=lambda x: abs(x - k))]
    for model, seed in ((dense, 0), (dense, 4), (gemma, 3)):
        ids = repetitive_prompt(seed=seed)
        cfg = LookaheadConfig(window=3, ngram=4, guesses=3, prompt_lookup=16, prompt_lookup_drafts=3,
                              prompt_lookup_ngram=4)
        pol = make_policy(policy, cfg, cost=cost)
        # cost-aware: a clock that reads every step alike (the tiny model's packed steps cost it more
        # than the curve says, which would rightly keep it at plain steps; here the drafts must run)
        clock = DeviceClock(now_fn=itertools.count().__next__) if policy == "cost-aware" else None
        out, log = lookahead_decode(model, ids, config=cfg, max_new_tokens=64, policy=pol, clock=clock)
        assert out == hf_greedy(model, ids, 64)
        if policy == "cost-aware":
            assert all(s.window == 0 for s in log.steps) and any(s.accepted > 0 for s in log.steps)


def test_window_resized_every_step_stays_exact(llama):
    """A policy that changes W and G on every step (grow, shrink, off) keeps the output."""
    class Jittery:
        name = "jittery"

        def __init__(self):
            self.i = 0

        def plan(self):
            self.i += 1
            w = [3, 1, 6, 0, 2, 8][self.i % 6]
            return StepPlan(window=w, guesses=min(w, 5), draft_len=[0, 4, 10][self.i % 3], drafts=2)

        def update(self, outcome):
            pass

    ids = repetitive_prompt(seed=5)
    cfg = LookaheadConfig(window=3, ngram=4, guesses=5)
    out, log = lookahead_decode(llama, ids, config=cfg, max_new_tokens=80, policy=Jittery())
    assert out == hf_greedy(llama, ids, 80)
    assert {s.window for s in log.steps} >= {0, 1, 2, 3, 6, 8}


def test_plain_steps_report_the_shadow_drafts_and_every_step_what_it_emitted(llama):
    """A policy that never drafts but asks for shadows: the output is plain greedy's, each step
    reports the tokens it appended, and after a match the lookup drafts it did not pack."""
    class Watching:
        name = "watching"

        def __init__(self):
            self.outcomes = []

        def plan(self):
            return StepPlan(window=0, guesses=0, draft_len=0, drafts=2, draft_lens=(0, 0, 0), shadow_len=5)

        def update(self, outcome):
            self.outcomes.append(outcome)

    ids = repetitive_prompt(seed=2)
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=5, prompt_lookup_drafts=2, prompt_lookup_ngram=3)
    pol = Watching()
    out, log = lookahead_decode(llama, ids, config=cfg, max_new_tokens=40, policy=pol)
    assert out == hf_greedy(llama, ids, 40)
    assert all(o.packed == 1 for o in pol.outcomes)
    assert [t for o in pol.outcomes for t in o.emitted] == out[1:]
    shadowed = [o for o in pol.outcomes if o.shadow]
    assert shadowed and all(o.match_len >= 1 and all(1 <= len(d) <= 5 for d in o.shadow) for o in shadowed)
    assert all(not o.shadow for o in pol.outcomes if not o.match_len)


def test_drafter_inserts_prompt_lookup_first_then_the_pool_and_credits_each_node():
    cfg = LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=3, prompt_lookup_drafts=1,
                          seed_pool_from_prompt=False)
    drafter = Drafter(config=cfg, prompt=[1, 2, 3, 4, 1])
    drafter.pool.add_many([1, 1], [(2, 9), (7, 8)])  # (2, 9) shares its first token with the lookup draft
    plan = StepPlan(window=2, guesses=2, draft_len=3, drafts=1)
    drafted = drafter.tree(plan)
    # root 1, lookup draft 2 3 4 (nodes 1-3), then the pool, most recent first: 7 8 (nodes 4-5), 9 under 2 (node 6)
    assert drafted.tree.tokens == [1, 2, 3, 4, 7, 8, 9]
    assert drafted.ends == {"lookup": 4, "pool": 7}
    assert (drafted.nodes("lookup"), drafted.nodes("pool"), drafted.nodes("other")) == (3, 3, 0)
    assert drafted.found["lookup"].drafts == [(2, 3, 4)] and drafted.found["lookup"].match_len == 1
    assert [drafted.accepted_from(p) for p in ([], [1, 2], [1, 6], [4, 5])] == ["none", "lookup", "pool", "pool"]
    drafter.commit([2, 3])
    assert drafter.tokens == [1, 2, 3, 4, 1, 2, 3]
    assert drafter.tree(plan).found["lookup"].drafts == [(4, 1, 2)]  # the index saw the committed tokens



def test_the_filler_is_what_followed_the_last_token_before_else_the_most_frequent_token():
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)  # no source drafts anything
    plan = StepPlan(window=0, guesses=0, draft_len=0, drafts=0)
    plain = Drafter(config=cfg, prompt=[5, 6, 7, 5])
    assert plain.tree(plan).tree.tokens == [5]  # not padded: a lone token
    drafter = Drafter(config=cfg, prompt=[5, 6, 7, 5], pad_single=True)
    drafted = drafter.tree(plan)
    assert drafted.tree.tokens == [5, 6] and drafted.ends == {"lookup": 1, "filler": 2}
    assert drafted.accepted_from([1]) == "filler"
    drafter.commit([9])  # 9 never occurred before: the context's most frequent token, 5
    assert drafter.tree(plan).tree.tokens == [9, 5]
    lookup = Drafter(config=cfg.with_(prompt_lookup=3), prompt=[5, 6, 7, 5], pad_single=True)
    assert lookup.tree(StepPlan(window=0, guesses=0, draft_len=3, drafts=1)).tree.tokens == [5, 6, 7, 5]  # drafts: no filler


@pytest.mark.parametrize("config", [SETTINGS[0], SETTINGS[1], SETTINGS[6]], ids=["greedy", "lookup", "recycle"])
def test_padded_lone_steps_pack_two_tokens_and_keep_the_output(dense, config):
    ids = repetitive_prompt(seed=4)
    ref = hf_greedy(dense, ids, 48)
    out, log = lookahead_decode(dense, ids, config=config, max_new_tokens=48, pad_single=True)
    assert out == ref
    assert min(s.packed for s in log.steps) >= 2  # no step ran one token
    plain, plain_log = lookahead_decode(dense, ids, config=config, max_new_tokens=48)
    assert plain == ref
    if config.greedy_only:  # the filler is all it drafts: on a repetitive text it is right now and then
        assert sum(s.accepted for s in log.steps if s.accepted_from == "filler") > 0
        assert len(log.steps) < len(plain_log.steps)


def _memory_of(answers, **config):
    from autolade.engine.memory import AnswerMemory, MemoryConfig

    mem = AnswerMemory(MemoryConfig(min_ngram=2, min_support=1, **config))
    mem.add_many(answers)
    return mem


@pytest.mark.parametrize("token_cost", [0.0, 0.4])
def test_memory_drafts_priced_by_the_curve_keep_the_output_and_cut_what_does_not_pay(llama, token_cost):
    """The memory holds an answer that is right for 20 tokens, then wrong: priced at 0 per packed
    token nothing is cut (the evidence alone sizes drafts); at 0.4 unproven drafts are cut short.
    The output is greedy's either way."""
    ids = repetitive_prompt(seed=1)
    ref = hf_greedy(llama, ids, 48)
    answers = [ref[:20] + [5] * 30]
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=1, prompt_lookup_drafts=1)
    uncut, uncut_log = lookahead_decode(llama, ids, config=cfg, max_new_tokens=48, memory=_memory_of(answers, min_alive=0.0))
    out, log = lookahead_decode(llama, ids, config=cfg, max_new_tokens=48, memory=_memory_of(answers),
                                token_cost=token_cost)
    assert out == uncut == ref
    assert sum(s.accepted for s in log.steps if s.accepted_from == "memory") > 0
    packed, uncut_packed = sum(s.packed for s in log.steps), sum(s.packed for s in uncut_log.steps)
    if token_cost == 0.0:
        assert packed == uncut_packed
    else:
        assert packed < uncut_packed
