"""The batch KV cache: per-row columns, holes masked and written, compaction when rows leave."""

import pytest
import torch

from autolade.engine.batch_cache import BatchKVCache
from autolade.engine.cache import KVCache

H, D = 2, 3


def single(values: list[float]) -> KVCache:
    """A one-row cache whose column i holds keys = values[i] and values = -values[i]."""
    cache = KVCache(num_layers=1, capacity=len(values) + 1)
    k = torch.tensor(values).view(1, 1, -1, 1).expand(1, H, -1, D).clone()
    cache.layers[0].update(k, -k)
    return cache


def column(cache: BatchKVCache, row: int) -> list[float]:
    return cache.layers[0]._k[row, 0, : cache.length, 0].tolist()


def test_join_aligns_prompts_and_masks_the_shorter_rows_holes():
    cache = BatchKVCache(num_layers=1, capacity=2, device=torch.device("cpu"))
    cache.join(single([1.0, 2.0]))
    cache.layers[0]._k[:, :, 2:] = float("nan")  # garbage past the length, as an uninitialised buffer may hold
    cache.join(single([5.0, 6.0, 7.0, 8.0]))
    assert cache.rows == 2 and cache.length == 4 and cache.capacity >= 4
    assert cache.visible[:, :4].tolist() == [[True, True, False, False], [True, True, True, True]]
    assert cache.positions[1, :4].tolist() == [0, 1, 2, 3]
    assert not torch.isnan(cache.layers[0]._k[:, :, :4]).any(), "a masked hole must not hold NaN"
    assert column(cache, 1) == [5.0, 6.0, 7.0, 8.0]


def test_keep_moves_each_rows_path_to_the_front_and_widest_sets_the_length():
    cache = BatchKVCache(num_layers=1, capacity=8, device=torch.device("cpu"))
    cache.join(single([1.0, 2.0]))
    cache.join(single([3.0, 4.0]))
    cache.reserve(4)
    step = torch.tensor([[10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0]]).view(2, 1, 4, 1).expand(2, H, 4, D).clone()
    cache.layers[0].update(step, -step)  # what the forward appends: 4 packed tokens per row
    cache.keep(2, [[0, 2], [0, 1, 3]], [2, 2])
    assert cache.length == 5
    assert column(cache, 0)[2:4] == [10.0, 12.0] and column(cache, 1)[2:5] == [20.0, 21.0, 23.0]
    assert cache.layers[0]._v[1, 1, 2:5, 2].tolist() == [-20.0, -21.0, -23.0]
    assert cache.visible[:, :5].tolist() == [[True, True, True, True, False], [True] * 5]
    assert cache.positions[:, 2:5].tolist() == [[2, 3, 4], [2, 3, 4]]


def test_select_drops_rows_and_compacts_the_holes_away():
    cache = BatchKVCache(num_layers=1, capacity=4, device=torch.device("cpu"))
    cache.join(single([1.0]))
    cache.join(single([2.0, 3.0, 4.0, 5.0, 6.0]))
    cache.join(single([7.0, 8.0]))
    cache.select([2, 0])  # the long row leaves
    assert cache.rows == 2 and cache.length == 2
    assert column(cache, 0) == [7.0, 8.0] and column(cache, 1)[:1] == [1.0]
    assert cache.visible[:, :2].tolist() == [[True, True], [True, False]]
    assert cache.positions[0, :2].tolist() == [0, 1]
    assert cache.layers[0].keys.shape == (2, H, 2, D)  # the model sees the compacted columns


def test_join_takes_left_padded_rows_prefilled_together_and_skips_rows_that_ended():
    cache = BatchKVCache(num_layers=1, capacity=4, device=torch.device("cpu"))
    cache.join(single([1.0, 2.0]))
    together = KVCache(num_layers=1, capacity=4)
    k = torch.tensor([[0.0, 0.0, 5.0], [0.0, 6.0, 7.0], [8.0, 9.0, 10.0]]).view(3, 1, 3, 1).expand(3, H, 3, D).clone()
    together.layers[0].update(k, -k)
    cache.join(together, starts=[2, 1, 0], rows=[0, 2])  # row 1 ended at its first token: it never joins
    assert cache.rows == 3 and cache.length == 3
    assert cache.visible[:, :3].tolist() == [[True, True, False], [False, False, True], [True, True, True]]
    assert cache.positions[1, :3].tolist() == [0, 0, 0] and cache.positions[2, :3].tolist() == [0, 1, 2]
    assert column(cache, 1)[2] == 5.0 and column(cache, 2) == [8.0, 9.0, 10.0]
    assert cache.layers[0]._v[2, 0, :3, 0].tolist() == [-8.0, -9.0, -10.0]


def test_a_fixed_cache_writes_at_its_pointer_and_keeps_a_spare_row_for_a_lone_one():
    cache = BatchKVCache(num_layers=1, capacity=8, device=torch.device("cpu"), fixed=True)
    cache.join(single([1.0, 2.0]))
    assert cache.rows == 1 and cache.layers[0]._k.shape[0] == 2, "a lone row gets a spare buffer row"
    cache.join(single([3.0, 4.0, 5.0]))
    assert cache.rows == 2 and cache.layers[0]._k.shape[0] == 2, "a row that joins takes the spare's place"
    assert column(cache, 0)[:2] == [1.0, 2.0] and column(cache, 1) == [3.0, 4.0, 5.0]
    cache.reserve(2)
    cache.at(3, 2)
    step = torch.tensor([[10.0, 11.0], [20.0, 21.0]]).view(2, 1, 2, 1).expand(2, H, 2, D).clone()
    keys, _ = cache.layers[0].update(step, -step)  # what a compiled forward does: write at the pointer
    assert keys.shape == (2, H, 5, D), "attention sees the columns up to the ruler: the prefix and the step"
    assert keys[:, 0, 3:, 0].tolist() == [[10.0, 11.0], [20.0, 21.0]]
    cache.keep(3, [[0], [0, 1]], [2, 3])
    cache.select([1])  # row 0 leaves: row 1 alone, with a spare again
    assert cache.rows == 1 and cache.layers[0]._k.shape[0] == 2
    assert column(cache, 0) == [3.0, 4.0, 5.0, 20.0, 21.0] and cache.visible[0, :5].all()
    with pytest.raises(ValueError, match="batch cache full"):
        cache.at(cache.capacity - 1, 2)
