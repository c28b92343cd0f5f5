"""A preallocated KV cache with an explicit length: append writes in place, rollback moves the pointer.

Built from transformers' public ``Cache``/``DynamicLayer`` classes (no patching): each layer
owns [B, H, capacity, D] buffers and hands the model views of its first ``length`` rows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class BufferLayer(DynamicLayer):
    """One layer's keys/values in a fixed buffer; ``length`` is the committed size."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self._k = key_states.new_empty((b, h, self.capacity, d))  # [B, H, cap, D]
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.capacity:
            self._grow(max(end, 2 * self.capacity))
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def _grow(self, capacity: int) -> None:
        """Rare: a policy packed more than the first estimate; reallocate and copy the committed rows."""
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:2], capacity, old.shape[-1]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = capacity

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.truncate(self.length + tokens_to_remove)

    def truncate(self, length: int) -> None:
        self.length = length
        if self.is_initialized:
            self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

    def reset(self) -> None:
        self.truncate(0)


class KVCache:
    """The engine's view of the cache: ``length``, ``keep`` (accept a path) and ``truncate``."""

    def __init__(self, *, num_layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.layers = self.new_layers(num_layers, capacity)
        self.hf = Cache(layers=self.layers)  # what the model's forward receives

    def new_layers(self, num_layers: int, capacity: int) -> list[BufferLayer]:
        return [BufferLayer(capacity) for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def keep(self, base: int, packed_indices: list[int]) -> None:
        """After a packed step appended k rows at ``base``: keep rows base+i for i in packed_indices
        (ascending, i >= their rank) at base, base+1, ... and drop the rest."""
        n = len(packed_indices)
        if packed_indices != list(range(n)):  # contiguous from the start: a pure length move
            src = torch.tensor(packed_indices, device=self.layers[0].device) + base
            for layer in self.layers:
                layer._k[:, :, base : base + n] = layer._k[:, :, src]
                layer._v[:, :, base : base + n] = layer._v[:, :, src]
        self.truncate(base + n)

    def reset(self) -> None:
        self.truncate(0)
