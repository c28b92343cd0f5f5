"""Verification of the draft tree. Greedy: follow the children that equal the argmax.

A verifier turns logits into tokens: ``first`` for a plain step (one row of logits), ``verify``
for a draft tree (one row per tree node, row i = the distribution after node i). Sampling
verifiers (``sampling.py``) have the same two methods.
"""

from __future__ import annotations

import torch

from .layout import DraftTree


class GreedyVerifier:
    name = "greedy"

    def first(self, logits: torch.Tensor, context: list[int]) -> int:
        """Next token after ``context`` from its logits [V]."""
        return int(logits.argmax())

    def verify(self, tree: DraftTree, logits: torch.Tensor, context: list[int]) -> tuple[list[int], list[int]]:
        """(accepted node ids, new tokens = accepted tokens + bonus) from logits [n_tree, V]."""
        return tree.walk(logits.argmax(-1).tolist())
