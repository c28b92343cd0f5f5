"""Offline replay of prompt-lookup drafting rules over known greedy outputs, priced by the step curve.

Greedy output does not depend on how it was drafted, so one greedy run per prompt lets any drafting
rule be replayed without the model: each step the rule drafts from the context, the step accepts
the longest draft prefix that matches the known continuation (plus the bonus token), and it costs
c(packed tokens) from the measured step-latency curve. That puts numbers on what a runtime policy
could gain by sizing drafts per step: ``replay(..., oracle=True)`` knows each step's accepted
length and packs exactly the accepted tokens, which no policy can beat with the same drafts.

Not modelled: the engine's own per-step overhead (0.4%-2.4% of a step, BENCHMARKS.md) and the
Jacobi window (its n-grams need the model's forwards).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autolade.config import LookaheadConfig
from autolade.engine.layout import DraftTree
from autolade.engine.memory import AnswerMemory, MemorySource
from autolade.engine.prompt_lookup import SuffixIndex
from autolade.engine.steps import StepOutcome, StepPlan
from autolade.errors import ConfigError
from autolade.records.curve import StepCurve
from autolade.runtime.policies import CostAwarePolicy, LookupPolicy


@dataclass(frozen=True)
class Trace:
    """One greedy generation: the prompt's token ids and the new tokens greedy decoding produced."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class ReplayResult:
    name: str
    tokens: int  # new tokens decoded by steps (all but the first, which the prefill gives)
    steps: int
    packed: int  # tokens packed into the forwards, all steps (1 per plain greedy step)
    time_ms: float  # sum over steps of c(packed)
    greedy_ms: float  # tokens x c(1): the same tokens decoded one per step

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def packed_per_step(self) -> float:
        return self.packed / self.steps if self.steps else 0.0

    @property
    def speedup(self) -> float:
        """Predicted speedup over greedy (forwards only)."""
        return self.greedy_ms / self.time_ms if self.time_ms else 0.0


class DraftRule(Protocol):
    name: str
    max_ngram: int  # longest suffix the rule's index matches

    def drafts(self, index: SuffixIndex) -> list[tuple[int, ...]]: ...

    def update(self, drafts: list[tuple[int, ...]], accepted: int) -> None: ...


class Lookup:
    """autolade's prompt lookup: ``drafts`` most recent continuations of the longest suffix match,
    ``length`` tokens each, or 2**m tokens for an m-token match when ``scaled``."""

    def __init__(self, *, length: int, drafts: int = 1, scaled: bool = False, max_ngram: int = 4) -> None:
        self.length, self.n_drafts, self.scaled, self.max_ngram = length, drafts, scaled, max_ngram
        self.name = f"lookup {length}x{drafts}{'s' if scaled else ''} (n-gram <= {max_ngram})"

    def drafts(self, index: SuffixIndex) -> list[tuple[int, ...]]:
        return index.drafts(max_len=self.length, max_drafts=self.n_drafts, scaled=self.scaled)[0]

    def update(self, drafts: list[tuple[int, ...]], accepted: int) -> None:
        pass


class HFPromptLookup:
    """transformers' prompt lookup decoding: one draft of ``length`` tokens after the *earliest*
    occurrence of the longest suffix of at most ``max_ngram`` (2) tokens."""

    def __init__(self, *, length: int = 10, max_ngram: int = 2) -> None:
        self.length, self.max_ngram = length, max_ngram
        self.name = f"HF prompt lookup {length} (n-gram <= {max_ngram})"

    def drafts(self, index: SuffixIndex) -> list[tuple[int, ...]]:
        m, ends = index.match()
        return index.continuations(ends[-1:], length=self.length, max_drafts=1) if m else []

    def update(self, drafts: list[tuple[int, ...]], accepted: int) -> None:
        pass


