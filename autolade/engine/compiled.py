"""A compiled packed step: a few fixed widths (buckets) on a static KV cache, through ``torch.compile``.

A step of k tokens runs at the smallest bucket >= k: rows k.. are padding (each sees only itself and is
never kept), the mask spans the cache's whole capacity (in a dynamic graph, a CPU's: only the prefix and the
step, a length read off a "ruler" tensor), the write position is a tensor. So a graph depends
on (bucket, capacity) alone: a new prompt length or a new step size within a bucket never recompiles.
On CUDA the mode is "reduce-overhead" (CUDA graphs: one graph per bucket, one launch for the step's ~2,000
kernels). On a CPU the default inductor mode with the weights frozen into the graph (``compile_options``) and
ONE graph of dynamic width (a frozen graph holds its own copy of the weights: a graph per bucket would hold
3 GB each for a 1.5B model in bf16); its buckets are only the widths the stored curve says to pad to.
The prefill stays eager: it runs once per prompt, at its own length.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch._inductor.config
from torch._dynamo.utils import counters

from .attention import AttentionPlan
from .decode import ModelRunner
from .static_cache import StaticKVCache

BUCKETS = (1, 8, 16, 32, 64)  # packed widths a step is padded to; a tree past the last gets the next power of two
# on a CPU, one graph of dynamic width runs every step: the widths a step may be padded to (only where the stored
# compiled curve shows a wider one costs no more, ``records.curve.useful_buckets``); a lone token runs as 2 rows
CPU_WIDTHS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def default_buckets(device: torch.device) -> tuple[int, ...]:
    """The widths a compiled step runs at on ``device`` before any compiled curve was measured."""
    return CPU_WIDTHS if device.type == "cpu" else BUCKETS


MIN_DYNAMIC = 2  # narrowest step of a dynamic-width graph (dynamo gives a width of 1 a graph of its own)
MIN_CAPACITY = 1024  # smallest static cache (tokens): one graph per bucket covers every prompt + answer below it


def static_capacity(tokens: int, minimum: int = MIN_CAPACITY) -> int:
    """A static cache's capacity for ``tokens``: a power of two, at least ``minimum``, so that decodes of many
    lengths share a few capacities (and so a few graphs)."""
    return max(minimum, 1 << (tokens - 1).bit_length())


def bucket_of(k: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``k`` tokens."""
    for b in buckets:
        if b >= k:
            return b
    raise ValueError(f"a step of {k} tokens is wider than the largest bucket {buckets[-1]}")


def buckets_for(packed_size: int, buckets: tuple[int, ...] = BUCKETS) -> tuple[int, ...]:
    """``buckets``, plus the next power of two when a setting can pack more than the largest."""
    top = max(buckets)
    if packed_size <= top:
        return tuple(sorted(buckets))
    return tuple(sorted(buckets)) + (1 << (packed_size - 1).bit_length(),)


@dataclass
class CompileLog:
    """What compiling cost: the first call per bucket (trace + codegen + run) and the graphs made."""

    warmup_s: dict[int, float] = field(default_factory=dict)  # bucket -> seconds of its first call
    calls: dict[int, int] = field(default_factory=dict)  # bucket -> compiled steps run
    graphs: dict[int, int] = field(default_factory=dict)  # bucket -> calls during which dynamo compiled a frame

    def record(self, key: int, *, seconds: float, compiled: bool, first: bool = False) -> None:
        """One compiled call at ``key`` (a bucket, or 0 for a graph of every shape) that took ``seconds``;
        ``compiled``: dynamo built a graph during it; ``first``: count its time as warm-up anyway."""
        if first or compiled:
            self.warmup_s[key] = self.warmup_s.get(key, 0.0) + seconds
        self.calls[key] = self.calls.get(key, 0) + 1
        if compiled:
            self.graphs[key] = self.graphs.get(key, 0) + 1

    @property
    def compiles(self) -> int:
        """Graphs compiled so far: one per bucket used, if nothing recompiled."""
        return sum(self.graphs.values())

    @property
    def warmup_total_s(self) -> float:
        return sum(self.warmup_s.values())


def compile_options(device: torch.device, mode: str, backend: str) -> dict[str, bool] | None:
    """Inductor's options for a step on ``device``. On a CPU in the default mode: ``freezing``, which folds the
    weights into the graph as constants and prepacks them for oneDNN's GEMMs (measured on a Zen 4 EPYC in bf16:
    compiled steps 0.59-0.71x the eager ones for SmolLM2, 0.54-0.88x for the 1.5B Qwen, against 1.0-1.7x without
    freezing; BENCHMARKS.md, "The compiled step pays on a CPU"). The weights
    must not change after the first step: a decoder's never do. Elsewhere: none (the mode alone)."""
    if device.type == "cpu" and mode == "default" and backend == "inductor":
        return {"freezing": True}
    return None


