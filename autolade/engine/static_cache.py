"""A KV cache of fixed capacity for compiled steps: every buffer keeps its address and shape for life.

The prefill runs eager and appends like ``KVCache`` (the model sees the first ``length`` rows). A compiled step
switches the layers to ``full``: each writes its k new rows at ``pointer`` (a 0-d tensor, so a new length is
data, not a new graph) and hands attention the whole buffer [1, H, capacity, D]; the step's mask hides every
column past the prefix and the step's own rows. Rollback is still a length move (``KVCache.keep``).
"""

from __future__ import annotations

import torch

from .cache import BufferLayer, KVCache


class FixedLayer(BufferLayer):
    """A ``BufferLayer`` that never grows and, when ``full``, writes at the shared ``pointer``."""

    is_compileable = True

    def __init__(self, capacity: int, pointer: torch.Tensor) -> None:
        super().__init__(capacity)
        self.pointer = pointer  # 0-d long: where a full-mode update writes (shared by all layers)
        self.full = False  # False: eager append (prefill); True: write at pointer, return the whole buffer
        # None: a full-mode update hands attention the whole capacity (CUDA graphs need one shape); a tensor: only
        # its first ``ruler.shape[0]`` columns (the prefix and the step), a size a dynamic-shape graph reads as a symbol
        self.ruler: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        # zeros, not empty: a masked column still multiplies its value by 0, and 0 x NaN garbage is NaN
        self._k.zero_()
        self._v.zero_()
        if not torch.compiler.is_compiling() and self._k.device.type == "cuda":
            # CUDA graphs replay on these very buffers. Not on a CPU: with inductor's weight freezing there, a
            # static-address tensor is folded into the graph as a constant, and the cache with it
            torch._dynamo.mark_static_address(self._k)
            torch._dynamo.mark_static_address(self._v)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if not self.full:
            if self.length + key_states.shape[-2] > self.capacity:
                raise ValueError(f"static cache full: {self.length} + {key_states.shape[-2]} rows > {self.capacity}")
            return super().update(key_states, value_states)
        at = torch.arange(key_states.shape[-2], device=self._k.device) + self.pointer  # [k]
        self._k.index_copy_(2, at, key_states)
        self._v.index_copy_(2, at, value_states)
        if self.ruler is None:
            return self._k, self._v  # [B, H, capacity, D]
        end = self.ruler.shape[0]
        return self._k[:, :, :end], self._v[:, :, :end]  # [B, H, base + k, D]


def make_ruler(length: int, device: torch.device) -> torch.Tensor:
    """A tensor whose length (a dynamic dim) says how many columns a ``FixedLayer`` hands attention."""
    out = torch.empty(length, dtype=torch.int8, device=device)
    torch._dynamo.maybe_mark_dynamic(out, 0)
    return out


class StaticKVCache(KVCache):
    """``KVCache`` on ``FixedLayer``s; ``at(base)`` arms a compiled step that writes its rows at ``base``."""

    def __init__(self, *, num_layers: int, capacity: int, device: torch.device) -> None:
        self.pointer = torch.zeros((), dtype=torch.long, device=device)
        super().__init__(num_layers=num_layers, capacity=capacity)
        if device.type == "cuda":  # as the buffers (``FixedLayer.lazy_initialization``)
            torch._dynamo.mark_static_address(self.pointer)

    def new_layers(self, num_layers: int, capacity: int) -> list[BufferLayer]:
        return [FixedLayer(capacity, self.pointer) for _ in range(num_layers)]

    def eager(self) -> None:
        """Back to appending (a prefill)."""
        for layer in self.layers:
            layer.full = False

    def at(self, base: int, rows: int, *, ruler: bool = False) -> None:
        """The next forward is a compiled step of ``rows`` rows written at ``base``; ``ruler``: attention gets
        the first ``base + rows`` columns only (a dynamic graph), else the whole capacity."""
        if base + rows > self.capacity:
            raise ValueError(f"static cache full: a step of {rows} rows at {base} > capacity {self.capacity}")
        self.pointer.fill_(base)
        seen = make_ruler(base + rows, self.pointer.device) if ruler else None
        for layer in self.layers:
            layer.full = True
            layer.ruler = seen

    def advance(self, length: int) -> None:
        """After a compiled step: the first ``length`` rows count (what an eager append would have left)."""
        self.truncate(length)
