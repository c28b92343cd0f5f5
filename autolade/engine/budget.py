"""The step budget of a batched forward: how many tokens each row packs when all rows share one step.

A batched step pads every row to the widest row, so its cost is c(rows x width) on the machine's step
curve, whatever each row packs below that width. For a step width W the best a row can do is pack as
much of its draft tree as fits: all of it (with its lookahead window) when it fits, else its first W
tree nodes (a prefix of the insertion order is a tree: a node comes after its parent, and the sources
go in in the order they are trusted: prompt lookup first). So the budget tries every W from 1 (plain
greedy rows) to the widest row and keeps the one with the most expected tokens per ms (unless packing
every row whole comes within TIE of it),

    (rows + sum over rows of accepted_b(nodes packed by row b at W)) / c(rows x the widest row packed)

where rows x width is what the runner computes for that shape: a compiled runner pads a step of one column
to two, so there a width of 1 costs what 2 does and the second column is filled with drafts for nothing.

Rows only differ in what they would accept, which each row learns as it goes (``AcceptanceCurve``):
for every cut w of its tree, the drafts a step would have accepted had only the tree's first w nodes
been packed. A verified path's nodes have rising indices, so one step tells every cut at once; a row
that was cut learns from its whole tree walked against the tokens that came (the shadow in
``engine.batch``), so what it was not shown is learned too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .layout import DraftTree

CURVE_WIDTH = 64  # cuts tracked: w = 1..64 tree nodes (a cut past the last is the whole tree)
CURVE_EMA = 0.2  # weight of one step in a row's accepted-per-cut average
PRIOR_FULL = 8  # the starting belief: a row accepts 1 draft a step once 8 nodes are packed, log2(w)/3 below
# a cut must promise this factor over packing every row whole: the curve prices a batched step to ~5% and the
# acceptance is a running average, so a smaller promise is noise (at B=2 on the Zen 4 EPYC, cutting for such
# promises ran 5% slower than packing whole trees)
TIE = 1.05


class AcceptanceCurve:
    """A row's expected accepted drafts per step if its tree were cut to its first w nodes, w = 1..64."""

    def __init__(self) -> None:
        w = np.arange(CURVE_WIDTH + 1, dtype=np.float64)
        self.values = np.minimum(1.0, np.log2(np.maximum(w, 1)) / np.log2(PRIOR_FULL))  # [65]; index 0 unused
        self.values[0] = 0.0

    def at(self, nodes: int) -> float:
        """Expected accepted drafts with ``nodes`` tree nodes packed (1: the root alone, 0 drafts)."""
        return float(self.values[min(max(nodes, 1), CURVE_WIDTH)])

    def learn(self, path: Sequence[int]) -> None:
        """One step's verified path (node ids of the whole tree, rising: a child comes after its parent):
        a cut at w keeps the path's nodes below w, and the path is unbroken up to there."""
        nodes = np.asarray(path, dtype=np.int64)  # [a]
        kept = (nodes[None, :] < np.arange(CURVE_WIDTH + 1)[:, None]).sum(axis=1)  # [65]
        self.values += CURVE_EMA * (kept - self.values)
        self.values[0] = 0.0


def step_widths(step_cost: Callable[[float], float] | None, sizes: Sequence[int], trees: Sequence[int],
                curves: Sequence[AcceptanceCurve], *, step_tokens: Callable[[int, int], int] | None = None) -> list[int]:
    """Tokens each row packs this step: ``sizes[b]`` (its tree and window) or fewer (the first nodes of its
    tree, no window; 1 = its last token alone). ``trees[b]``: its tree's nodes, root included.
    ``step_cost``: c(k) in ms, None: every row packs all it drafted. ``step_tokens(rows, width)``: the tokens
    the runner computes for that shape (a compiled runner pads narrow steps: ``ModelRunner.step_tokens``);
    None: rows x width."""
    n = len(sizes)
    if step_cost is None or n == 0:
        return list(sizes)

    tokens = step_tokens or (lambda rows, width: rows * width)

    def packed(b: int, width: int) -> int:
        return sizes[b] if sizes[b] <= width else min(trees[b], width)

    rated = []  # (expected tokens per ms, plan) by rising width
    for width in range(1, max(sizes) + 1):
        plan = [packed(b, width) for b in range(n)]
        tree_nodes = [min(p, trees[b]) for b, p in enumerate(plan)]
        rated.append(((n + sum(curves[b].at(t) for b, t in enumerate(tree_nodes))) / step_cost(tokens(n, max(plan))), plan))
    best_rate, best = max(rated, key=lambda x: x[0])
    whole_rate, whole = rated[-1]  # the widest row's width: every row packs all it drafted
    return whole if whole_rate * TIE >= best_rate else best


def cut_tree(tree: DraftTree, nodes: int) -> DraftTree:
    """The tree's first ``nodes`` nodes: a tree, since every node comes after its parent."""
    out = DraftTree(tree.tokens[0])
    out.tokens, out.parent, out.depth = tree.tokens[:nodes], tree.parent[:nodes], tree.depth[:nodes]
    out.children = [{tok: c for tok, c in kids.items() if c < nodes} for kids in tree.children[:nodes]]
    return out
