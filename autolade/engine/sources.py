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
