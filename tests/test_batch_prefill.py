"""Prompts prefilled together: the groups, the mask, and logits and keys equal to each prompt's own prefill."""

import pytest
import torch
from tiny import ARCHS, repetitive_prompt, tiny_gemma3

from autolade.engine.batch_prefill import ELEMENT_BUDGET, PrefillChoice, padded_prompts, prefill_groups, prefill_rows, prompt_visibility
from autolade.engine.decode import ModelRunner, prefill

MODELS = {**ARCHS, "gemma3": tiny_gemma3}


def test_groups_join_rows_of_about_the_same_length_and_keep_to_the_budgets():
    assert prefill_groups([30, 100, 32, 96, 31], [1] * 5, vocab=100) == [[0, 4, 2], [3, 1]]
    assert prefill_groups([10, 40], [1, 1], vocab=100) == [[0], [1]]  # 2 x 40 pads 80 for 50 real tokens
    long = int(ELEMENT_BUDGET**0.5)  # one such prompt's mask fills the budget alone
    assert prefill_groups([long, long], [1, 1], vocab=10) == [[0], [1]]
    assert prefill_groups([20, 20], [20, 20], vocab=ELEMENT_BUDGET // 30) == [[0], [1]]  # kept logits past the budget
    assert prefill_groups([], [], vocab=10) == []


def test_left_padding_positions_and_a_padding_query_seeing_only_itself():
    ids, positions, starts = padded_prompts([[7, 8, 9], [5]])
    assert ids.tolist() == [[7, 8, 9], [5, 5, 5]] and starts == [0, 2]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    seen = prompt_visibility(starts, 3)
    assert seen[1].tolist() == [[True, False, False], [False, True, False], [False, False, True]]
    assert seen[0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert prompt_visibility([0], 4, window=2)[0, 3].tolist() == [False, False, True, True]


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_rows_prefilled_together_get_their_own_prefills_logits_and_keys(arch):
    model = MODELS[arch]()
    runner = ModelRunner(model)
    prompts = [repetitive_prompt(length=n, seed=i)[0].tolist() for i, n in enumerate((30, 24, 27))]  # 30 > gemma3's window 16
    keeps = [5, 1, 27]
    with torch.inference_mode():
        cache, starts, logits = prefill_rows(runner, prompts, keeps)
        assert starts == [0, 6, 3]
        for b, prompt in enumerate(prompts):
            alone = runner.new_cache(len(prompt) + 1)
            own = prefill(runner, alone, torch.tensor([prompt]), keep=keeps[b])  # [keep, V]
            assert logits[b].shape == own.shape
            torch.testing.assert_close(logits[b], own, rtol=1e-4, atol=1e-4)
            assert logits[b].argmax(-1).tolist() == own.argmax(-1).tolist()
            for layer, mine in zip(alone.layers, cache.layers):
                torch.testing.assert_close(mine._k[b, :, starts[b] : len(prompt) + starts[b]], layer._k[0, :, : len(prompt)],
                                           rtol=1e-4, atol=1e-4)


def test_the_choice_tries_both_ways_then_keeps_the_cheaper_and_re_tries_the_other():
    choice = PrefillChoice(prior=False)
    assert choice.together(1) is False and choice.together(4) is False  # nothing timed: the prior
    choice.record(False, ms=100.0, tokens=100)
    assert choice.together(4) is True  # together never timed: try it
    choice.record(True, ms=60.0, tokens=100)
    picks = [choice.together(4) for _ in range(2 * PrefillChoice.PROBE_EVERY)]
    assert picks.count(False) == 2 and picks.count(True) == len(picks) - 2  # the cheaper, and a re-try per 16
    for _ in range(20):
        choice.record(True, ms=300.0, tokens=100)  # together got slower (load, longer prompts): it loses
    assert choice.together(4) is False
    fixed = PrefillChoice(prior=True, learn=False)
    fixed.record(True, ms=1e6, tokens=1)
    assert all(fixed.together(3) for _ in range(40)) and fixed.together(1) is False
