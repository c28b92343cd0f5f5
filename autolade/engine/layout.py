"""One packed step: ids, position ids, the 4-D mask and which logits to keep.

Packed order (k tokens):   [last accepted] [draft tree nodes] [window level 1 .. level N-1]
- the draft tree merges every candidate (pool n-grams, prompt-lookup drafts) into a prefix tree
  rooted at the last accepted token: node at depth d sits at position t+1+d and sees its ancestors;
- window level l, column j sits at t+1+j+l and sees level 1's columns 0..j and column j of
  levels 2..l (its Jacobi trajectory);
- the two branches never see each other; everything sees the committed prefix (within a sliding
  window, for layers that have one).
The tree comes first so that the accepted path usually lies right after the last token, and the
KV cache rollback is then a length move with no copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


class DraftTree:
    """Prefix tree of candidate continuations; node 0 is the root (the last accepted token)."""

    def __init__(self, root_token: int) -> None:
        self.tokens: list[int] = [root_token]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, candidate: Sequence[int], *, budget: int | None = None) -> int:
        """Insert a candidate; returns how many new nodes it took. ``budget`` caps new nodes."""
        node, added = 0, 0
        for tok in candidate:
            child = self.children[node].get(tok)
            if child is None:
                if budget is not None and added >= budget:
                    break
                child = len(self.tokens)
                self.tokens.append(tok)
                self.parent.append(node)
                self.depth.append(self.depth[node] + 1)
                self.children.append({})
                self.children[node][tok] = child
                added += 1
            node = child
        return added

    def walk(self, argmax: Sequence[int]) -> tuple[list[int], list[int]]:
        """Greedy verification: follow the children that equal the model's argmax.

        ``argmax[i]`` is the model's next token after node i. Returns (accepted node ids,
        new tokens); the new tokens are the accepted nodes' tokens plus the bonus token.
        """
        node, path, out = 0, [], []
        while True:
            nxt = argmax[node]
            out.append(nxt)
            child = self.children[node].get(nxt)
            if child is None:
                return path, out
            path.append(child)
            node = child

    def visibility(self) -> np.ndarray:
        """[n, n] bool: node i sees node j (j is i or an ancestor of i)."""
        n = len(self.tokens)
        vis = np.zeros((n, n), dtype=bool)
        vis[0, 0] = True
        for i in range(1, n):
            vis[i] = vis[self.parent[i]]
            vis[i, i] = True
        return vis


def window_visibility(levels: int, width: int) -> np.ndarray:
    """[levels*width, levels*width] bool for a full-width window (rows narrower than ``width``
    while filling are handled by ``width`` = that row width and the same rule)."""
    n = levels * width
    vis = np.zeros((n, n), dtype=bool)
    for lev in range(levels):
        for j in range(width):
            q = lev * width + j
            vis[q, : j + 1] = True  # level 1, columns 0..j
            for l2 in range(1, lev + 1):
                vis[q, l2 * width + j] = True  # column j of levels 2..l
    return vis


@dataclass
class PackedStep:
    """Everything one forward needs, plus the bookkeeping to read its logits back."""

    input_ids: torch.Tensor  # [1, k]
    position_ids: torch.Tensor  # [1, k]
    block_visible: np.ndarray  # [k, k] bool, the packed tokens among themselves
    block_positions: np.ndarray  # [k] int64
    keep: torch.Tensor  # [m] packed indices whose logits are needed
    n_tree: int  # tree nodes, root included (packed indices 0..n_tree-1)
    window_levels: int  # levels of the window in this step (0 = no lookahead branch)
    window_width: int  # columns per level in this step

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[1])


class Layout:
    """Builds packed steps; caches the window's mask block per (levels, width)."""

    def __init__(self, *, device: torch.device) -> None:
        self.device = device
        self._window_blocks: dict[tuple[int, int], np.ndarray] = {}

    def _window_block(self, levels: int, width: int) -> np.ndarray:
        key = (levels, width)
        block = self._window_blocks.get(key)
        if block is None:
            block = self._window_blocks[key] = window_visibility(levels, width)
        return block

    def build(self, tree: DraftTree, window_rows: list[list[int]] | None, *, t: int) -> PackedStep:
        n_tree = len(tree)
        levels = len(window_rows) if window_rows else 0
        width = len(window_rows[0]) if levels else 0
        n_win = levels * width
        k = n_tree + n_win
        ids = np.empty(k, dtype=np.int64)
        pos = np.empty(k, dtype=np.int64)
        ids[:n_tree] = tree.tokens
        pos[:n_tree] = t + np.asarray(tree.depth, dtype=np.int64)
        vis = np.zeros((k, k), dtype=bool)
        vis[:n_tree, :n_tree] = tree.visibility()
        if n_win:
            ids[n_tree:] = np.asarray(window_rows, dtype=np.int64).reshape(-1)
            lev = np.repeat(np.arange(levels), width)
            col = np.tile(np.arange(width), levels)
            pos[n_tree:] = t + 1 + col + lev
            vis[n_tree:, n_tree:] = self._window_block(levels, width)
            vis[n_tree:, 0] = True  # the window sees the last accepted token
            keep = np.concatenate([np.arange(n_tree), np.arange(k - width, k)])
        else:
            keep = np.arange(n_tree)
        return PackedStep(
            input_ids=torch.from_numpy(ids).to(self.device).unsqueeze(0),
            position_ids=torch.from_numpy(pos).to(self.device).unsqueeze(0),
            block_visible=vis,
            block_positions=pos,
            keep=torch.from_numpy(keep).to(self.device),
            n_tree=n_tree,
            window_levels=levels,
            window_width=width,
        )


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, Q, K] additive mask from a [B, Q, K] visibility: 0 = visible, dtype's min = hidden."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[:, None]


def additive_mask(
    step: PackedStep, *, prefix_len: int, dtype: torch.dtype, device: torch.device, sliding_window: int | None = None
) -> torch.Tensor:
    """[1, 1, k, prefix_len + k] additive mask: 0 = visible, dtype's min = hidden.

    The prefix holds positions 0..prefix_len-1 in order. With ``sliding_window`` a query at
    position q sees keys at positions > q - sliding_window only (transformers' convention).
    """
    k = step.size
    visible = np.ones((k, prefix_len + k), dtype=bool)
    visible[:, prefix_len:] = step.block_visible
    if sliding_window is not None and int(step.block_positions.max()) >= sliding_window:
        key_pos = np.concatenate([np.arange(prefix_len, dtype=np.int64), step.block_positions])
        visible &= key_pos[None, :] > step.block_positions[:, None] - sliding_window
    mask = torch.zeros((1, 1, k, prefix_len + k), dtype=dtype, device=device)
    mask.masked_fill_(torch.from_numpy(~visible).to(device), torch.finfo(dtype).min)
    return mask
