"""Runtime policies: what the next step drafts, decided from what the last steps accepted.

The decode loop calls ``plan()`` before a step and ``update(outcome)`` after it (the two-method
shape of transformers' candidate generators). A policy holds no model and never changes the
output: it only chooses how many tokens the verifier gets to check. The step types, the ``Policy``
protocol and the loop's default ``StaticPolicy`` live in ``autolade.engine.steps`` (re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autolade.config import MAX_PROMPT_LOOKUP, MAX_WINDOW, LookaheadConfig
from autolade.engine.steps import Policy, StaticPolicy, StepOutcome, StepPlan
from autolade.errors import ConfigError
from autolade.paths import repo_policies_dir

__all__ = ["NO_CURVE", "POLICIES", "AdaptiveParams", "AdaptivePolicy", "CostAwarePolicy", "DraftLength", "LookupPolicy",
           "Policy", "StaticPolicy", "StepOutcome", "StepPlan", "make_policy", "needs_cost"]


class DraftLength:
    """Prompt-lookup draft length, as transformers' assisted generation adapts it: +2 after a fully
    accepted draft, -1 after a partly rejected one, within [low, high]. Only steps whose longest
    draft hit the cap count: a draft cut short by the context's end or by a short match (scaled
    drafts) says nothing about the cap."""

    def __init__(self, *, start: int, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.value = min(max(start, low), high)

    def update(self, outcome: StepOutcome) -> None:
        if outcome.nodes.get("lookup", 0) == 0 or outcome.longest_draft < outcome.plan.draft_len:
            return
        if outcome.accepted_from == "lookup" and outcome.accepted >= outcome.plan.draft_len:
            self.value = min(self.value + 2, self.high)
        else:
            self.value = max(self.value - 1, self.low)


@dataclass(frozen=True)
class AdaptiveParams:
    """Knobs of the acceptance-driven policy (searched by the tuner)."""

    max_window: int = 8  # W never grows past this; G follows W (capped by the config's G)
    start_window: int = 3  # W of the first steps; 0 = start with the window off and let probes find one that pays
    min_draft: int = 2  # shortest prompt-lookup draft
    max_draft: int = 16  # longest prompt-lookup draft
    ema: float = 0.1  # weight of the newest step in each width's tokens/step and s/step averages
    margin: float = 1.02  # switch to a probed width only if its measured tokens/s is this much better
    probe_every: int = 16  # steps on the current width between probes of a neighbour
    probe_steps: int = 6  # steps one probe runs (long enough for the window's n-grams to pay)
    probe_backoff: float = 1.0  # a losing probe stretches the wait before the next by this (1 = fixed; a switch resets it)

    def __post_init__(self) -> None:
        for name, lo, hi in (
            ("max_window", 1, MAX_WINDOW),
            ("start_window", 0, MAX_WINDOW),
            ("min_draft", 0, MAX_PROMPT_LOOKUP),
            ("max_draft", 0, MAX_PROMPT_LOOKUP),
            ("probe_every", 1, 100000),
            ("probe_steps", 1, 1000),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(f"adaptive policy: {name} must be an integer in {lo}..{hi}, got {value!r}")
        if self.min_draft > self.max_draft:
            raise ConfigError("adaptive policy: min_draft must be <= max_draft")
        for name, lo, hi, closed in (("ema", 0.0, 1.0, False), ("margin", 0.5, 2.0, False),
                                     ("probe_backoff", 1.0, 4.0, True)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (ok and (lo <= value if closed else lo < value) and value <= hi):
                bracket = "[" if closed else "("
                raise ConfigError(f"adaptive policy: {name} must be a number in {bracket}{lo}, {hi}], got {value!r}")


class AdaptivePolicy:
    """Grows or shrinks the Jacobi window (and G with it) by what each width measurably delivers.

    Every width tried (0 = window off: prompt lookup alone, or plain greedy steps where nothing
    matches) keeps EMAs of tokens per step and seconds per step, so its throughput estimate is
    tokens/s as this machine really runs it: acceptance and the cost of the bigger packed step
    in one number. The policy stays on the best width; every ``probe_every`` steps it runs a
    neighbour (one wider, one narrower, or off) for ``probe_steps`` steps, so it follows the text
    as it moves (code repeats, prose does not) and comes back when the window pays again. It
    switches only for a gain above ``margin``; each probe that loses stretches the wait before the
    next by ``probe_backoff`` (up to 8x ``probe_every``), so a width that keeps winning is probed
    less and less. The output never changes: only the draft budget.
    """

    MAX_WAIT = 8  # probe waits stop growing at this many times probe_every

    name = "adaptive"

    def __init__(self, config: LookaheadConfig, params: AdaptiveParams | None = None) -> None:
        self.config = config
        self.params = p = params or AdaptiveParams()
        self.can_window = config.lookahead
        self.current = min(p.start_window, p.max_window) if self.can_window else 0
        self.draft = DraftLength(start=config.prompt_lookup, low=min(p.min_draft, config.prompt_lookup),
                                 high=min(p.max_draft, max(config.prompt_lookup, p.min_draft)))
        self.arms: dict[int, list[float]] = {}  # width -> [EMA tokens/step, EMA s/step, steps seen]
        self.since_probe = 0
        self.wait = float(p.probe_every)  # steps on the current width before the next probe
        self.probe: int | None = None  # width being probed
        self.probe_left = 0
        self._next_probe = 0  # rotates over the neighbours

    def _width(self) -> int:
        return self.probe if self.probe is not None else self.current

    def plan(self) -> StepPlan:
        w = self._width()
        d = self.draft.value if self.config.prompt_lookup else 0
        return StepPlan(window=w, guesses=min(w, self.config.guesses) if w else 0, draft_len=d,
                        drafts=self.config.prompt_lookup_drafts if d else 0, recycle=self.config.recycle)

    def throughput(self, w: int) -> float | None:
        arm = self.arms.get(w)
        return arm[0] / arm[1] if arm and arm[1] > 0 else None

    def update(self, outcome: StepOutcome) -> None:
        p = self.params
        self.draft.update(outcome)
        if not self.can_window:
            return
        w = outcome.plan.window
        arm = self.arms.get(w)
        tokens = outcome.accepted + 1
        if arm is None:
            self.arms[w] = [float(tokens), outcome.step_s, 1]
        else:
            rate = max(p.ema, 1.0 / (arm[2] + 1))  # plain mean for the first steps, then EMA
            arm[0] += rate * (tokens - arm[0])
            arm[1] += rate * (outcome.step_s - arm[1])
            arm[2] += 1
        if self.probe is not None:
            self.probe_left -= 1
            if self.probe_left <= 0:
                self._decide(self.probe)
                self.probe = None
            return
        self.since_probe += 1
        if self.since_probe >= self.wait:
            self.since_probe = 0
            options = self._neighbours()
            if options:
                self.probe = options[self._next_probe % len(options)]
                self._next_probe += 1
                self.probe_left = p.probe_steps

    def _neighbours(self) -> list[int]:
        c, top = self.current, self.params.max_window
        out = [w for w in (c + 1, c - 1) if 1 <= w <= top]
        if c != 0:
            out.append(0)
        return out

    def _decide(self, probed: int) -> None:
        p = self.params
        now, alt = self.throughput(self.current), self.throughput(probed)
        if alt is not None and (now is None or alt > now * p.margin):
            self.current = probed
            self.wait = float(p.probe_every)
        else:
            self.wait = min(self.wait * p.probe_backoff, float(p.probe_every * self.MAX_WAIT))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self.params)}


class LookupPolicy:
    """No Jacobi window at all: prompt-lookup drafts with an adaptive length, plain greedy steps when
    nothing matches. The right policy where a packed step costs ~2x a one-token step (fp32 on CPUs)."""

    name = "lookup"

    def __init__(self, config: LookaheadConfig, params: AdaptiveParams | None = None) -> None:
        p = params or AdaptiveParams()
        self.config = config
        self.draft = DraftLength(start=config.prompt_lookup, low=min(p.min_draft, config.prompt_lookup),
                                 high=min(p.max_draft, max(config.prompt_lookup, p.min_draft)))

    def plan(self) -> StepPlan:
        d = self.draft.value if self.config.prompt_lookup else 0
        return StepPlan(window=0, guesses=0, draft_len=d, drafts=self.config.prompt_lookup_drafts if d else 0,
                        recycle=self.config.recycle)

    def update(self, outcome: StepOutcome) -> None:
        self.draft.update(outcome)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}


class CostAwarePolicy:
    """Prompt lookup sized by the step-latency curve: no window; after an m-token suffix match it
    drafts the length L (0 = a plain greedy step) with the most expected tokens per millisecond,
    (1 + sum of P(at least i draft tokens accepted), i <= L) / c(1 + L x drafts found).

    The acceptance side is learned per match length as the generation goes (how often a draft that
    reached position i had its i-th token accepted), from a prior at each position that pools what
    every match length measured there around a low starting guess: on text with nothing to copy,
    drafts that fail after 1-token matches stop the drafts after 2-4-token ones too, instead of
    each match length paying for its own failures. It learns without paying for it: where it drafts
    nothing after a match, the engine hands it the draft it would have packed (``shadow``) and it
    scores that against the tokens the next steps emit, exactly what packing it would have
    accepted under greedy (under sampling, what the sampled output would have matched). So it can
    start pessimistic and draft once the text shows it copies (replayed over held-out greedy
    outputs: median per prompt 0.99x -> 1.11x greedy on the 0.5B Qwen fp32, 1.36x -> 1.40x on
    the 1.5B bf16, 1.47x -> 1.54x on SmolLM2 bf16; totals within +-2%). The cost side
    is this machine's measured c(k). Where c(k) is irregular (fp32 on the 2-core EPYC: 3 packed
    tokens cost 2x one, 8 cost 1.5x) that avoids the expensive sizes; replayed over
    held-out greedy outputs it ran 1.07x-1.09x static scaled lookup in fp32 and 0.99x-1.00x in bf16,
    whose curve is smooth (BENCHMARKS.md).

    The curve is where it starts, not what it believes to the end: each step's measured wall time
    corrects c(k) for its size class (1, 2-3, 4-7, ... packed tokens) by an EMA of measured / curve
    time, so a curve taken on a busier or different machine (the 0.5B Qwen's fp32 curve here said 8
    packed tokens cost 1.3x one; steps of that size ran at ~1.5x) stops steering it into steps that
    lose, and it falls back to plain greedy steps where drafting does not pay."""

    name = "cost-aware"
    LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # draft lengths it chooses among (capped by the config)
    PRIOR = 2.0  # pseudo-observations behind the prior of each (match length, position)'s acceptance
    POOL = 2.0  # pseudo-observations behind the starting guess in that prior, pooled over match lengths
    GUESS = (0.4, 0.3)  # starting guess of P(accept position i | i-1 accepted), i <= 2**m and beyond: low, shadows teach it for free
    MEASURED_EMA = 0.1  # weight of one step's measured/curve time ratio in its size class's estimate

    def __init__(self, config: LookaheadConfig, *, cost: Callable[[float], float]) -> None:
        self.config = config
        self.cost = cost  # c(k) in ms for a step of k packed tokens (a StepCurve's cost)
        self.max_len = config.prompt_lookup
        self.levels = max(config.prompt_lookup_ngram, 1)
        self.reached = [[0.0] * (self.max_len + 1) for _ in range(self.levels + 1)]  # [m][i]: offered with i-1 accepted
        self.passed = [[0.0] * (self.max_len + 1) for _ in range(self.levels + 1)]  # [m][i]: ... and accepted
        self.drafts_found = 1.0  # EMA of distinct drafts per step: packed ~ 1 + L x this
        self.measured: dict[int, float] = {}  # size class (packed.bit_length()) -> EMA of measured / curve time
        self.watching: list[tuple[int, list[tuple[int, ...]], int]] = []  # (m, shadow drafts still alive, tokens checked)
        self._pooled = self._pool()
        self.lens = tuple(self._best_length(m) for m in range(1, self.levels + 1))

    def step_cost(self, k: float) -> float:
        """c(k) from the curve, times what this run measured for steps of k's size class (classes
        not seen yet: the mean correction of those seen, so only measured differences reorder sizes)."""
        ratio = self.measured.get(max(1, round(k)).bit_length())
        if ratio is None:
            ratio = sum(self.measured.values()) / len(self.measured) if self.measured else 1.0
        return self.cost(k) * ratio

    def _observe(self, packed: int, seconds: float) -> None:
        curve_ms = self.cost(packed)
        if packed < 1 or not seconds > 0 or not curve_ms > 0:
            return
        key, ratio = packed.bit_length(), seconds * 1e3 / curve_ms
        old = self.measured.get(key)
        self.measured[key] = ratio if old is None else old + self.MEASURED_EMA * (ratio - old)

    def _best_length(self, m: int) -> int:
        reached, passed = self.reached[m], self.passed[m]
        pool_reached, pool_passed = self._pooled
        best, best_len, alive, expected, start = 1.0 / self.step_cost(1), 0, 1.0, 1.0, 1
        for length in (x for x in self.LENGTHS if x <= self.max_len):
            for i in range(start, length + 1):
                guess = self.GUESS[0] if i <= 2**m else self.GUESS[1]
                prior = (pool_passed[i] + self.POOL * guess) / (pool_reached[i] + self.POOL)
                alive *= (passed[i] + self.PRIOR * prior) / (reached[i] + self.PRIOR)
                expected += alive
            start = length + 1
            rate = expected / self.step_cost(1 + length * self.drafts_found)
            if rate > best:
                best, best_len = rate, length
        return best_len

    def plan(self) -> StepPlan:
        if not self.max_len:
            return StepPlan(window=0, guesses=0, draft_len=0, drafts=0)
        return StepPlan(window=0, guesses=0, draft_len=max(self.lens), drafts=self.config.prompt_lookup_drafts,
                        draft_lens=self.lens, shadow_len=self.max_len)

    def update(self, outcome: StepOutcome) -> None:
        self._observe(outcome.packed, outcome.step_s)
        m, longest = outcome.match_len, outcome.longest_draft
        if longest and 1 <= m <= self.levels:  # a lookup draft ran: count what of it was accepted
            accepted = outcome.accepted if outcome.accepted_from == "lookup" else 0
            reached, passed = self.reached[m], self.passed[m]
            for i in range(1, min(accepted + 1, longest) + 1):
                reached[i] += 1
                passed[i] += i <= accepted
            self.drafts_found += 0.1 * (outcome.nodes.get("lookup", 0) / longest - self.drafts_found)
        elif outcome.shadow and 1 <= m <= self.levels:  # drafts it chose not to pack: watch what follows
            self.watching.append((m, list(outcome.shadow), 0))
        self._watch(outcome.emitted)
        self._pooled = self._pool()
        self.lens = tuple(self._best_length(k) for k in range(1, self.levels + 1))  # every step: costs move too

    def _watch(self, tokens: tuple[int, ...]) -> None:
        """Score the watched shadow drafts against the tokens the step appended, as a packed draft
        would have been scored: position i reached when i-1 were accepted, passed when one draft's
        i-th token is the output's (under greedy exactly what packing them would have accepted)."""
        still = []
        for m, drafts, done in self.watching:
            for tok in tokens:
                drafts = [d for d in drafts if len(d) > done]
                if not drafts:
                    break
                done += 1
                self.reached[m][done] += 1
                drafts = [d for d in drafts if d[done - 1] == tok]
                if not drafts:
                    break
                self.passed[m][done] += 1
            if drafts and any(len(d) > done for d in drafts):
                still.append((m, drafts, done))
        self.watching = still

    def _pool(self) -> tuple[list[float], list[float]]:
        """(reached, passed) per draft position, summed over every match length."""
        return ([sum(row[i] for row in self.reached) for i in range(self.max_len + 1)],
                [sum(row[i] for row in self.passed) for i in range(self.max_len + 1)])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}


