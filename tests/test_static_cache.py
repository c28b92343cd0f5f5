"""The static KV cache of the compiled step: eager appends for the prefill, writes at a pointer for a step,
fixed buffers for life, rollback by length."""

import pytest
import torch

from autolade.engine.static_cache import StaticKVCache


def rows(n: int, start: float = 0.0) -> torch.Tensor:
    """[1, H=2, n, D=3] keys whose value says which row they are."""
    return (torch.arange(n, dtype=torch.float32) + start).view(1, 1, n, 1).expand(1, 2, n, 3).clone()


def test_prefill_appends_and_refuses_to_grow():
    cache = StaticKVCache(num_layers=2, capacity=8, device=torch.device("cpu"))
    layer = cache.layers[0]
    k, v = layer.update(rows(5), rows(5))
    assert k.shape == (1, 2, 5, 3) and cache.layers[0].length == 5  # eager: the model sees the first rows only
    assert torch.equal(layer._k[:, :, 5:], torch.zeros(1, 2, 3, 3))  # the rest is zeros, never garbage
    with pytest.raises(ValueError, match="static cache full"):
        layer.update(rows(4), rows(4))
    assert layer._k.shape[2] == 8  # a fixed buffer never reallocates


def test_step_writes_at_the_pointer_and_hands_the_whole_buffer():
    cache = StaticKVCache(num_layers=2, capacity=8, device=torch.device("cpu"))
    for layer in cache.layers:
        layer.update(rows(3), rows(3))
    buffer = cache.layers[0]._k
    cache.at(3, 4)  # a step of 4 rows written at 3
    assert int(cache.pointer) == 3
    for layer in cache.layers:
        k, v = layer.update(rows(4, start=10.0), rows(4, start=10.0))
        assert k.shape == (1, 2, 8, 3) and k.data_ptr() == layer._k.data_ptr()
    assert cache.layers[0]._k is buffer  # same buffer, same address: what a captured graph replays on
    assert cache.layers[1]._k[0, 0, :, 0].tolist() == [0, 1, 2, 10, 11, 12, 13, 0]
    cache.eager()
    cache.advance(3 + 4)
    assert cache.length == 7 and cache.layers[1].keys.shape[2] == 7
    cache.keep(3, [0, 2])  # accept rows 0 and 2 of the step: compacted, then a length move
    assert cache.length == 5 and cache.layers[1].keys[0, 0, :, 0].tolist() == [0, 1, 2, 10, 12]


def test_a_step_past_the_capacity_is_refused():
    cache = StaticKVCache(num_layers=1, capacity=8, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="capacity 8"):
        cache.at(5, 4)
