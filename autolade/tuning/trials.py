"""One trial of ``autolade tune``: a candidate setting timed against its interleaved baselines.

Each prompt runs plain greedy (``model.generate``), optionally transformers' prompt lookup, and the
candidate, in an order that alternates, so the ratio to greedy cancels machine drift. The candidate's
output is checked against the greedy reference: a divergence that is not float noise (the reference's
top-2 logit gap there is above the dtype's noise) is an ``ExactnessError``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.memory import AnswerMemory
from autolade.runtime.policies import make_policy
from autolade.tuning.harness import (
    TIMER,
    Reference,
    Timer,
    divergence,
    greedy_reference,
    noise_gap,
    rotate,
    run_autolade,
    run_greedy,
    run_pld,
    setting_label,
)


class ExactnessError(RuntimeError):
    """A trial's output left the greedy reference at a position that is not float noise."""


@dataclass
class Candidate:
    """One point of the search space, ready to run."""

    config: LookaheadConfig
    policy: dict[str, Any] | None  # None = static

    def label(self) -> str:
        """The setting's one label (``autolade.tuning.harness.setting_label``): equal for equal behaviour."""
        return setting_label(self.config, self.policy)


@dataclass
class Measured:
    """Per-prompt timings of a candidate and its interleaved baselines."""

    ours_s: list[float] = field(default_factory=list)
    greedy_s: list[float] = field(default_factory=list)
    pld_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # top-2 gaps at tolerated divergences
    runs: list[tuple[int, Any]] = field(default_factory=list)  # (prompt length, res.stats) of each autolade run

    def ratio(self, baseline: list[float] | None = None) -> float:
        base = self.greedy_s if baseline is None else baseline
        return sum(base) / sum(self.ours_s) if self.ours_s else 0.0


class Runner:
    """Times greedy, HF prompt lookup and autolade on one prompt (``autolade.tuning.harness``), and checks exactness."""

    def __init__(self, model, *, max_new_tokens: int, eos: Sequence[int],
                 cost: Callable[[float], float] | None = None, timer: Timer = TIMER,
                 memory: AnswerMemory | None = None) -> None:
        self.model = model
        self.cost = cost  # this machine's c(k), for the cost-aware policy
        self.memory = memory  # earlier answers, one more draft source (each prompt's own answer left out)
        self._own: dict[int, AnswerMemory] = {}
        self.n = max_new_tokens
        self.eos = list(eos)
        self.timer = timer
        self.noise = noise_gap(next(model.parameters()).dtype)
        self._ref: dict[int, Reference] = {}

    def reference(self, key: int, ids: torch.Tensor) -> Reference:
        """Greedy tokens and the top-2 logit gap at each position (computed once per prompt)."""
        if key not in self._ref:
            self._ref[key] = greedy_reference(self.model, ids, max_new_tokens=self.n, eos=self.eos)
        return self._ref[key]

    def greedy(self, ids: torch.Tensor) -> float:
        return run_greedy(self.model, ids, max_new_tokens=self.n, eos=self.eos, timer=self.timer).seconds

    def pld(self, ids: torch.Tensor) -> float:
        return run_pld(self.model, ids, max_new_tokens=self.n, eos=self.eos, timer=self.timer).seconds

    def ours(self, key: int, ids: torch.Tensor, cand: Candidate) -> tuple[float, int, Any, float | None]:
        ref = self.reference(key, ids)
        policy = make_policy(cand.policy, cand.config, cost=self.cost)
        run = run_autolade(self.model, ids, max_new_tokens=self.n, config=cand.config, policy=policy, eos=self.eos,
                           timer=self.timer, memory=self.memory_for(key, ref.tokens))
        div = divergence(ref.tokens, run.tokens, ref)
        if div is not None and not div.within_noise(self.noise):
            gap = "unknown" if div.gap_top2 is None else f"{div.gap_top2:.3g}"
            raise ExactnessError(f"{cand.label()}: token {div.index} differs from greedy, top-2 gap {gap}")
        return run.seconds, len(run.tokens), run.stats, None if div is None else div.gap_top2

    def memory_for(self, key: int, answer: Sequence[int]) -> AnswerMemory | bool:
        """The memory this prompt drafts from: every remembered answer but its own earlier ones
        (``own_answer``), so a trial is not sped up by reading the answer it is being timed on.
        False without a memory."""
        if self.memory is None:
            return False
        if key not in self._own:
            mem = AnswerMemory(self.memory.config)
            mem.add_many(a for a in self.memory.answers() if not own_answer(a, answer))
            self._own[key] = mem
        return self._own[key]


def own_answer(remembered: Sequence[int], answer: Sequence[int], *, prefix: int = 16) -> bool:
    """Whether a remembered answer is this prompt's own (an earlier run of it): both begin with
    the same ``prefix`` tokens (or all of the shorter one)."""
    n = min(prefix, len(remembered), len(answer))
    return n > 0 and list(remembered[:n]) == list(answer[:n])


def measure(runner: Runner, prompts: Sequence[torch.Tensor], cand: Candidate, *, pld: bool = False,
            on_prompt: Callable[[int, Measured], None] | None = None, offset: int = 0) -> Measured:
    """Interleaved per prompt: greedy, (prompt lookup,) autolade, in an order that alternates."""
    m = Measured()
    for i, ids in enumerate(prompts):
        key = offset + i
        runner.reference(key, ids)
        for what in rotate(["greedy", "ours", "pld"], i % 2):
            if what == "greedy":
                m.greedy_s.append(runner.greedy(ids))
            elif what == "pld" and pld:
                m.pld_s.append(runner.pld(ids))
            elif what == "ours":
                t, n, stats, gap = runner.ours(key, ids, cand)
                m.ours_s.append(t)
                m.tokens.append(n)
                m.steps.append(stats.steps)
                m.runs.append((ids.shape[1], stats))
                if gap is not None:
                    m.gaps.append(gap)
        if on_prompt is not None:
            on_prompt(i, m)
    return m


def bootstrap_ci(num: Sequence[float], den: Sequence[float], *, seed: int = 0, n: int = 2000) -> tuple[float, float]:
    """95% interval of sum(num)/sum(den) over prompts, by resampling prompts."""
    rng = random.Random(seed)
    idx = range(len(num))
    stats = sorted(
        sum(num[j] for j in pick) / sum(den[j] for j in pick)
        for pick in ([rng.choice(idx) for _ in idx] for _ in range(n))
    )
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]