class WithMemory:
    """A rule's drafts plus the n-gram memory's, drafted by the engine's own ``MemorySource`` (each
    draft cut to the length it has earned, scored against what follows): the memory's drafts go
    into the tree after the rule's, as in the engine. ``only_unmatched``: consult the memory only
    on steps where the rule drafts nothing."""

    PLAN = StepPlan(window=0, guesses=0, draft_len=1, drafts=1)  # any plan that drafts: the memory sizes its own

    def __init__(self, base: DraftRule, memory: AnswerMemory, *, only_unmatched: bool = False,
                 token_cost: float | None = None) -> None:
        self.base, self.memory, self.only_unmatched = base, memory, only_unmatched
        self.source = MemorySource(memory, token_cost=token_cost)  # token_cost: as the engine gets it from the curve
        self._seen = 0  # context tokens already given to the source
        self.max_ngram = base.max_ngram
        self.name = f"{base.name} + memory ({len(memory)} answers{', unmatched steps' if only_unmatched else ''})"

    def drafts(self, index: SuffixIndex) -> list[tuple[int, ...]]:
        self.source.update(tokens=index.tokens[self._seen :])
        self._seen = len(index.tokens)
        drafts = self.base.drafts(index)
        if drafts and self.only_unmatched:
            return drafts
        return drafts + self.source.get_candidates(plan=self.PLAN, last=index.tokens[-1]).drafts

    def update(self, drafts: list[tuple[int, ...]], accepted: int) -> None:
        self.base.update(drafts, accepted)


class PolicyLookup:
    """A prompt-lookup runtime policy (``lookup``, ``cost-aware``: no window) as a replay rule: each
    step drafts what the policy's plan asks for and tells the policy what was accepted, as the engine
    does (one call late: a step's ``emitted`` tokens are known when the next step drafts)."""

    def __init__(self, policy: Any, *, max_ngram: int, scaled: bool = False, name: str | None = None) -> None:
        self.policy, self.max_ngram, self.scaled = policy, max_ngram, scaled
        self.name = name or f"policy {policy.name} (n-gram <= {max_ngram})"
        self._plan: StepPlan | None = None
        self._m = 0
        self._shadow: tuple[tuple[int, ...], ...] = ()
        self._mark = 0  # context length when the last step drafted
        self._outcome: dict[str, Any] | None = None  # the last step's outcome, less the tokens it emitted

    def drafts(self, index: SuffixIndex) -> list[tuple[int, ...]]:
        if self._outcome is not None:
            self.policy.update(StepOutcome(**self._outcome, emitted=tuple(index.tokens[self._mark :])))
            self._outcome = None
        self._plan = plan = self.policy.plan()
        drafts, self._m, self._shadow = index.for_plan(plan, scaled=self.scaled)
        self._mark = len(index.tokens)
        return drafts

    def update(self, drafts: list[tuple[int, ...]], accepted: int) -> None:
        tree = DraftTree(0)
        for d in drafts:
            tree.add(d)
        longest = max((len(d) for d in drafts), default=0)
        self._outcome = dict(plan=self._plan, packed=len(tree), nodes={"lookup": len(tree) - 1},
                             window_tokens=0, accepted=accepted, accepted_from="lookup" if accepted else "none",
                             step_s=0.0, forward_s=0.0, longest_draft=longest, match_len=self._m, shadow=self._shadow)


def CostAwareLookup(curve: StepCurve, *, drafts: int = 3, max_ngram: int = 4, max_len: int = 16) -> PolicyLookup:
    """The ``cost-aware`` runtime policy (``autolade.runtime.policies.CostAwarePolicy``) as a replay rule:
    per match length m it learns how often each draft position is accepted and drafts the length
    with the most expected tokens per ms under the curve (0 = a plain greedy step)."""
    config = LookaheadConfig(window=0, guesses=0, prompt_lookup=max_len, prompt_lookup_drafts=drafts,
                             prompt_lookup_ngram=max_ngram)
    return PolicyLookup(CostAwarePolicy(config, cost=curve.cost), max_ngram=max_ngram,
                        name=f"cost-aware lookup x{drafts} (online, per match length)")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def replay_trace(rule: DraftRule, trace: Trace, *, oracle: bool = False) -> list[tuple[int, int]]:
    """(packed tokens, accepted draft tokens) of every step ``rule`` takes over one greedy trace."""
    out = trace.output
    index = SuffixIndex(max_ngram=rule.max_ngram)
    index.extend(trace.prompt)
    index.extend(out[:1])
    pos, steps = 1, []  # out[:pos] is decided
    while pos < len(out):
        drafts = rule.drafts(index)
        room = len(out) - pos - 1  # the step's bonus token must exist
        hits = [min(_common(d, out[pos:]), room) for d in drafts]
        accepted = max(hits, default=0)
        rule.update(drafts, accepted)
        if oracle:
            drafts = [drafts[hits.index(accepted)][:accepted]] if accepted else []
        tree = DraftTree(index.tokens[-1])
        for d in drafts:
            tree.add(d)
        index.extend(out[pos : pos + accepted + 1])
        pos += accepted + 1
        steps.append((len(tree), accepted))
    return steps


