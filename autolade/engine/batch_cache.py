"""The KV cache of a batch: B rows share one column count, each row sees only its own columns.

Rows accept different numbers of tokens per step, so after a step row b holds its accepted tokens
at columns ``base .. base + n_b - 1`` and the columns up to the widest row's are **holes**: masked
out for that row (``visible[b, c]`` false), never copied away until rows leave (``select`` compacts).
Each column keeps the position its keys were rotated at (``positions[b, c]``), which is what a
sliding-window layer needs to decide what a query may see. Attention is order-free over keys, so
a row's columns need not be contiguous: only the mask and the positions matter.

Built on ``cache.BufferLayer`` (transformers' public ``Cache``/``DynamicLayer``, no patching). ``fixed=True``: the
layers of a compiled step (``static_cache.FixedLayer``): each writes the step's columns at a tensor ``pointer`` and
hands attention the columns up to the ``ruler``'s length, so a new length, width or row count is data, not a new
graph; its buffers keep at least two rows (a lone row has a spare one, ``SPARE``) since a dimension of one would be
a graph of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache

from .cache import BufferLayer, KVCache
from .static_cache import FixedLayer, make_ruler

SPARE = 2  # a fixed cache's buffers hold at least this many rows (the ones past ``rows`` are never read back)


class BatchKVCache:
    """B rows' keys/values in [B, H, cap, D] buffers per layer, ``length`` columns in use."""

    def __init__(self, *, num_layers: int, capacity: int, device: torch.device, fixed: bool = False) -> None:
        self.capacity = capacity
        self.device = device
        self.fixed = fixed
        self.pointer = torch.zeros((), dtype=torch.long, device=device)  # a fixed layer's write column
        self.layers = [FixedLayer(capacity, self.pointer) if fixed else BufferLayer(capacity) for _ in range(num_layers)]
        for layer in self.layers if fixed else ():
            layer.full = True  # a fixed layer only ever sees steps (prompts are prefilled elsewhere and joined)
        self.hf = Cache(layers=self.layers)  # what the model's forward receives
        self.visible = torch.zeros((0, capacity), dtype=torch.bool, device=device)  # [B, cap]: row b sees column c
        self.positions = torch.zeros((0, capacity), dtype=torch.long, device=device)  # [B, cap]: the column's position

    @property
    def rows(self) -> int:
        return int(self.visible.shape[0])

    @property
    def length(self) -> int:
        return self.layers[0].length

    def reserve(self, n: int) -> None:
        """Room for ``n`` more columns (a step appends its packed width before ``keep``)."""
        need = self.length + n
        if need <= self.capacity:
            return
        capacity = max(need, 2 * self.capacity)
        for layer in self.layers:
            if layer.is_initialized:
                layer._grow(capacity)
            layer.capacity = capacity
        self.visible = _widen(self.visible, capacity)
        self.positions = _widen(self.positions, capacity)
        self.capacity = capacity

    def at(self, base: int, width: int) -> None:
        """Arm a fixed cache for a step of ``width`` columns written at ``base`` (``reserve`` first)."""
        if base + width > self.capacity:
            raise ValueError(f"batch cache full: a step of {width} columns at {base} > capacity {self.capacity}")
        self.pointer.fill_(base)
        ruler = make_ruler(base + width, self.device)
        for layer in self.layers:
            layer.ruler = ruler

    def keep(self, base: int, kept: Sequence[Sequence[int]], first_positions: Sequence[int]) -> None:
        """After a packed step appended its columns at ``base``: row b keeps packed indices ``kept[b]``
        (ascending; an accepted path from the step's first token, so positions ``first_positions[b]``,
        +1, ...) at columns base, base+1, ...; the rest are dropped. The new length is the widest row's."""
        widest = max((len(k) for k in kept), default=0)
        b = self.rows
        if any(list(k) != list(range(len(k))) for k in kept):  # some row keeps a branch off the front: gather
            src = torch.full((b, widest), base, dtype=torch.long)
            for row, k in enumerate(kept):
                src[row, : len(k)] = torch.tensor(k, dtype=torch.long) + base
            src = src.to(self.device)
            for layer in self.layers:
                for name in ("_k", "_v"):
                    buf = getattr(layer, name)  # [B, H, cap, D]
                    idx = src[:, None, :, None].expand(b, buf.shape[1], widest, buf.shape[3])
                    buf[:b, :, base : base + widest] = buf[:b].gather(2, idx)  # a spare row past b is left as it is
        counts = torch.tensor([len(k) for k in kept], device=self.device)  # [B]
        cols = torch.arange(widest, device=self.device)  # [widest]
        self.visible[:, base : base + widest] = cols[None, :] < counts[:, None]
        self.positions[:, base : base + widest] = torch.tensor(list(first_positions), device=self.device)[:, None] + cols
        self.truncate(base + widest)

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order), then move each row's visible columns to the front, so
        that the holes the others left cost nothing in later steps."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        visible, positions = self.visible[index], self.positions[index]
        spare = self._spare(len(rows))
        index_b = torch.cat([index, index[:1].expand(spare)]) if spare else index  # buffer rows: a spare copies row 0
        count = visible[:, : self.length].sum(1)  # [B']
        width = int(count.max()) if len(rows) else 0
        # order each row's columns visible-first, stably: its i-th visible column goes to column i
        order = torch.sort((~visible[:, : self.length]).to(torch.int8), dim=1, stable=True).indices[:, :width]  # [B', width]
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            for name in ("_k", "_v"):
                buf = getattr(layer, name)[index_b]  # [B' (+ spare), H, cap, D]
                idx = order[:, None, :, None].expand(len(rows), buf.shape[1], width, buf.shape[3])
                buf[: len(rows), :, :width] = buf[: len(rows)].gather(2, idx)
                setattr(layer, name, buf)
        cols = torch.arange(width, device=self.device)
        self.visible = torch.zeros((len(rows), self.capacity), dtype=torch.bool, device=self.device)
        self.visible[:, :width] = cols[None, :] < count[:, None]
        kept_positions = positions.gather(1, order) if width else positions[:, :0]
        self.positions = torch.zeros((len(rows), self.capacity), dtype=torch.long, device=self.device)
        self.positions[:, :width] = kept_positions
        self.truncate(width)

    def join(self, new: KVCache, *, starts: Sequence[int] = (0,), rows: Sequence[int] | None = None) -> None:
        """Append rows of ``new``, prompts prefilled together (``batch_prefill``) or one alone: row r's
        prompt at its columns ``starts[r] .. new.length - 1``, positions 0, 1, ... ``rows``: which of its
        rows join (None: all). Rows already here see holes where the new prompts are longer."""
        rows = list(range(len(starts))) if rows is None else list(rows)
        if not rows:
            return
        t, before = new.length, self.length
        length = max(before, t)
        self.reserve(max(length - before, 0))
        index = torch.tensor(rows, dtype=torch.long)
        for layer, src_layer in zip(self.layers, new.layers):
            for name in ("_k", "_v"):
                src = getattr(src_layer, name)[index.to(getattr(src_layer, name).device)]  # [r, H, cap1, D]
                if not layer.is_initialized:
                    layer.device = src.device
                    setattr(layer, name, src.new_zeros((0, src.shape[1], self.capacity, src.shape[3])))
                buf = getattr(layer, name)
                # the rows here get holes where the new prompts are longer: masked, but never left unwritten
                # (a masked NaN still poisons: its weight is 0, and 0 x NaN is NaN)
                buf[:, :, before:length] = 0
                block = src.new_zeros((len(rows), src.shape[1], self.capacity, src.shape[3]))
                block[:, :, :t] = src[:, :, :t]
                joined = torch.cat([buf[: self.rows], block], dim=0)  # a spare row goes: the new rows take its place
                spare = self._spare(joined.shape[0])
                setattr(layer, name, torch.cat([joined, joined[:1].expand(spare, -1, -1, -1)]) if spare else joined)
            layer.is_initialized = True
        cols = torch.arange(self.capacity, device=self.device)  # [cap]
        first = torch.tensor([starts[r] for r in rows], device=self.device)[:, None]  # [r, 1]
        visible = (cols[None, :] >= first) & (cols[None, :] < t)  # [r, cap]
        positions = torch.where(visible, cols[None, :] - first, 0)
        self.visible = torch.cat([self.visible, visible])
        self.positions = torch.cat([self.positions, positions])
        self.truncate(length)

    def _spare(self, rows: int) -> int:
        """Spare buffer rows a fixed cache of ``rows`` rows keeps (see ``SPARE``)."""
        return max(SPARE - rows, 0) if self.fixed and rows else 0


def _widen(table: torch.Tensor, capacity: int) -> torch.Tensor:
    out = table.new_zeros((table.shape[0], capacity))
    out[:, : table.shape[1]] = table
    return out
