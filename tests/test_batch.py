"""Batched lookahead (engine/batch.py): every row's tokens are greedy decoding's on that row alone, in
fp32, token for token, with rows of different lengths, different stop points and rows joining mid-way;
sampled rows keep plain sampling's distribution (the chi-square test of test_sampling, batched)."""

import pytest
import torch
from test_sampling import ALPHA, K, S, chi_square_p, exact_joint
from tiny import ARCHS, hf_greedy, repetitive_prompt, tiny_gemma3

from autolade.config import LookaheadConfig
from autolade.engine.batch import REST_MAX, BatchDecoder, RowRequest, decode_batch, pad_steps
from autolade.engine.batch_prefill import PrefillChoice
from autolade.engine.layout import DraftTree, Layout
from autolade.engine.recycle import NextTokenTable
from autolade.engine.sampling import SamplingConfig, SamplingVerifier

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = {"llama": ARCHS["llama"], "qwen2": ARCHS["qwen2"], "gemma3": tiny_gemma3}  # gemma3: sliding window 16
CONFIGS = {
    "W3N3G3+lookup": LookaheadConfig(window=3, ngram=3, guesses=3, prompt_lookup=4, prompt_lookup_drafts=2),
    "lookup+recycle": LookaheadConfig(window=0, prompt_lookup=5, prompt_lookup_drafts=3, recycle=8),
}


def prompts(*lengths: int) -> list[list[int]]:
    return [repetitive_prompt(length=n, seed=i)[0].tolist() for i, n in enumerate(lengths)]


