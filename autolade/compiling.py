"""``generate(compile=...)``: one compiled runner per (model, capacity class, buckets), kept while the model lives.

A compiled step's graphs depend on the bucket width and the static cache's capacity only; keeping the runner
per model means a warm-up is paid once per model and bucket, and a new prompt length never recompiles.
Capacities come in powers of two (at least ``MIN_CAPACITY``), so prompts of any length share a few of them.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.batch_compiled import CompiledBatchRunner
from autolade.engine.compiled import CompiledRunner, buckets_for, default_buckets, static_capacity
from autolade.errors import ConfigError


class CompiledRunners:
    """The compiled runners of live models (a model that is garbage collected takes its graphs with it)."""

    def __init__(self) -> None:
        self._runners: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, CompiledRunner]] = weakref.WeakKeyDictionary()
        self._batch: weakref.WeakKeyDictionary[torch.nn.Module, CompiledBatchRunner] = weakref.WeakKeyDictionary()

    def get(self, model: torch.nn.Module, *, tokens: int, config: LookaheadConfig,
            buckets: tuple[int, ...] | None = None) -> CompiledRunner:
        """The runner for a decode of ``tokens`` (prompt + new tokens) with ``config``."""
        widths = buckets_for(config.packed_size(), buckets or default_buckets(next(model.parameters()).device))
        capacity = static_capacity(tokens + widths[-1] + 8)  # the last step writes a whole bucket past the text
        key = (capacity, widths)
        runners = self._runners.setdefault(model, {})
        if key not in runners:
            runners[key] = CompiledRunner(model, capacity=capacity, buckets=widths)
        return runners[key]

    def of(self, model: torch.nn.Module) -> list[CompiledRunner]:
        return list(self._runners.get(model, {}).values())

    def batch(self, model: torch.nn.Module) -> CompiledBatchRunner:
        """The runner of ``model``'s batched steps: one graph for every batch (rows, width and length are dynamic)."""
        if model not in self._batch:
            self._batch[model] = CompiledBatchRunner(model)
        return self._batch[model]


@functools.cache
def default_runners() -> CompiledRunners:
    """The process's compiled runners: generate() and bench share their graphs."""
    return CompiledRunners()


def check_compile(compile: Any) -> bool | None:
    if compile is not None and not isinstance(compile, bool):
        raise ConfigError(f"compile must be True, False or None (this machine's stored curves decide), got {compile!r}")
    return compile


def compile_summary(runner: CompiledRunner | CompiledBatchRunner, warm_before: float) -> dict[str, Any]:
    """What ``res.stats.compiled`` says: the buckets, the capacity, the graphs so far and this call's warm-up
    (a batch's runner: one graph of dynamic rows, width and length, so no buckets and no capacity)."""
    log = runner.log
    if isinstance(runner, CompiledBatchRunner):
        return {"mode": runner.mode, "batched": True, "dynamic": True, "graphs": log.compiles,
                "steps": sum(log.calls.values()), "warmup_s": round(log.warmup_total_s - warm_before, 3)}
    return {"mode": runner.mode, "capacity": runner.capacity, "buckets": list(runner.buckets), "dynamic": runner.dynamic,
            "graphs": log.compiles, "steps_per_bucket": dict(log.calls),
            "warmup_s": round(log.warmup_total_s - warm_before, 3)}