class CompiledRunner(ModelRunner):
    """A ``ModelRunner`` whose non-prefill forwards run compiled at bucket widths on its own static cache.

    One per (model, capacity): its graphs are reused by every decode that fits the capacity. ``mode``:
    torch.compile's mode (default: "reduce-overhead" on CUDA, "default" elsewhere); ``backend`` likewise.
    """

    def __init__(self, model: torch.nn.Module, *, capacity: int, buckets: tuple[int, ...] | None = None,
                 mode: str | None = None, backend: str = "inductor", attention: AttentionPlan | None = None,
                 dynamic: bool | None = None, ruler: bool | None = None) -> None:
        super().__init__(model, attention=attention)
        self.capacity = capacity
        self.buckets = tuple(sorted(set(buckets or default_buckets(self.device))))
        self.cache = StaticKVCache(num_layers=self.num_layers, capacity=capacity, device=self.device)
        self.mode = mode or ("reduce-overhead" if self.device.type == "cuda" else "default")
        self.log = CompileLog()
        # inductor's config for every call: dynamo reads ``freezing`` while tracing (it then keeps the weights as
        # attributes, not graph inputs), so torch.compile's ``options`` (read by inductor alone) would not do
        self.options = compile_options(self.device, self.mode, backend) or {}
        # one graph of dynamic width (None: where the weights are frozen into it, see the module docstring)
        self.dynamic = bool(self.options) if dynamic is None else dynamic
        # attention over the prefix and the step only (a length the dynamic graph reads off a "ruler" tensor), not
        # the whole capacity: with a mask transformers' SDPA repeats the KV heads over every column it gets. None:
        # wherever the graph is dynamic (measured on a Zen 4, SmolLM2 bf16, context 300 of 1024: 0.75-0.86x the step
        # over the whole capacity, BENCHMARKS.md); CUDA graphs need the one shape, so there it stays off
        self.ruler = self.dynamic if ruler is None else ruler
        self._step = torch.compile(self._full_forward, dynamic=None if self.dynamic else False, mode=self.mode, backend=backend)

    def new_cache(self, capacity: int) -> StaticKVCache:
        if capacity > self.capacity:
            raise ValueError(f"this compiled runner holds {self.capacity} tokens; a decode needs {capacity}")
        self.cache.eager()
        self.cache.reset()
        return self.cache

    def _full_forward(self, ids: torch.Tensor, positions: torch.Tensor, mask) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, logits_to_keep=0,
                         **{self.cache_kw: self.cache.hf})
        return out.logits  # [1, bucket, V]

    def rows_forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, *, mask=None,
                     keep: torch.Tensor | int = 1, kind: str = "packed") -> torch.Tensor:
        if kind == "prefill" or cache is not self.cache:
            self.cache.eager()
            return super().rows_forward(ids, positions, cache, mask=mask, keep=keep, kind=kind)
        k = ids.shape[1]
        width = bucket_of(k, self.buckets)
        if self.dynamic:
            width = max(width, MIN_DYNAMIC)  # a width of 1 would be a graph of its own
        base = cache.length
        pad = width - k
        ids_p = torch.cat([ids, ids[:, -1:].expand(1, pad)], dim=1) if pad else ids  # [1, width]
        pos_p = torch.cat([positions, positions[:, -1:].expand(1, pad)], dim=1) if pad else positions
        full = self.static_mask(mask, base=base, positions=positions, width=width)
        self.attention.use("packed")
        cache.at(base, width, ruler=self.ruler)
        first = width not in self.log.warmup_s and not self.dynamic  # a bucket's first call compiles (and records)
        if self.dynamic:
            for x in (ids_p, pos_p):
                torch._dynamo.mark_dynamic(x, 1, min=MIN_DYNAMIC, max=self.capacity)
            for m in full.values() if isinstance(full, dict) else (full,):
                torch._dynamo.mark_dynamic(m, 2, min=MIN_DYNAMIC, max=self.capacity)
                if self.ruler:
                    torch._dynamo.maybe_mark_dynamic(m, 3)
        frames = counters["frames"]["ok"]
        t0 = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=max(64, 2 * len(self.buckets))), \
                torch._inductor.config.patch(**self.options):
            if self.mode == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            logits = self._step(ids_p, pos_p, full)[:, :k]  # [1, k, V]
        self.log.record(width, seconds=time.perf_counter() - t0, compiled=counters["frames"]["ok"] != frames, first=first)
        cache.eager()
        cache.advance(base + k)  # as an eager forward of k rows would leave it
        if self.mode == "reduce-overhead":
            logits = logits.clone()  # the graph's output buffer is overwritten by the next replay
        if isinstance(keep, int):  # as logits_to_keep: the last ``keep`` rows, 0 = all
            return logits if keep == 0 else logits[:, -keep:]
        return logits[:, keep]

    def static_mask(self, mask, *, base: int, positions: torch.Tensor, width: int):
        """The step's mask over the whole capacity: [1, 1, width, capacity], or with the ruler up to the step's end:
        [1, 1, width, base + width] (a dict per layer type with sliding-window layers). ``mask`` is the eager step's
        [1, 1, k, base + k] (None: one causal token)."""
        if mask is None:
            mask = self.single_mask(positions, base)
        span = None if self.ruler else self.capacity  # the columns attention gets (None: base + width)
        if isinstance(mask, dict):
            return {name: widen_mask(m, width, span=span) for name, m in mask.items()}
        return widen_mask(mask, width, span=span)

    def single_mask(self, positions: torch.Tensor, base: int):
        """A one-token step's mask (what transformers builds for it): every earlier column, the sliding
        window's last ones on sliding layers."""
        full = torch.zeros((1, 1, 1, base + 1), dtype=self.dtype, device=self.device)
        if self.sliding_window is None:
            return full
        sliding = full.clone()
        q = int(positions[0, -1])
        sliding[..., : max(q - self.sliding_window + 1, 0)] = torch.finfo(self.dtype).min
        return self.per_layer_type(full, sliding)


def widen_mask(mask: torch.Tensor, width: int, *, span: int | None = None) -> torch.Tensor:
    """A step's mask [B, 1, k, base + k] widened to ``width`` rows over ``span`` columns (None: base + width): each
    padding row sees only its own column, and the real rows see no column past their own."""
    b, _, k, cols = mask.shape
    base = cols - k
    span = base + width if span is None else span
    out = torch.full((b, 1, width, span), torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
    out[:, :, :k, :cols] = mask
    pad = torch.arange(k, width, device=mask.device)
    out[:, 0, pad, base + pad] = 0  # a padding row sees itself only
    return out
