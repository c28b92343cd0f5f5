"""Left-padded batches and rows back out of a padded output (autolade/bench/padding.py)."""

import torch

from autolade.bench.padding import new_rows, padded


def test_rows_are_left_padded_with_a_mask_of_their_real_tokens():
    ids, mask = padded([torch.tensor([[5, 6, 7]]), torch.tensor([[8]])], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_new_rows_end_at_the_first_eos_kept_and_drop_what_follows():
    seq = torch.tensor([[1, 2, 9, 3, 4, 0], [0, 1, 3, 9, 0, 0], [1, 1, 3, 4, 5, 6]])  # prompts of width 2
    assert new_rows(seq, 2, eos=[9]) == [[9], [3, 9], [3, 4, 5, 6]]
