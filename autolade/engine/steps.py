"""What one decode step packs and what it did: the types the loop and the runtime policies share.

The decode loop calls ``policy.plan()`` before a step and ``policy.update(outcome)`` after it (the
two-method shape of transformers' candidate generators). A policy holds no model and never changes
the output: it only chooses how many tokens the verifier gets to check. ``StaticPolicy`` (the
config's fixed W/N/G every step) is the loop's default; the adaptive ones live in
``autolade.runtime.policies``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from autolade.config import LookaheadConfig


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """What one step packs."""

    window: int  # W for this step; 0 = no lookahead branch (the window state is kept, not reset)
    guesses: int  # G: pool n-grams to verify
    draft_len: int  # longest prompt-lookup draft; 0 = none
    drafts: int  # prompt-lookup drafts (distinct earlier occurrences)
    draft_lens: tuple[int, ...] = ()  # draft length after an m-token suffix match at index m-1 (0 = no draft); () = draft_len
    shadow_len: int = 0  # where a match drafts nothing: look up this many tokens anyway, to learn from, never packed
    recycle: int = 0  # draft-tree nodes grown from the model's own top-k predictions (token recycling); 0 = none


@dataclass(frozen=True, kw_only=True)
class StepOutcome:
    """What one step did; ``accepted`` counts draft tokens accepted, the bonus token not included."""

    plan: StepPlan
    packed: int  # tokens in the forward (1 = plain greedy step)
    window_tokens: int  # lookahead-branch tokens in the forward
    accepted: int
    accepted_from: str  # "none", "lookup" (prompt-lookup draft), "memory" (an earlier answer), "pool" (a pool n-gram) or "recycle" (recycled top-k predictions)
    step_s: float  # wall time of the whole step
    forward_s: float  # wall time of the model forward alone
    # draft-tree nodes per draft source name ("lookup", "memory", "pool", "recycle", "filler"), each beyond the
    # prefixes it shares with earlier sources; a source that added none may be absent
    nodes: Mapping[str, int] = field(default_factory=dict)
    longest_draft: int = 0  # tokens in the longest prompt-lookup draft packed (0 = none)
    match_len: int = 0  # tokens of the suffix match the prompt-lookup drafts came from (0 = none)
    shadow: tuple[tuple[int, ...], ...] = ()  # lookup drafts found but not packed (plan.shadow_len): the later tokens show what they would have accepted
    emitted: tuple[int, ...] = ()  # the tokens this step appended (accepted drafts + the bonus token)


class Policy(Protocol):
    name: str

    def plan(self) -> StepPlan: ...

    def update(self, outcome: StepOutcome) -> None: ...


class StaticPolicy:
    """Every step as the config says (the paper's fixed W/N/G)."""

    name = "static"

    def __init__(self, config: LookaheadConfig) -> None:
        look = config.lookahead
        self._plan = StepPlan(
            window=config.window if look else 0,
            guesses=config.guesses if look else 0,
            draft_len=config.prompt_lookup,
            drafts=config.prompt_lookup_drafts if config.prompt_lookup else 0,
            recycle=config.recycle,
        )

    def plan(self) -> StepPlan:
        return self._plan

    def update(self, outcome: StepOutcome) -> None:
        pass

    def to_dict(self) -> dict:
        return {"name": self.name}