NO_CURVE = ("the cost-aware policy needs this machine's step-latency curve: run "
            "`autolade profile --model MODEL --dtype DTYPE` once, or choose another policy")
POLICIES = {"static": StaticPolicy, "adaptive": AdaptivePolicy, "lookup": LookupPolicy, "cost-aware": CostAwarePolicy}


def make_policy(spec: str | dict | None, config: LookaheadConfig, *, cost: Callable[[float], float] | None = None):
    """A policy from a name ("adaptive"), a preset file in ``policies/`` ("adaptive-cpu"), a JSON
    path, or a dict {"name": ..., **params}. None = static. ``cost``: this machine's c(k) in ms
    (``StepCurve.cost``), which the cost-aware policy needs."""
    if spec is None:
        return StaticPolicy(config)
    if isinstance(spec, str):
        spec = _preset(spec)
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ConfigError('a policy spec must be a name or an object {"name": ..., params...}')
    data = dict(spec)
    name = data.pop("name")
    data.pop("description", None)
    cls = POLICIES.get(name)
    if cls is None:
        raise ConfigError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    if cls is StaticPolicy:
        if data:
            raise ConfigError(f"the static policy takes no parameters, got {sorted(data)}")
        return StaticPolicy(config)
    if cls is CostAwarePolicy:
        if data:
            raise ConfigError(f"the cost-aware policy takes no parameters, got {sorted(data)}")
        if cost is None:
            raise ConfigError(NO_CURVE)
        return CostAwarePolicy(config, cost=cost)
    known = {f.name for f in fields(AdaptiveParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {name} policy parameter(s) {unknown}; known: {sorted(known)}")
    return cls(config, AdaptiveParams(**data))


def needs_cost(spec: str | dict | None) -> bool:
    """Whether ``make_policy(spec, ...)`` needs this machine's c(k) (the cost-aware policy)."""
    if isinstance(spec, str):
        spec = _preset(spec)
    return isinstance(spec, dict) and spec.get("name") == CostAwarePolicy.name


def _preset(name: str) -> dict | str:
    if name in POLICIES:
        return {"name": name}
    path = Path(name)
    if path.suffix != ".json":
        path = repo_policies_dir() / f"{name}.json"
    if not path.is_file():
        presets = sorted(p.stem for p in repo_policies_dir().glob("*.json"))
        raise ConfigError(f"unknown policy {name!r}: not a built-in ({', '.join(POLICIES)}), "
                          f"a preset ({', '.join(presets) or 'none'}) or a .json file")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"policy file {path} is not valid JSON: {exc}") from None
    return data
