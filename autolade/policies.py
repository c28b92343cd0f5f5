"""Runtime policies: what the next step drafts, decided from what the last steps accepted.

The decode loop calls ``plan()`` before a step and ``update(outcome)`` after it (the two-method
shape of transformers' candidate generators). A policy holds no model and never changes the
output: it only chooses how many tokens the verifier gets to check.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from .config import MAX_PROMPT_LOOKUP, MAX_WINDOW, LookaheadConfig
from .errors import ConfigError
from .paths import repo_policies_dir


@dataclass(frozen=True)
class StepPlan:
    """What one step packs."""

    window: int  # W for this step; 0 = no lookahead branch (the window state is kept, not reset)
    guesses: int  # G: pool n-grams to verify
    draft_len: int  # longest prompt-lookup draft; 0 = none
    drafts: int  # prompt-lookup drafts (distinct earlier occurrences)


@dataclass(frozen=True)
class StepOutcome:
    """What one step did; ``accepted`` counts draft tokens accepted, the bonus token not included."""

    plan: StepPlan
    packed: int  # tokens in the forward (1 = plain greedy step)
    lookup_nodes: int  # draft-tree nodes from prompt lookup
    pool_nodes: int  # draft-tree nodes added by pool n-grams (beyond shared prefixes)
    window_tokens: int  # lookahead-branch tokens in the forward
    accepted: int
    accepted_from: str  # "none", "lookup" (prompt-lookup draft) or "pool" (a pool n-gram or its extension)
    step_s: float  # wall time of the whole step
    forward_s: float  # wall time of the model forward alone


class Policy(Protocol):
    name: str

    def plan(self) -> StepPlan: ...

    def update(self, outcome: StepOutcome) -> None: ...


class StaticPolicy:
    """Every step as the config says (the paper's fixed W/N/G)."""

    name = "static"

    def __init__(self, config: LookaheadConfig) -> None:
        look = config.lookahead
        self._plan = StepPlan(
            window=config.window if look else 0,
            guesses=config.guesses if look else 0,
            draft_len=config.prompt_lookup,
            drafts=config.prompt_lookup_drafts if config.prompt_lookup else 0,
        )

    def plan(self) -> StepPlan:
        return self._plan

    def update(self, outcome: StepOutcome) -> None:
        pass

    def to_dict(self) -> dict:
        return {"name": self.name}


# Packed sizes at which the cost model keeps a running estimate; costs in between are interpolated.
_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class CostModel:
    """Relative step cost c(k)/c(1), seeded from a measured step-latency curve and refined online.

    Without a curve the prior is a gentle slope (2% per packed token); every observed step moves
    its bucket's estimate (EMA), so the model follows what this machine really does.
    """

    def __init__(self, curve_ms: dict[int, float] | None = None, *, prior_slope: float = 0.02, ema: float = 0.2):
        self.ema = ema
        self._ms: dict[int, float] = {}
        if curve_ms:
            ks = sorted(int(k) for k in curve_ms)
            for b in _BUCKETS:
                self._ms[b] = _interp(ks, [float(curve_ms[k]) for k in ks], b)
        self.prior_slope = prior_slope
        self._seen: dict[int, float] = {}

    def observe(self, k: int, seconds: float) -> None:
        b = _bucket(k)
        ms = seconds * 1e3
        old = self._seen.get(b)
        self._seen[b] = ms if old is None else old + self.ema * (ms - old)

    def cost(self, k: int) -> float:
        """Cost of a k-token step relative to a one-token step."""
        c1 = self._estimate(1)
        return self._estimate(k) / c1 if c1 > 0 else 1.0

    def _estimate(self, k: int) -> float:
        known = {**self._ms, **self._seen}
        if not known:
            return 1.0 + self.prior_slope * (k - 1)
        ks = sorted(known)
        if k < ks[0] or (len(ks) == 1 and k != ks[0]):
            base = known[ks[0]] / (1.0 + self.prior_slope * (ks[0] - 1))
            return base * (1.0 + self.prior_slope * (k - 1))
        return _interp(ks, [known[x] for x in ks], k)


def _bucket(k: int) -> int:
    i = bisect.bisect_left(_BUCKETS, k)
    if i == len(_BUCKETS):
        return _BUCKETS[-1]
    if i > 0 and k - _BUCKETS[i - 1] < _BUCKETS[i] - k:
        return _BUCKETS[i - 1]
    return _BUCKETS[i]


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    # beyond the last point: extend the last segment's slope
    if len(xs) == 1:
        return ys[0]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (x - xs[-1])


class DraftLength:
    """Prompt-lookup draft length, as transformers' assisted generation adapts it: +2 after a fully
    accepted draft, -1 after a partly rejected one, within [low, high]."""

    def __init__(self, *, start: int, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.value = min(max(start, low), high)

    def update(self, outcome: StepOutcome) -> None:
        if outcome.lookup_nodes == 0:
            return
        if outcome.accepted_from == "lookup" and outcome.accepted >= outcome.plan.draft_len:
            self.value = min(self.value + 2, self.high)
        else:
            self.value = max(self.value - 1, self.low)


@dataclass(frozen=True)
class AdaptiveParams:
    """Knobs of the acceptance-driven policy (searched by the tuner)."""

    max_window: int = 8  # W never grows past this; G follows W (the paper's G = W)
    start_window: int = 3  # W of the first steps
    min_draft: int = 2  # shortest prompt-lookup draft
    max_draft: int = 16  # longest prompt-lookup draft
    ema: float = 0.15  # weight of the newest step in the acceptance averages
    margin: float = 1.0  # the window stays on while predicted throughput with it / without it >= margin
    probe_every: int = 32  # steps between probes while the window is off
    probe_steps: int = 4  # steps one probe runs the window

    def __post_init__(self) -> None:
        for name, lo, hi in (
            ("max_window", 1, MAX_WINDOW),
            ("start_window", 1, MAX_WINDOW),
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
        for name, lo, hi in (("ema", 0.0, 1.0), ("margin", 0.5, 2.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < value <= hi:
                raise ConfigError(f"adaptive policy: {name} must be a number in ({lo}, {hi}], got {value!r}")


class AdaptivePolicy:
    """Grows or shrinks the Jacobi window (and G with it) from recent acceptance against the cost
    of a bigger packed step; turns the window off when it does not pay (prompt lookup alone, or
    plain greedy steps when there is nothing to draft) and probes it again now and then.

    Throughput model: tokens per step = 1 + lookup gain + pool gain(W), with pool gain measured
    as an EMA while the window runs and assumed to grow like sqrt(W); cost from ``CostModel``.
    """

    name = "adaptive"

    def __init__(self, config: LookaheadConfig, params: AdaptiveParams | None = None, *, curve_ms=None) -> None:
        self.config = config
        self.params = p = params or AdaptiveParams()
        self.costs = CostModel(curve_ms)
        self.levels = config.levels
        self.can_window = config.lookahead
        self.window = min(p.start_window, p.max_window) if self.can_window else 0
        self.draft = DraftLength(start=config.prompt_lookup, low=min(p.min_draft, config.prompt_lookup),
                                 high=min(p.max_draft, max(config.prompt_lookup, p.min_draft)))
        self.lookup_gain = 0.0  # EMA of lookup-accepted tokens per step
        self.pool_gain = 0.5  # EMA of pool-accepted tokens per window step (optimistic start)
        self.off_steps = 0  # steps since the window was switched off
        self.probe_left = 0

    def plan(self) -> StepPlan:
        w = self.window if (self.window > 0 or self.probe_left > 0) else 0
        if self.probe_left > 0:
            w = max(w, 1)
        d = self.draft.value if self.config.prompt_lookup else 0
        return StepPlan(window=w, guesses=min(w, self.config.guesses) if w else 0, draft_len=d,
                        drafts=self.config.prompt_lookup_drafts if d else 0)

    def _packed(self, w: int, base: int) -> int:
        return base + (self.levels * w + min(w, self.config.guesses) * self.levels if w else 0)

    def _throughput(self, w: int, base: int, w_now: int) -> float:
        gain = self.pool_gain * (w / max(w_now, 1)) ** 0.5 if w else 0.0
        return (1.0 + self.lookup_gain + gain) / self.costs.cost(self._packed(w, base))

    def update(self, outcome: StepOutcome) -> None:
        p = self.params
        self.costs.observe(outcome.packed, outcome.step_s)
        self.draft.update(outcome)
        lookup = outcome.accepted if outcome.accepted_from == "lookup" else 0
        self.lookup_gain += p.ema * (lookup - self.lookup_gain)
        w_now = outcome.plan.window
        if not self.can_window:
            return
        if w_now == 0:
            self.off_steps += 1
            if self.window == 0 and self.off_steps >= p.probe_every:
                self.off_steps, self.probe_left = 0, p.probe_steps
            return
        pool = outcome.accepted if outcome.accepted_from == "pool" else 0
        self.pool_gain += p.ema * (pool - self.pool_gain)
        if self.probe_left > 0:
            self.probe_left -= 1
            if self.probe_left > 0:
                return
            self.window = w_now  # probe over: decide below whether to keep it
        base = 1 + outcome.lookup_nodes
        options = [w for w in (w_now - 1, w_now, w_now + 1) if 1 <= w <= p.max_window]
        best = max(options, key=lambda w: self._throughput(w, base, w_now))
        if self._throughput(best, base, w_now) < p.margin * self._throughput(0, base, w_now):
            self.window, self.off_steps = 0, 0
        else:
            self.window = best

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self.params)}


class LookupPolicy:
    """No Jacobi window at all: prompt-lookup drafts with an adaptive length, plain greedy steps when
    nothing matches. The right policy where a packed step costs ~2x a one-token step (fp32 on CPUs)."""

    name = "lookup"

    def __init__(self, config: LookaheadConfig, params: AdaptiveParams | None = None, **_: Any) -> None:
        p = params or AdaptiveParams()
        self.config = config
        self.draft = DraftLength(start=config.prompt_lookup, low=min(p.min_draft, config.prompt_lookup),
                                 high=min(p.max_draft, max(config.prompt_lookup, p.min_draft)))

    def plan(self) -> StepPlan:
        d = self.draft.value if self.config.prompt_lookup else 0
        return StepPlan(window=0, guesses=0, draft_len=d, drafts=self.config.prompt_lookup_drafts if d else 0)

    def update(self, outcome: StepOutcome) -> None:
        self.draft.update(outcome)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}


POLICIES = {"static": StaticPolicy, "adaptive": AdaptivePolicy, "lookup": LookupPolicy}


def make_policy(spec: str | dict | None, config: LookaheadConfig, *, curve_ms: dict[int, float] | None = None):
    """A policy from a name ("adaptive"), a preset file in ``policies/`` ("adaptive-cpu"), a JSON
    path, or a dict {"name": ..., **params}. None = static."""
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
    known = {f.name for f in fields(AdaptiveParams)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {name} policy parameter(s) {unknown}; known: {sorted(known)}")
    return cls(config, AdaptiveParams(**data), curve_ms=curve_ms)


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
