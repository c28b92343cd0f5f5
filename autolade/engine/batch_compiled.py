"""A compiled batched step: every row's tree and window in one ``torch.compile``d forward of dynamic shape.

One graph runs every step of every batch: rows B, width K and the cache's columns are symbols, not constants
(``BatchKVCache(fixed=True)`` writes at a tensor pointer and hands attention the columns up to a ruler's
length). So rows joining and leaving, a new width or a longer cache never recompile. On a CPU the weights are
frozen into the graph (``compiled.compile_options``): a graph holds its own copy of them, which is why there is
one graph and not one per shape. A dimension of one would be a graph of its own (dynamo specializes sizes 0 and
1), so a step one token wide gets a padding token and a lone row runs with the cache's spare row.

    pad to >= 2 columns and >= 2 rows -> arm the cache at its length -> compiled forward [B', K', V] -> slice [B, K]

The prefill stays eager (``batch_prefill``): it runs once per prompt, at its own length.
"""

from __future__ import annotations

import time

import torch
import torch._inductor.config
import torch.fx.experimental._config as fx_config
from torch._dynamo.utils import counters

from .attention import AttentionPlan
from .batch_cache import SPARE, BatchKVCache
from .compiled import MIN_DYNAMIC, CompileLog, compile_options, widen_mask
from .decode import ModelRunner


class CompiledBatchRunner(ModelRunner):
    """A ``ModelRunner`` whose batched steps run compiled on a ``BatchKVCache(fixed=True)``. One per model:
    its graph is reused by every batch (``compiling.CompiledRunners.batch``). ``mode``/``backend``: as
    ``compiled.CompiledRunner``'s, less CUDA graphs (a graph of dynamic shape cannot be captured)."""

    def __init__(self, model: torch.nn.Module, *, mode: str = "default", backend: str = "inductor",
                 attention: AttentionPlan | None = None) -> None:
        super().__init__(model, attention=attention)
        self.mode = mode
        self.options = compile_options(self.device, mode, backend) or {}  # read while dynamo traces (see compiled.py)
        self.log = CompileLog()  # keyed by width 0: one graph for all shapes
        self._step = torch.compile(self._forward, dynamic=None, mode=mode, backend=backend)

    def new_batch_cache(self, capacity: int) -> BatchKVCache:
        return BatchKVCache(num_layers=self.num_layers, capacity=capacity, device=self.device, fixed=True)

    def step_tokens(self, rows: int, width: int) -> int:
        """A step narrower than two columns or rows runs padded to two (one graph for every shape): a width-1
        step costs what a width-2 one does, so the step budget may fill the second column for nothing."""
        return max(rows, SPARE) * max(width, MIN_DYNAMIC)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask, hf_cache) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, logits_to_keep=0,
                         **{self.cache_kw: hf_cache})
        return out.logits  # [B', K', V]

    def rows_forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, *, mask=None,
                     keep: torch.Tensor | int = 1, kind: str = "packed") -> torch.Tensor:
        if kind == "prefill" or not getattr(cache, "fixed", False):
            return super().rows_forward(ids, positions, cache, mask=mask, keep=keep, kind=kind)
        rows, k = ids.shape  # [B, K]
        width = max(k, MIN_DYNAMIC)
        base = cache.length
        if width > k:  # a padding column: the row's last token again, seeing only itself, never kept
            ids = torch.cat([ids, ids[:, -1:].expand(rows, width - k)], dim=1)  # [B, width]
            positions = torch.cat([positions, positions[:, -1:].expand(rows, width - k)], dim=1)
            mask = _map(mask, lambda m: widen_mask(m, width))
        if rows < SPARE:  # the cache's spare row runs as a copy of row 0 (its outputs and columns are never read)
            ids, positions = _rows(ids, SPARE), _rows(positions, SPARE)
            mask = _map(mask, lambda m: _rows(m, SPARE))
        cache.reserve(width + 1)  # the ruler stays shorter than the buffers: one graph for every length
        cache.at(base, width)
        for x in (ids, positions):
            torch._dynamo.maybe_mark_dynamic(x, 0)
            torch._dynamo.maybe_mark_dynamic(x, 1)
        for m in _masks(mask):
            for dim in (0, 2, 3):
                torch._dynamo.maybe_mark_dynamic(m, dim)
        for layer in cache.layers:
            for buf in (layer._k, layer._v):
                torch._dynamo.maybe_mark_dynamic(buf, 0)
                torch._dynamo.maybe_mark_dynamic(buf, 2)
        self.attention.use("packed")
        frames = counters["frames"]["ok"]
        t0 = time.perf_counter()
        # no duck shapes: rows and width equal at the first trace must not become one symbol (and a recompile later)
        with torch._inductor.config.patch(**self.options), fx_config.patch(use_duck_shape=False):
            logits = self._step(ids, positions, mask, cache.hf)[:rows, :k]  # [B, K, V]
        self.log.record(0, seconds=time.perf_counter() - t0, compiled=counters["frames"]["ok"] != frames)
        for layer in cache.layers:
            layer.truncate(base + width)  # as an eager forward of ``width`` columns would leave it
        if isinstance(keep, int):  # as logits_to_keep: the last ``keep`` columns, 0 = all
            return logits if keep == 0 else logits[:, -keep:]
        return logits[:, keep]


def _rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with copies of its row 0 appended up to ``rows`` rows."""
    return torch.cat([x, x[:1].expand(rows - x.shape[0], *x.shape[1:])])


def _map(mask, fn):
    if mask is None:
        raise ValueError("a compiled batched step needs its mask (the batch decoder always builds one)")
    return {name: fn(m) for name, m in mask.items()} if isinstance(mask, dict) else fn(mask)


def _masks(mask) -> list[torch.Tensor]:
    return list(mask.values()) if isinstance(mask, dict) else [mask]
