"""Draft sources: where the verification branch's candidates come from.

The shape of transformers' candidate generators, two methods: ``get_candidates`` drafts for the
coming step, ``update`` tells the source which tokens the context gained. The drafter asks its
sources in order and inserts their drafts into one prefix tree in that order, so the order decides
which source a shared node is credited to. A new source is a new file with a class of this shape
(``prompt_lookup.PromptLookupSource``, ``pool.PoolSource``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .steps import StepPlan


@dataclass(frozen=True, kw_only=True)
class Candidates:
    """One source's drafts for one step."""

    drafts: list[tuple[int, ...]] = field(default_factory=list)  # token drafts following the last token; [] = none
    match_len: int = 0  # context tokens the drafts were matched on (prompt lookup's suffix match); 0 = none
    shadow: tuple[tuple[int, ...], ...] = ()  # drafts looked up but not to be packed (StepPlan.shadow_len)


class DraftSource(Protocol):
    name: str  # StepOutcome.accepted_from when the accepted path ends in a node this source added

    def get_candidates(self, *, plan: StepPlan, last: int) -> Candidates:
        """Drafts to follow ``last`` (the newest context token) within ``plan``'s budget."""
        ...

    def update(self, *, tokens: Sequence[int]) -> None:
        """The tokens just appended to the context: the prompt first, then each step's new tokens."""
        ...


class StepPrice:
    """What a packed draft token must be worth on this machine, shared by the sources that size their
    drafts by it (memory, recycling): with ``token_cost`` (one more packed token's cost relative to a
    step, from the machine's step curve) a token accepted with chance p raises tokens/s iff
    p > tokens/step x token_cost."""

    EMA = 0.1  # weight of one step in the tokens/step average

    def __init__(self, token_cost: float | None) -> None:
        self.token_cost = token_cost  # None: no curve stored
        self.tokens_per_step = 1.0  # EMA of the tokens each decode step appends

    def step(self, tokens: int) -> None:
        """One decode step appended ``tokens`` tokens."""
        self.tokens_per_step += self.EMA * (tokens - self.tokens_per_step)

    def floor(self) -> float | None:
        """The chance a packed token must have; None where no curve prices it."""
        return None if self.token_cost is None else min(self.tokens_per_step * self.token_cost, 0.99)