def replay(make_rule: Callable[[], DraftRule], traces: Sequence[Trace], curve: StepCurve, *,
           oracle: bool = False, name: str | None = None) -> ReplayResult:
    """Replay a drafting rule (a fresh one per trace) over greedy traces; ``oracle``: keep only the
    draft that wins each step, cut to its accepted length (the most any per-step sizing of this
    rule's drafts could save)."""
    if not traces:
        raise ConfigError("replay needs at least one trace (a prompt and its greedy output)")
    tokens = steps = packed = 0
    time_ms = 0.0
    rule_name = ""
    for trace in traces:
        rule = make_rule()
        rule_name = rule.name
        for k, _ in replay_trace(rule, trace, oracle=oracle):
            steps += 1
            packed += k
            time_ms += curve.cost(k)
        tokens += len(trace.output) - 1
    label = name or (f"{rule_name}, oracle-sized" if oracle else rule_name)
    return ReplayResult(name=label, tokens=tokens, steps=steps, packed=packed, time_ms=time_ms,
                        greedy_ms=tokens * curve.cost(1))


def lookup_rule(config: LookaheadConfig, policy: str = "static") -> DraftRule:
    """The replay rule of a prompt-lookup-only config, static or driven by the ``lookup`` policy (what
    the engine's PromptLookupSource drafts under that policy)."""
    if config.lookahead:
        raise ConfigError("only prompt-lookup settings replay without the model: a Jacobi window needs its forwards")
    max_ngram = max(config.prompt_lookup_ngram, 1)
    if policy == "lookup":
        return PolicyLookup(LookupPolicy(config), max_ngram=max_ngram, scaled=config.prompt_lookup_scaled)
    if policy != "static":
        raise ConfigError(f"policy {policy!r} does not replay from acceptance alone; static and lookup do")
    return Lookup(length=config.prompt_lookup, drafts=config.prompt_lookup_drafts if config.prompt_lookup else 0,
                  scaled=config.prompt_lookup_scaled, max_ngram=max_ngram)


def bound_results(traces: Sequence[Trace], curve: StepCurve) -> list[ReplayResult]:
    """The comparison tools/draft_bound.py prints: HF prompt lookup, fixed and scaled lookup (the CPU
    built-in default), the online cost-aware rule, and two oracle-sized bounds."""
    scaled = lambda: Lookup(length=16, drafts=3, scaled=True)
    return [
        replay(lambda: HFPromptLookup(length=10), traces, curve),
        replay(lambda: Lookup(length=10, drafts=1), traces, curve),
        replay(scaled, traces, curve),
        replay(lambda: CostAwareLookup(curve), traces, curve),
        replay(scaled, traces, curve, oracle=True),
        replay(lambda: Lookup(length=32, drafts=8), traces, curve, oracle=True),
    ]


def bound_report(sets: dict[str, Sequence[Trace]], curve: StepCurve) -> str:
    """Markdown tables of ``bound_results`` per prompt set, ratios against the scaled lookup."""
    ks = [1, 4, 8, 16, 32, 48]
    lines = [f"step curve ({curve.dtype}, ms): " + ", ".join(f"c({k})={curve.cost(k):.1f}" for k in ks)]
    for set_name, traces in sets.items():
        results = bound_results(traces, curve)
        base = results[2].speedup
        lines += ["", f"**{set_name}** ({len(traces)} prompts, {results[0].tokens} tokens)", "",
                  "| rule | tok/step | packed/step | x greedy (curve) | x scaled lookup |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r.name} | {r.tokens_per_step:.3f} | {r.packed_per_step:.1f} | {r.speedup:.3f} | "
                  f"{r.speedup / base:.3f} |" for r in results]
    return "\n".join(lines)
