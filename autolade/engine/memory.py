"""N-gram memory: drafts from what the model wrote in earlier requests.

Answers to one workload repeat themselves across requests (boilerplate, idioms, structure). The
memory keeps earlier answers' tokens in one sequence (answers separated by ``SEP``) with a suffix
index over it, the way ``SuffixIndex`` indexes the context. A query matches the longest suffix of
the context (up to ``max_ngram`` tokens) in the memory, reads what followed its ``scan`` most
recent occurrences, and grows drafts along the continuations the most occurrences agree on:
candidates ranked by frequency, ties by recency. A draft is only as long as its evidence: past
``single_len(m)`` tokens every further token must be backed by ``min_support`` occurrences.

A draft is also only as long as it has earned: ``DraftYield`` learns, per match length and draft
rank, how often each draft position turned out right (scored against the output whether the draft
was packed or cut, so a cut draft still teaches), and the source packs a draft only up to the last
position whose learned chance of being reached and right pays for packing it: tokens/step x one
packed token's relative cost (``token_cost``, from the machine's step curve: ~0 on a GPU), or
``min_alive`` when no curve prices it. On text the memory does not know that cuts drafts to a few
tokens instead of packing tokens that are never accepted; where the memory pays, drafts keep their length.

Bounded: past ``max_tokens`` remembered tokens the oldest answers are evicted. Pure data: ids in,
ids out; where it is stored and who may see it is ``autolade.store.memory``'s business.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .sources import Candidates, StepPrice
from .steps import StepPlan

SEP = -1  # between answers: no n-gram and no continuation crosses it


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """How the memory matches and sizes its drafts (defaults chosen by tools/memory_bound.py's replay)."""

    max_tokens: int = 400_000  # remembered tokens before the oldest answers go (~3,000 answers of 128 tokens)
    max_ngram: int = 6  # longest context suffix matched in the memory
    min_ngram: int = 2  # shorter suffix matches draft nothing: one shared token is no evidence
    scan: int = 48  # most recent occurrences of the matched suffix read per query
    max_len: int = 16  # longest memory draft
    drafts: int = 2  # memory drafts per step (distinct first tokens)
    min_support: int = 2  # occurrences that must agree on a token past the single-evidence length
    min_alive: float = 0.05  # where no step curve says what a packed token costs: pack a draft token only while
    # its learned chance of being accepted (all before it right too) is at least this (BENCHMARKS.md, "memory
    # drafts earn their length"); 0 = no cut at all, curve or not: pack everything the evidence allows

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"memory n-gram range {self.min_ngram}..{self.max_ngram} is empty; use 1 <= min_ngram <= max_ngram")
        if self.max_tokens < 1 or self.scan < 1 or self.max_len < 0 or self.drafts < 0 or self.min_support < 1:
            raise ValueError("memory sizes must be positive (max_tokens, scan, min_support >= 1; max_len, drafts >= 0)")
        if not 0.0 <= self.min_alive < 1.0:
            raise ValueError(f"memory min_alive {self.min_alive!r} is not a chance; use 0 <= min_alive < 1 (0 = no cut)")

    def single_len(self, m: int) -> int:
        """Draft tokens one occurrence may back after an m-token match (scaled like prompt lookup)."""
        return min(self.max_len, 2 ** (m - 1))


