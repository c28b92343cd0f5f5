"""Prefill of rows that join a batch together: one left-padded forward for several prompts.

Rows that arrive together (a batch handed to ``generate``, requests waiting at a step boundary of the
server) were prefilled one by one; a padded forward of n prompts costs far less than n forwards of one
on a CPU or GPU whose step is launch-bound. Row b's prompt sits at columns ``starts[b] .. T - 1`` at
positions 0, 1, ...; the mask [n, 1, T, T] shows each real query its own row's earlier real columns
(and, on sliding-window layers, only those within the window), and each padding query itself alone.
The logits are what the row's own prefill gives up to float noise (the same sums, other kernels'
order), which is the tolerance every batched forward here has.

Rows are grouped (``prefill_groups``) so that padding wastes little and the mask and the kept logits
stay within a memory budget; a row that fits no group with others is prefilled alone, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cache import KVCache
from .layout import additive

PAD_WASTE = 1.25  # a group's padded tokens may be at most this many times its real prompt tokens
ELEMENT_BUDGET = 1 << 26  # a group's mask (n x T x T) and kept logits (n x keep x V) each stay under 64M elements


def prefill_groups(lengths: Sequence[int], keeps: Sequence[int], *, vocab: int) -> list[list[int]]:
    """Indices of ``lengths`` (prompt tokens per row) cut into groups prefilled together: rows sorted by
    length, a group closed when one more row would pad past ``PAD_WASTE`` or pass ``ELEMENT_BUDGET``.
    ``keeps[b]``: the prompt positions whose logits row b needs (the last ``keeps[b]``)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda b: lengths[b]):
        group = groups[-1] + [i] if groups else [i]
        t = max(lengths[b] for b in group)
        n = len(group)
        fits = (n * t <= PAD_WASTE * sum(lengths[b] for b in group) and n * t * t <= ELEMENT_BUDGET
                and n * max(keeps[b] for b in group) * vocab <= ELEMENT_BUDGET)
        if groups and fits:
            groups[-1] = group
        else:
            groups.append([i])
    return groups


def padded_prompts(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Left-padded ids [n, T] (padding repeats the row's first token), positions [n, T] (0 under the
    padding) and each row's first real column."""
    t = max(len(p) for p in prompts)
    starts = [t - len(p) for p in prompts]
    ids = torch.tensor([[p[0]] * s + list(p) for p, s in zip(prompts, starts)], dtype=torch.long)  # [n, T]
    cols = torch.arange(t)
    positions = (cols[None, :] - torch.tensor(starts)[:, None]).clamp(min=0)  # [n, T]
    return ids, positions, starts


def prompt_visibility(starts: Sequence[int], t: int, *, window: int | None = None) -> torch.Tensor:
    """[n, T, T] bool: query column q of row b sees key column c when both are real, c <= q (and c > q -
    window on a sliding layer); a padding query sees only itself (a row of nothing would be NaN)."""
    cols = torch.arange(t)
    real = cols[None, :] >= torch.tensor(list(starts))[:, None]  # [n, T]
    causal = cols[None, :] <= cols[:, None]  # [T(q), T(k)]
    if window is not None:
        causal &= cols[None, :] > cols[:, None] - window
    visible = real[:, None, :] & real[:, :, None] & causal[None]  # [n, T, T]
    return visible | torch.eye(t, dtype=torch.bool)[None]


def prefill_rows(runner, prompts: Sequence[Sequence[int]], keeps: Sequence[int]) -> tuple[KVCache, list[int], list[torch.Tensor]]:
    """One forward for ``prompts`` together. Returns the cache ([n, H, T, D] per layer, row b's prompt at
    columns ``starts[b]..T-1``), the starts, and row b's logits [keeps[b], V] after its last prompt tokens."""
    ids, positions, starts = padded_prompts(prompts)
    n, t = ids.shape
    full = additive(prompt_visibility(starts, t).to(runner.device), runner.dtype)  # [n, 1, T, T]
    mask = full if runner.sliding_window is None else runner.per_layer_type(
        full, additive(prompt_visibility(starts, t, window=runner.sliding_window).to(runner.device), runner.dtype))
    cache = runner.new_cache(t + 1)
    m = max(keeps)
    logits = runner.rows_forward(ids.to(runner.device), positions.to(runner.device), cache, mask=mask, keep=m,
                                 kind="packed")  # [n, m, V]
    return cache, starts, [logits[b, m - k :] for b, k in enumerate(keeps)]


class PrefillChoice:
    """Together or alone: which way a group of prompts is prefilled, from measured ms per prompt token.

    Which one pays depends on the machine, not on a rule: a launch-bound forward (a GPU, a small model)
    costs about the same for 8 prompts as for one, while a 2-core CPU prefill is compute-bound and a padded
    forward only adds padding (on the Zen 4 EPYC, 8 SmolLM2 prompts of ~100 tokens: 0.9-1.1 s either way,
    up to 20% more together). ``prior`` is the way taken before anything is measured; once one way has
    a time, the next group tries the other, and then each group takes the cheaper, the other re-tried
    every ``PROBE_EVERY`` groups (times drift with load and prompt lengths). A server's loop keeps one
    across its decoders, so it learns once. ``learn=False``: always the prior (tests, A/B runs)."""

    EMA = 0.3  # weight of the latest group in a way's ms per token
    PROBE_EVERY = 16  # groups of 2+ rows between re-tries of the way that lost

    def __init__(self, *, prior: bool, learn: bool = True) -> None:
        self.prior = prior
        self.learn = learn
        self.ms_per_token: dict[bool, float] = {}  # together? -> EMA of prefill ms per real prompt token
        self.groups = 0  # groups of 2+ rows decided so far

    @classmethod
    def for_device(cls, device: torch.device) -> PrefillChoice:
        """Learning, with the prior a device suggests before any timing: together on a GPU (launch-bound)."""
        return cls(prior=device.type == "cuda")

    def together(self, rows: int) -> bool:
        if rows < 2:
            return False
        self.groups += 1
        if not self.learn or not self.ms_per_token:
            return self.prior
        if len(self.ms_per_token) == 1:
            return not next(iter(self.ms_per_token))  # the way not timed yet
        best = self.ms_per_token[True] <= self.ms_per_token[False]
        return (not best) if self.groups % self.PROBE_EVERY == 0 else best

    def record(self, together: bool, ms: float, tokens: int) -> None:
        per = ms / max(tokens, 1)
        old = self.ms_per_token.get(together)
        self.ms_per_token[together] = per if old is None else old + self.EMA * (per - old)
