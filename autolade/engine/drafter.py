"""The verification branch's drafting: the draft sources, made in one place (``make_sources``), and
the ``Drafter`` that asks them in order for one step's draft tree and keeps the lookahead window.

A new draft source is a new file in ``engine/`` with a class of the ``sources.DraftSource`` shape,
plus one line in ``make_sources``. Its name keys ``StepOutcome.nodes`` and ``accepted_from``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autolade.config import LookaheadConfig

from .layout import DraftTree
from .memory import AnswerMemory, MemorySource
from .pool import NgramPool, PoolSource
from .prompt_lookup import PromptLookupSource
from .recycle import EMPTY, NextTokenTable, RecycleSource
from .sources import Candidates, DraftSource
from .steps import StepPlan
from .window import JacobiWindow

FILLER = "filler"  # the source name of a lone step's filler draft (Drafter.pad_single)


def make_sources(*, config: LookaheadConfig, prompt: Sequence[int], memory: AnswerMemory | None = None,
                 token_cost: float | None = None, recycled: NextTokenTable | None = None) -> list[DraftSource]:
    """The draft sources ``config`` asks for, in tree order: the order credits a node shared by two
    sources' drafts to the first (prompt-lookup drafts, then memory drafts, pool n-grams, recycled)."""
    sources: list[DraftSource] = [
        PromptLookupSource(max_ngram=max(config.prompt_lookup_ngram, 1), scaled=config.prompt_lookup_scaled)]
    if memory is not None:
        sources.append(MemorySource(memory, token_cost=token_cost))
    if config.lookahead:
        sources.append(PoolSource.for_prompt(cap=config.pool_cap, prompt=prompt,
                                             ngram=config.ngram if config.seed_pool_from_prompt and config.levels >= 1 else 0))
    if config.recycle or recycled is not None:
        sources.append(RecycleSource(recycled, token_cost=token_cost))
    return sources


@dataclass(frozen=True, kw_only=True)
class Drafted:
    """One step's draft tree and what each draft source put into it."""

    tree: DraftTree
    ends: dict[str, int]  # source name -> tree size (root included) after its drafts, in insertion order
    found: dict[str, Candidates]  # source name -> the candidates it offered

    def nodes(self, name: str) -> int:
        """Tree nodes the source added beyond prefixes shared with earlier sources (0 = no such source)."""
        start = 1
        for source, end in self.ends.items():
            if source == name:
                return end - start
            start = end
        return 0

    def accepted_from(self, path: Sequence[int]) -> str:
        """The source that added the accepted path's last node; "none" for an empty path."""
        if path:
            for source, end in self.ends.items():
                if path[-1] < end:
                    return source
        return "none"


class Drafter:
    """The verification branch's draft sources (prompt lookup, the answer memory when given, the
    n-gram pool, then token recycling) and the lookahead window."""

    def __init__(self, *, config: LookaheadConfig, prompt: Sequence[int], memory: AnswerMemory | None = None,
                 token_cost: float | None = None, recycled: NextTokenTable | None = None,
                 pad_single: bool = False) -> None:
        self.config = config
        self.tokens: list[int] = []  # the context: prompt + committed tokens
        # a step with nothing to draft packs one filler draft: where the curve says c(2) < c(1), it is cheaper
        self.pad_single = pad_single
        self._counts: dict[int, int] = {}  # token -> occurrences in the context
        self._common = -1  # the context's most frequent token
        self.sources = make_sources(config=config, prompt=prompt, memory=memory, token_cost=token_cost, recycled=recycled)
        self.lookup = next(s for s in self.sources if isinstance(s, PromptLookupSource))  # always there: the filler reads it
        pool = next((s for s in self.sources if isinstance(s, PoolSource)), None)
        self.pool: NgramPool | None = None if pool is None else pool.pool  # the window's n-grams go there
        self.window: JacobiWindow | None = None
        if config.lookahead:
            self.window = JacobiWindow(width=config.window, levels=config.levels, seed_tokens=prompt)
        self.recycler: RecycleSource | None = next((s for s in self.sources if isinstance(s, RecycleSource)), None)
        self.commit(prompt)

    def observe(self, tree: DraftTree, logits: torch.Tensor) -> None:
        """The model's next-token logits [m, V] after the tree's first m nodes: token recycling learns from
        them, per token and per (the token before it, token)."""
        if self.recycler is not None:
            m = logits.shape[0]
            before = self.tokens[-2] if len(self.tokens) > 1 else EMPTY  # the root's previous token
            previous = [before] + [tree.tokens[p] for p in tree.parent[1:m]]
            self.recycler.table.observe(tree.tokens[:m], logits, previous=previous)

    def observe_prompt(self, prompt: Sequence[int], logits: torch.Tensor) -> None:
        """The prefill's next-token logits [m, V] after the prompt's last m tokens."""
        if self.recycler is not None:
            m = logits.shape[0]
            previous = ([EMPTY] + list(prompt))[-m - 1 : -1]
            self.recycler.table.observe(list(prompt)[-m:], logits, previous=previous)

    def tree(self, plan: StepPlan) -> Drafted:
        """The draft tree for this step: every source's candidates, in source order."""
        last = self.tokens[-1]
        tree = DraftTree(last)
        ends: dict[str, int] = {}
        found: dict[str, Candidates] = {}
        for source in self.sources:
            found[source.name] = candidates = source.get_candidates(plan=plan, last=last)
            for draft in candidates.drafts:
                tree.add(draft)
            ends[source.name] = len(tree)
        if self.pad_single and len(tree) == 1 and (self.window is None or plan.window <= 0):
            follower = self.lookup.index.follower()  # what followed `last` before, from the lookup's own index
            tree.add((self._common if follower is None else follower,))
            ends[FILLER] = len(tree)
        return Drafted(tree=tree, ends=ends, found=found)

    def window_rows(self, plan: StepPlan) -> list[list[int]] | None:
        if self.window is None or plan.window <= 0:
            return None
        if plan.window != self.window.width:
            self.window.resize(plan.window, fill_tokens=self.tokens[-64:])
        return self.window.rows

    def advance_window(self, predictions: list[int]) -> None:
        keys, grams = self.window.advance(predictions)
        if keys:
            self.pool.add_many(keys, grams)

    def commit(self, tokens: Sequence[int]) -> None:
        tokens = [int(tok) for tok in tokens]
        for tok in tokens:  # the filler's fallback: the context's most frequent token
            self._counts[tok] = n = self._counts.get(tok, 0) + 1
            if n > self._counts.get(self._common, 0):
                self._common = tok
        self.tokens.extend(tokens)
        for source in self.sources:
            source.update(tokens=tokens)