def reference(model, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    out = hf_greedy(model, torch.tensor([prompt]), n)
    return out[: out.index(eos) + 1] if eos in out else out


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("arch", list(MODELS))
def test_rows_of_different_lengths_and_stops_equal_greedy_alone(arch, config):
    model = MODELS[arch]()
    rows = prompts(40, 6, 70, 20)  # 56, 22, 86 and 36 tokens: the 86 crosses gemma3's sliding window
    budgets = [30, 45, 12, 40]
    ref3 = reference(model, rows[3], 40)
    stop_token = next(t for i, t in enumerate(ref3) if i >= 4 and t not in ref3[:i])  # row 3 ends at its 5th token or later
    requests = [RowRequest(prompt=p, config=CONFIGS[config], max_new_tokens=n, eos_ids=(stop_token,) if b == 3 else ())
                for b, (p, n) in enumerate(zip(rows, budgets))]  # fmt: skip
    done, log = decode_batch(model, requests, prefill_choice=PrefillChoice(prior=True, learn=False))
    assert log.prefills == 2, "22 with 36 and 56 with 86 tokens are prefilled together, left-padded"
    for b, (p, n, row) in enumerate(zip(rows, budgets, done)):
        assert row.out == reference(model, p, n, stop_token if b == 3 else None), f"row {b}"
    assert done[3].log.stop_reason == "eos" and done[2].log.stop_reason == "max_new_tokens"
    assert sum(s.accepted for row in done for s in row.log.steps) > 10, "drafts must be accepted, else the test proves little"
    running = [s.rows for s in log.steps]
    assert running[0] == 4 and running[-1] == 1 and running == sorted(running, reverse=True), "finished rows leave"


@pytest.mark.parametrize("arch", list(MODELS))
def test_a_row_joining_mid_way_and_a_growing_cache_stay_exact(arch):
    model = MODELS[arch]()
    config = CONFIGS["W3N3G3+lookup"]
    first, second, late = prompts(20, 50, 90)
    decoder = BatchDecoder(model, capacity=16)  # far too small: the cache must grow
    decoder.add(RowRequest(prompt=first, config=config, max_new_tokens=40))
    decoder.add(RowRequest(prompt=second, config=config, max_new_tokens=10))
    for _ in range(3):
        decoder.step()
    joined = decoder.add(RowRequest(prompt=late, config=config, max_new_tokens=30))  # longer than the columns so far
    done = decoder.run()
    assert done[0].out == reference(model, first, 40)
    assert done[1].out == reference(model, second, 10)
    assert done[joined].out == reference(model, late, 30)
    assert [s.rows for s in decoder.log.steps][:4] == [2, 2, 2, 3]


def test_shared_recycling_table_and_policies_per_row():
    model = MODELS["llama"]()
    table = NextTokenTable()
    config = CONFIGS["lookup+recycle"]
    rows = prompts(30, 30, 12)
    requests = [RowRequest(prompt=p, config=config, max_new_tokens=24, recycled=table) for p in rows]
    done, _ = decode_batch(model, requests)
    for p, row in zip(rows, done):
        assert row.out == reference(model, p, 24)
    assert table.known > 0
    assert len({id(row.policy) for row in done}) == 3


def test_zero_new_tokens_never_joins_and_a_stop_function_ends_a_row():
    model = MODELS["llama"]()
    config = CONFIGS["W3N3G3+lookup"]
    a, b = prompts(20, 30)
    done, log = decode_batch(model, [RowRequest(prompt=a, config=config, max_new_tokens=0),
                                     RowRequest(prompt=b, config=config, max_new_tokens=30, stop=lambda out: len(out) >= 7)])
    assert done[0].out == [] and done[0].log.stop_reason == "max_new_tokens"
    assert done[1].log.stop_reason == "stop" and 7 <= len(done[1].out) < 30
    assert done[1].out == reference(model, b, 30)[: len(done[1].out)]
    assert all(s.rows == 1 for s in log.steps)


def test_pad_steps_pads_to_the_widest_row_and_padding_sees_only_itself():
    layout = Layout(device=torch.device("cpu"))
    wide, narrow = DraftTree(5), DraftTree(9)
    wide.add((6, 7, 8))
    wide.add((6, 4))
    steps = [layout.build(wide, None, t=10), layout.build(narrow, [[1, 2], [3, 4]], t=3)]
    ids, positions, block, keep, where = pad_steps(steps, [10, 3])
    assert ids.shape == (2, 5) and steps[1].size == 5 and steps[0].size == 5
    steps = [layout.build(wide, None, t=10), layout.build(narrow, None, t=3)]
    ids, positions, block, keep, where = pad_steps(steps, [10, 3])
    assert ids[1].tolist() == [9] * 5 and positions[1].tolist() == [3] * 5
    assert block[1].tolist() == torch.eye(5, dtype=torch.bool).tolist()  # the padding sees only itself
    assert keep.tolist() == [0, 1, 2, 3, 4] and where[1].tolist() == [0]


def test_sampled_rows_keep_plain_samplings_distribution():
    """S sampled rows of one prompt, in batches of 40 with a greedy row of another prompt in each:
    the joint distribution of the first K tokens is plain sampling's, and the greedy row stays exact."""
    from test_sampling import own_sample, peaky

    model = peaky("llama")
    prompt = own_sample(model)
    other = repetitive_prompt(vocab=64, length=30, seed=7)[0].tolist()
    config = LookaheadConfig(window=4, ngram=4, guesses=4)
    exact = exact_joint(model, prompt, K, tau=1.0 / S, warps={})
    greedy = hf_greedy(model, torch.tensor([other]), K)
    samples, accepted = [], 0
    for start in range(0, S, 40):
        requests = [RowRequest(prompt=prompt[0].tolist(), config=config, max_new_tokens=K,
                               verifier=SamplingVerifier(SamplingConfig(seed=seed))) for seed in range(start, start + 40)]
        requests.insert(17, RowRequest(prompt=other, config=config, max_new_tokens=K))
        done, _ = decode_batch(model, requests)
        assert done.pop(17).out == greedy
        samples += [tuple(row.out) for row in done]
        accepted += sum(s.accepted for row in done for s in row.log.steps)
    p, df = chi_square_p(samples, exact)
    assert accepted >= S // 2, "drafts must be accepted often, else the test proves little"
    assert p > ALPHA, f"batched lookahead sampling deviates from plain sampling (chi-square p={p:.2e}, df={df})"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rows_the_budget_packs_alone_stay_exact_and_their_shadows_learn(arch):
    model = MODELS[arch]()
    rows = prompts(40, 12, 60)
    requests = [RowRequest(prompt=p, config=CONFIGS["W3N3G3+lookup"], max_new_tokens=30) for p in rows]
    done, log = decode_batch(model, requests, step_cost=lambda k: 5.0 + k)  # steep: wide rows rarely pay
    for p, row in zip(rows, done):
        assert row.out == reference(model, p, 30)
    assert sum(s.alone + s.cut for s in log.steps) > 0, "the budget must have cut some rows' drafts"
    assert sum(s.rested for s in log.steps) > 0, "a row packed alone rests from drafting for a few steps"
    assert all(row.backoff <= REST_MAX for row in done)
    assert any(s.alone < s.rows for s in log.steps), "and let some draft"
    learned = [row.accepts.values for row in done]
    assert any(v[8] != learned[0][8] for v in learned[1:]), "each row learns its own acceptance curve"
