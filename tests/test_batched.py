"""``autolade.generate`` and the ``model.generate`` drop-in with a left-padded batch (autolade/batched.py)."""

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

import autolade
import autolade.hf
from autolade import ConfigError, InputError

pytestmark = pytest.mark.usefixtures("one_thread")
W3 = dict(window=3, ngram=3, guesses=3)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def batch():
    """Three prompts of 36, 66 and 24 tokens, left-padded as a tokenizer with padding_side='left' pads them."""
    rows = [repetitive_prompt(length=n, seed=s)[0] for n, s in [(20, 3), (50, 4), (8, 5)]]
    t = max(len(r) for r in rows)
    ids, mask = torch.zeros(len(rows), t, dtype=torch.long), torch.zeros(len(rows), t, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, t - len(r) :], mask[b, t - len(r) :] = r, 1
    return rows, ids, mask


def test_a_batch_equals_hf_on_the_padded_batch_and_each_row_alone(model, batch):
    rows, ids, mask = batch
    res = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=20, memory=False, **W3)
    assert isinstance(res, autolade.batched.BatchResult)
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(res.sequences, hf)
    for b, row in enumerate(rows):
        assert res.sequences[b, ids.shape[1] :].tolist() == hf_greedy(model, row[None], 20)
        assert res.stats[b].new_tokens == 20
    assert res.batch.rows == 3 and res.batch.new_tokens == 60
    assert res.batch.steps < 19, "drafts must be accepted: fewer forwards than tokens per row"
    assert res.batch.packed_per_step > res.batch.rows_per_step
    assert 0 < res.batch.hole_share < 0.5  # rows of 36, 66 and 24 tokens: the shorter ones see holes


def test_rows_ending_early_are_padded_as_generate_pads_them(model, batch):
    rows, ids, mask = batch
    eos = hf_greedy(model, rows[2][None], 20)[3]
    res = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=eos, pad_token_id=0,
                            memory=False, **W3)  # fmt: skip
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(res.sequences, hf)
    assert res.stats[2].stop_reason == "eos"


def test_sampled_row_b_is_generate_alone_with_seed_plus_b(model, batch):
    rows, ids, mask = batch
    res = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=12, do_sample=True, seed=3, **W3)
    for b, row in enumerate(rows):
        alone = autolade.generate(model, row[None], max_new_tokens=12, do_sample=True, seed=3 + b, **W3)
        assert torch.equal(res.sequences[b, ids.shape[1] :], alone.sequences[0, len(row) :])


def test_on_tokens_gets_the_row(model, batch):
    _, ids, mask = batch
    seen: dict[int, list[int]] = {}
    res = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=10, memory=False,
                            on_tokens=lambda row, tokens: seen.setdefault(row, []).extend(tokens), **W3)  # fmt: skip
    assert {b: res.sequences[b, ids.shape[1] :].tolist() for b in range(3)} == seen


def test_one_padded_row_is_unpadded(model, batch):
    rows, ids, mask = batch
    res = autolade.generate(model, ids[2], attention_mask=mask[2], max_new_tokens=8, memory=False)
    assert res.sequences[0].tolist() == rows[2].tolist() + hf_greedy(model, rows[2][None], 8)


def test_the_drop_in_decodes_a_batch(model, batch):
    _, ids, mask = batch
    out = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0,
                         custom_generate=autolade.hf.lookahead, memory=False, **W3)  # fmt: skip
    assert torch.equal(out, model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0))
    sampled = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=10, pad_token_id=0,
                             custom_generate=autolade.hf.lookahead, seed=1)  # fmt: skip
    assert sampled.shape == (3, ids.shape[1] + 6)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda ids, mask: (ids, mask[:, 1:]), "attention_mask must have input_ids' shape"),
        (lambda ids, mask: (ids, mask.flip(1)), "pad on the left"),
        (lambda ids, mask: (ids, mask * 0), "row 0 of the batch is all padding"),
        (lambda ids, mask: (ids, mask * 2), "0 \\(padding\\) and 1 \\(token\\) only"),
        (lambda ids, mask: (ids.float(), mask), "row 0: input_ids must hold integer token ids"),
    ],
)
def test_bad_batches_name_the_argument(model, batch, change, match):
    _, ids, mask = batch
    bad_ids, bad_mask = change(ids, mask)
    with pytest.raises(InputError, match=match):
        autolade.generate(model, bad_ids, attention_mask=bad_mask, max_new_tokens=4)


def test_rows_beyond_the_context_beam_search_and_policy_objects_are_refused(model, batch):
    _, ids, mask = batch
    with pytest.raises(InputError, match="row 1: prompt \\(66 tokens\\) \\+ max_new_tokens \\(460\\) exceeds"):
        autolade.generate(model, ids, attention_mask=mask, max_new_tokens=460)
    with pytest.raises(ConfigError, match="num_beams"):
        autolade.generate(model, ids, attention_mask=mask, max_new_tokens=4, num_beams=2)
    with pytest.raises(ConfigError, match="num_beams"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2, custom_generate=autolade.hf.lookahead)
    from autolade.engine.steps import StaticPolicy

    with pytest.raises(ConfigError, match="a batch needs policy= as a name"):
        autolade.generate(model, ids, attention_mask=mask, max_new_tokens=4, policy=StaticPolicy(autolade.LookaheadConfig()))