class AnswerMemory:
    """Earlier answers (token ids) of one model and workload, indexed for suffix matches."""

    def __init__(self, config: MemoryConfig | None = None) -> None:
        self.config = config or MemoryConfig()
        self._answers: deque[tuple[int, ...]] = deque()
        self._tokens: list[int] = []
        self._ends: list[dict[tuple[int, ...], list[int]]] = []
        self.yields = DraftYield(levels=self.config.max_ngram, ranks=self.config.drafts, max_len=self.config.max_len)
        self._rebuild()

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def tokens(self) -> int:
        """Remembered tokens (separators not counted)."""
        return len(self._tokens) - len(self._answers)

    def answers(self) -> list[tuple[int, ...]]:
        """The remembered answers, oldest first."""
        return list(self._answers)

    def add(self, answer: Sequence[int]) -> None:
        """Remember one answer; the oldest go once ``max_tokens`` is passed."""
        ans = tuple(int(t) for t in answer)
        if not ans:
            return
        self._answers.append(ans)
        self._extend(ans)
        limit = self.config.max_tokens
        if self.tokens > limit:
            kept = self.tokens
            while len(self._answers) > 1 and kept > limit * 3 // 4:
                kept -= len(self._answers.popleft())  # evict down to 3/4 so the rebuild is amortised
            self._rebuild()

    def add_many(self, answers: Iterable[Sequence[int]]) -> None:
        for a in answers:
            self.add(a)

    def _rebuild(self) -> None:
        self._tokens = []
        self._ends = [{} for _ in range(self.config.max_ngram + 1)]
        for ans in self._answers:
            self._extend(ans)

    def _extend(self, ans: tuple[int, ...]) -> None:
        toks, ends, top = self._tokens, self._ends, self.config.max_ngram
        start = len(toks)
        toks.extend(ans)
        toks.append(SEP)
        for end in range(start + 1, start + len(ans) + 1):
            for m in range(1, min(top, end - start) + 1):
                ends[m].setdefault(tuple(toks[end - m : end]), []).append(end)

    def match(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """(m, ends): the longest context suffix (min_ngram <= m <= max_ngram) found in the memory and
        where its ``scan`` most recent occurrences end, most recent first; (0, []) if none."""
        cfg = self.config
        for m in range(min(cfg.max_ngram, len(context)), cfg.min_ngram - 1, -1):
            ends = self._ends[m].get(tuple(context[len(context) - m :]))
            if ends:
                return m, ends[: -cfg.scan - 1 : -1]
        return 0, []

    def drafts(self, context: Sequence[int], *, max_len: int | None = None,
               max_drafts: int | None = None) -> tuple[list[tuple[int, ...]], int]:
        """(drafts, m): up to ``max_drafts`` drafts with distinct first tokens, each grown along the
        continuation most occurrences agree on, as long as the evidence allows."""
        cfg = self.config
        max_len = cfg.max_len if max_len is None else max_len
        max_drafts = cfg.drafts if max_drafts is None else max_drafts
        if max_len <= 0 or max_drafts <= 0 or not self._answers:
            return [], 0
        m, ends = self.match(context)
        if not m:
            return [], 0
        toks = self._tokens
        conts = [toks[e : e + max_len] for e in ends]
        conts = [c[: c.index(SEP)] if SEP in c else c for c in conts]
        firsts = Counter(c[0] for c in conts if c)
        single = cfg.single_len(m)
        out: list[tuple[int, ...]] = []
        for first, _ in firsts.most_common(max_drafts):  # Counter keeps first-seen (most recent) order on ties
            group = [c for c in conts if c and c[0] == first]
            out.append(_grow(group, single=single, min_support=cfg.min_support, max_len=max_len))
        return out, m


def _grow(group: list[list[int]], *, single: int, min_support: int, max_len: int) -> tuple[int, ...]:
    """The draft along the most agreed continuation of ``group`` (all share their first token)."""
    path = [group[0][0]]
    while len(path) < max_len:
        d = len(path)
        nxt = Counter(c[d] for c in group if len(c) > d)
        if not nxt:
            break
        tok, count = nxt.most_common(1)[0]
        if count < min_support and len(path) >= single:
            break
        path.append(tok)
        group = [c for c in group if len(c) > d and c[d] == tok]
    return tuple(path)


class DraftYield:
    """What the memory's drafts have been worth: per match length m and draft rank r (0 = the most
    agreed continuation), how often draft position i was reached (positions 1..i-1 right) and
    passed (position i right too). ``alive(m, r)[i]`` = the chance that positions 1..i are all
    right, from those counts over a prior of ``GUESS`` per position (``PRIOR`` pseudo-observations):
    a memory that has proven nothing packs two or three tokens a draft, as long as a match's evidence
    allows, until the output shows what its drafts are worth."""

    PRIOR = 2.0  # pseudo-observations behind each position's starting guess
    GUESS = 0.5  # starting guess of P(position i right | positions before it right)

    def __init__(self, *, levels: int, ranks: int, max_len: int) -> None:
        self.max_len = max_len
        shape = lambda: [[[0.0] * (max_len + 1) for _ in range(max(ranks, 1))] for _ in range(levels + 1)]
        self.reached = shape()  # [m][r][i]
        self.passed = shape()  # [m][r][i]

    def alive(self, m: int, r: int) -> list[float]:
        """[1.0, P(1 right), P(1..2 right), ...] for a rank-r draft after an m-token match."""
        reached, passed = self.reached[m][r], self.passed[m][r]
        out, p = [1.0], 1.0
        for i in range(1, self.max_len + 1):
            p *= (passed[i] + self.PRIOR * self.GUESS) / (reached[i] + self.PRIOR)
            out.append(p)
        return out

    def length(self, m: int, r: int, min_alive: float) -> int:
        """Tokens of a rank-r draft worth packing: the last position whose chance is >= min_alive."""
        if min_alive <= 0:
            return self.max_len
        alive = self.alive(m, r)
        return max((i for i in range(len(alive)) if alive[i] >= min_alive), default=0)

    def score(self, m: int, r: int, right: int, length: int) -> None:
        """A rank-r draft of ``length`` tokens after an m-token match had its first ``right`` right."""
        for i in range(1, min(right + 1, length) + 1):
            self.reached[m][r][i] += 1
            self.passed[m][r][i] += i <= right


class MemorySource:
    """The draft source over an ``AnswerMemory``: the longest suffix of this request's context
    matched in earlier answers; drafts go into the same tree after prompt lookup's, each cut to the
    length its rank has earned (``DraftYield``). Every draft looked up, packed or cut, is scored
    against the tokens that follow (under greedy exactly what packing it whole would have accepted)."""

    name = "memory"

    def __init__(self, memory: AnswerMemory, *, context: int = 64, token_cost: float | None = None) -> None:
        self.memory = memory
        self.price = StepPrice(token_cost)
        self._tail: deque[int] = deque(maxlen=max(context, memory.config.max_ngram))
        self._watching: list[tuple[int, int, tuple[int, ...], int]] = []  # (m, rank, draft, tokens right so far)
        self._updates = 0

    def floor(self) -> float:
        """The chance a draft token must have to be packed. With ``token_cost`` (one more packed token's
        cost relative to a step, from this machine's step curve), a token that is accepted with chance p
        raises tokens/s iff p > tokens/step x token_cost; without it, ``MemoryConfig.min_alive`` (0: no cut,
        whatever the curve says)."""
        fixed, priced = self.memory.config.min_alive, self.price.floor()
        return fixed if priced is None or fixed <= 0 else priced

    def get_candidates(self, *, plan: StepPlan, last: int) -> Candidates:
        if plan.draft_len <= 0 and plan.drafts <= 0:
            return Candidates()
        drafts, m = self.memory.drafts(list(self._tail))
        yields, floor = self.memory.yields, self.floor()
        self._watching.extend((m, r, d, 0) for r, d in enumerate(drafts))
        cut = [d[: yields.length(m, r, floor)] for r, d in enumerate(drafts)]
        return Candidates(drafts=[d for d in cut if d], match_len=m)

    def update(self, *, tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        self._tail.extend(tokens)
        self._updates += 1
        if self._updates > 2:  # the prompt, then the prefill's token, then one update per step
            self.price.step(len(tokens))
        still = []
        for m, r, draft, right in self._watching:
            for tok in tokens:
                if draft[right] != tok:
                    self.memory.yields.score(m, r, right, len(draft))
                    break
                right += 1
                if right == len(draft):
                    self.memory.yields.score(m, r, right, len(draft))
                    break
            else:
                still.append((m, r, draft, right))
        self._watching = still
