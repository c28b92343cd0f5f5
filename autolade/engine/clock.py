"""One clock for every timer that feeds a decision: it reads finished work.

CUDA kernels run asynchronously: a ``perf_counter`` read right after a forward returns measures the
launch, not the work. ``DeviceClock.now()`` synchronises a CUDA device *before* reading the clock,
so a difference of two readings covers every kernel queued between them. On a CPU it is
``time.perf_counter`` and nothing else (the CPU path is unchanged).

The step loop (step and forward times, which the adaptive and cost-aware policies read), the step
curve, ``harness.Timer`` (bench, tune) and ``generate()``'s wall time all read one of these.
``now`` and ``sync`` are parameters, so tests check the order (sync, then read) with a fake clock
and a stand-in for ``torch.cuda.synchronize`` on a machine without CUDA.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def cuda_synchronize(device: torch.device) -> None:
    torch.cuda.synchronize(device)


@dataclass(frozen=True)
class DeviceClock:
    """Seconds, read after the device has finished what was queued (CUDA), or plainly (CPU)."""

    device: torch.device | str = "cpu"  # whose queued work a reading waits for
    now_fn: Callable[[], float] = time.perf_counter  # the clock, in seconds
    sync: Callable[[torch.device], None] = cuda_synchronize  # waits for the device; called only on CUDA
    cuda: bool = field(init=False, default=False)  # whether readings synchronise

    def __post_init__(self) -> None:
        device = torch.device(self.device)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "cuda", device.type == "cuda")

    def now(self) -> float:
        """The clock after the device's queued work has finished."""
        if self.cuda:
            self.sync(self.device)
        return self.now_fn()

    def since(self, start: float) -> float:
        """Seconds from ``start`` (an earlier ``now()``) to now, the work between them finished."""
        return self.now() - start
