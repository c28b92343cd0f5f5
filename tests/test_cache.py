import torch

from autolade.engine.cache import KVCache


def _kv(n, start=0.0):
    x = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1) + start
    return x.expand(1, 2, n, 3).contiguous()


def test_append_keep_and_truncate():
    cache = KVCache(num_layers=2, capacity=8)
    for layer in cache.layers:
        layer.update(_kv(3), _kv(3))
    assert cache.length == 3
    for layer in cache.layers:
        layer.update(_kv(4, 100.0), _kv(4, 100.0))  # packed rows 100..103 at 3..6
    cache.keep(3, [0, 2, 3])  # keep rows 100, 102, 103
    assert cache.length == 6
    keys = cache.layers[1].keys[0, 0, :, 0].tolist()
    assert keys == [0, 1, 2, 100, 102, 103]
    cache.truncate(2)
    assert cache.layers[0].keys.shape[2] == 2 and cache.hf.get_seq_length() == 2


def test_keep_contiguous_prefix_is_a_length_move_and_growth_keeps_rows():
    cache = KVCache(num_layers=1, capacity=4)
    layer = cache.layers[0]
    layer.update(_kv(3), _kv(3))
    buf = layer._k
    layer.update(_kv(3, 50.0), _kv(3, 50.0))  # beyond capacity: grows
    assert layer.capacity >= 6 and layer._k is not buf
    cache.keep(3, [0, 1])
    assert layer.keys[0, 0, :, 0].tolist() == [0, 1, 2, 50, 51]
    layer.crop(-2)
    assert cache.length == 3
