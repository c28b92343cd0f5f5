"""The lookahead n-gram pool: n-grams the Jacobi window finished, drafted after their key token."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .sources import Candidates
from .steps import StepPlan


class NgramPool:
    """Key token -> at most ``cap`` (N-1)-grams that followed it, least recently used dropped first."""

    def __init__(self, *, cap: int) -> None:
        self.cap = max(int(cap), 1)
        self._pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._pool.values())

    def add(self, key: int, gram: tuple[int, ...]) -> None:
        bucket = self._pool.get(key)
        if bucket is None:
            bucket = self._pool[key] = OrderedDict()
        if gram in bucket:
            bucket.move_to_end(gram)
            return
        bucket[gram] = None
        if len(bucket) > self.cap:
            bucket.popitem(last=False)

    def add_many(self, keys: Sequence[int], grams: Sequence[tuple[int, ...]]) -> None:
        for key, gram in zip(keys, grams):
            self.add(key, gram)

    def seed(self, tokens: Sequence[int], *, n: int) -> None:
        """Every n-gram of ``tokens`` (key = its first token): prompt lookup for free."""
        for i in range(len(tokens) - n + 1):
            self.add(tokens[i], tuple(tokens[i + 1 : i + n]))

    def get(self, key: int, limit: int) -> list[tuple[int, ...]]:
        """Up to ``limit`` n-grams after ``key``, most recently used first."""
        bucket = self._pool.get(key)
        if not bucket or limit <= 0:
            return []
        out = []
        for gram in reversed(bucket):
            out.append(gram)
            if len(out) == limit:
                break
        return out

    def resize(self, cap: int) -> None:
        """Change the per-key cap; shrinking drops the least recently used entries."""
        self.cap = max(int(cap), 1)
        for bucket in self._pool.values():
            while len(bucket) > self.cap:
                bucket.popitem(last=False)


class PoolSource:
    """The draft source over an ``NgramPool``: up to ``plan.guesses`` n-grams keyed by the last token,
    most recently used first. The pool learns from the lookahead window (``add_many``) and, with
    ``seed``, from the prompt's own n-grams; the tokens the context gains teach it nothing."""

    name = "pool"

    def __init__(self, *, cap: int) -> None:
        self.pool = NgramPool(cap=cap)

    @classmethod
    def for_prompt(cls, *, cap: int, prompt: Sequence[int], ngram: int) -> PoolSource:
        """A source whose pool starts with the prompt's ``ngram``-grams (0: empty)."""
        source = cls(cap=cap)
        if ngram:
            source.pool.seed(prompt, n=ngram)
        return source

    def get_candidates(self, *, plan: StepPlan, last: int) -> Candidates:
        return Candidates(drafts=self.pool.get(last, plan.guesses) if plan.guesses else [])

    def update(self, *, tokens: Sequence[int]) -> None:
        pass
