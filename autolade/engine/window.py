"""The lookahead branch's 2-D Jacobi window: N-1 levels x W columns of guessed tokens.

Level l, column j sits at position t+1+j+l (t = the last accepted token's position). While the
window fills (the first N-2 steps) every level is one column wider per missing level and loses its
first column each step, so that at N-1 levels every column is a trajectory of consecutive positions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class JacobiWindow:
    def __init__(self, *, width: int, levels: int, seed_tokens: Sequence[int], seed: int = 0) -> None:
        if levels < 1 or width < 1:
            raise ValueError("a Jacobi window needs width >= 1 and levels >= 1")
        self.width = width  # W once full
        self.levels = levels  # N-1
        self._rng = random.Random(seed)
        self._seed_tokens = list(seed_tokens) or [0]
        # rows[0] is the oldest level; while filling, rows are wider than W by the number of missing levels
        self.rows: list[list[int]] = [self._random(width + levels - 1)]

    def _random(self, n: int) -> list[int]:
        return [self._rng.choice(self._seed_tokens) for _ in range(n)]

    @property
    def full(self) -> bool:
        return len(self.rows) == self.levels

    @property
    def depth(self) -> int:
        return len(self.rows)

    @property
    def row_width(self) -> int:
        return len(self.rows[0])

    def advance(self, new_row: Sequence[int]) -> tuple[list[int], list[tuple[int, ...]]]:
        """One Jacobi step given the predictions from the newest level; returns the finished n-grams.

        The n-grams come back as (keys, grams): column j's tokens down the levels plus its new
        token, key = the oldest level's token. Nothing is returned while the window still fills.
        """
        new_row = list(new_row)
        if not self.full:
            self.rows = [row[1:] for row in self.rows]
            self.rows.append(new_row[1:])
            return [], []
        keys = list(self.rows[0])
        grams = [tuple(col) for col in zip(*self.rows[1:], new_row)]
        self.rows = self.rows[1:] + [new_row]
        return keys, grams

    def resize(self, width: int, *, fill_tokens: Sequence[int] | None = None) -> None:
        """Change W keeping every column's trajectory: shrink drops right columns, grow adds random ones."""
        if width < 1:
            raise ValueError("window width must be >= 1")
        delta = width - self.width
        if delta == 0:
            return
        if fill_tokens:
            self._seed_tokens = list(fill_tokens)
        if delta < 0:
            self.rows = [row[: len(row) + delta] for row in self.rows]
        else:
            self.rows = [row + self._random(delta) for row in self.rows]
        self.width = width
