"""What ``autolade tune`` searches: its options, the define-by-run search space of W/N/G and the
runtime policy, the trials it runs first, and the finalists it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autolade.config import LookaheadConfig
from autolade.errors import ConfigError
from autolade.runtime.policies import AdaptiveParams
from autolade.tuning.trials import Candidate

PAPER_A100_7B = {"window": 15, "ngram": 5, "guesses": 15}  # the paper's table for 7B models on an A100


@dataclass(frozen=True)
class TuneOptions:
    """What one tuning run does."""

    trials: int = 40  # trials in the study in all (a resumed study runs only the missing ones)
    budget_s: float | None = None  # stop starting new trials after this many seconds
    max_new_tokens: int = 64  # tokens per prompt per run; enough for acceptance to settle
    tune_prompts: int = 5  # prompts each trial runs (from the tuning split)
    holdout_prompts: int = 8  # prompts the winner is re-measured on (held-out split)
    finalists: int = 3  # best trials re-measured on the held-out split
    max_window: int = 8  # search bound for W (also bounded by the step-latency curve)
    max_ngram: int = 6  # search bound for N
    search_policy: bool = True  # search the runtime policy (static/adaptive/lookup/cost-aware) and its knobs
    search_cost_aware: bool = True  # offer the cost-aware policy (tune() turns it off when it has no step curve)
    memory: bool = False  # trials also draft from the stored n-gram memory of this model and workload (read only)
    seed: int = 0  # sampler seed and split seed

    def __post_init__(self) -> None:
        for name in ("trials", "max_new_tokens", "tune_prompts", "holdout_prompts", "finalists", "max_window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if not 2 <= self.max_ngram <= 16:
            raise ConfigError(f"max_ngram must be in 2..16, got {self.max_ngram}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ConfigError("budget must be positive (e.g. --budget 20m)")


def suggest(trial, opts: TuneOptions, max_window: int) -> Candidate:
    """Define-by-run search space; W=0 (no window) and plain greedy are always inside it."""
    window = trial.suggest_int("window", 0, max_window)
    ngram = trial.suggest_int("ngram", 2, opts.max_ngram) if window else 4
    guesses = trial.suggest_int("guesses", 0, max_window) if window else 0
    lookup = trial.suggest_categorical("prompt_lookup", [0, 4, 6, 8, 10, 12, 16])
    drafts = trial.suggest_int("prompt_lookup_drafts", 1, 3) if lookup else 1
    scaled = trial.suggest_categorical("prompt_lookup_scaled", [False, True]) if lookup else False
    recycle = trial.suggest_categorical("recycle", [0, 8, 16, 32])  # at most; the step curve cuts what does not pay
    config = LookaheadConfig(window=window, ngram=ngram, guesses=guesses, prompt_lookup=lookup,
                             prompt_lookup_drafts=drafts, prompt_lookup_scaled=scaled,
                             prompt_lookup_ngram=4 if scaled else 3, recycle=recycle)  # scaled: matches of 1..4 draft 2..16
    policy = None
    if opts.search_policy and not config.greedy_only:
        name = trial.suggest_categorical("policy", ["static", "adaptive", "lookup"])
        if name == "adaptive" and window:
            policy = {
                "name": "adaptive",
                "max_window": trial.suggest_int("max_window", 1, max_window),
                "start_window": 0 if trial.suggest_categorical("start_off", [False, True]) else min(window, max_window),
                "margin": trial.suggest_float("margin", 0.9, 1.2),
                "probe_every": trial.suggest_categorical("probe_every", [16, 32, 64]),
                "probe_backoff": trial.suggest_categorical("probe_backoff", [1.0, 2.0]),
            }
        elif name == "lookup" and lookup:
            if trial.suggest_categorical("lookup_sizing", ["length", "cost"]) == "cost" and opts.search_cost_aware:
                policy = {"name": "cost-aware"}  # sizes drafts by the step curve (needs one: tune() has it)
            else:
                policy = {"name": "lookup", "max_draft": max(lookup, AdaptiveParams().min_draft)}
    return Candidate(config, policy)


def candidate_from_params(params: dict[str, Any], opts: TuneOptions) -> Candidate:
    """Rebuild a candidate from a finished trial's params (the same rules as ``suggest``)."""

    class Fixed:
        def suggest_int(self, name, lo, hi):
            return params[name]

        def suggest_float(self, name, lo, hi):
            return params[name]

        def suggest_categorical(self, name, choices):
            return params.get(name, choices[0])  # a parameter added after the trial ran: its first choice

    return suggest(Fixed(), opts, max(params.get("window", 0), params.get("max_window", 0), params.get("guesses", 0), 1))


def pick_finalists(ranked: Sequence[dict[str, Any]], opts: TuneOptions) -> list[Candidate]:
    """The best ``opts.finalists`` distinct behaviours among trial params ranked best first (trials of the
    lookup policy that differ only in the W/N/G it ignores are one behaviour)."""
    out: list[Candidate] = []
    for params in ranked:
        cand = candidate_from_params(params, opts)
        if len(out) < opts.finalists and cand.label() not in {c.label() for c in out}:
            out.append(cand)
    return out


def warm_starts(curve, best_existing: dict | None, max_window: int) -> list[dict[str, Any]]:
    """Trials to run first: greedy, prompt lookup alone (fixed, scaled, and sized by the curve), the
    stored best, and the paper's table scaled to this machine's spare compute (k within 1.25x of c(1))."""
    starts: list[dict[str, Any]] = [
        {"window": 0, "prompt_lookup": 0},
        {"window": 0, "prompt_lookup": 10, "prompt_lookup_drafts": 1, "prompt_lookup_scaled": False, "policy": "static"},
        {"window": 0, "prompt_lookup": 16, "prompt_lookup_drafts": 3, "prompt_lookup_scaled": True, "policy": "static"},
    ]
    if curve is not None:
        # the same drafts sized per match length by this curve (the cost-aware policy)
        starts.append({"window": 0, "prompt_lookup": 16, "prompt_lookup_drafts": 3, "prompt_lookup_scaled": True,
                       "policy": "lookup", "lookup_sizing": "cost"})
        spare = max(curve.spare_compute(), 1)
        # the paper packs 1 + 2*W*(N-1) tokens; keep N=5's shape, shrink W until it fits the spare compute
        n = PAPER_A100_7B["ngram"] if spare >= 17 else 3
        w = max(1, min(max_window, (spare - 1) // (2 * (n - 1)) or 1))
        starts.append({"window": w, "ngram": n, "guesses": w, "prompt_lookup": 10, "prompt_lookup_drafts": 1,
                       "prompt_lookup_scaled": False, "policy": "static"})
    if best_existing:
        starts.insert(0, best_existing)
    return starts

def curve_max_window(curve, opts: TuneOptions) -> int:
    """W beyond which even N=2 packs more than 4x c(1) costs: never worth a trial."""
    if curve is None:
        return opts.max_window
    w = opts.max_window
    while w > 1 and curve.cost(1 + 2 * w) > 4 * curve.cost(1):
        w -= 1
    return w


def params_of(config: LookaheadConfig, policy: dict | None) -> dict[str, Any]:
    """Trial params that rebuild ``config`` under ``policy`` (``candidate_from_params``)."""
    params: dict[str, Any] = {"window": config.window, "prompt_lookup": config.prompt_lookup, "recycle": config.recycle}
    if config.window:
        params.update(ngram=config.ngram, guesses=config.guesses)
    if config.prompt_lookup:
        params["prompt_lookup_drafts"] = config.prompt_lookup_drafts
        params["prompt_lookup_scaled"] = config.prompt_lookup_scaled
    if not config.greedy_only:
        params["policy"] = (policy or {"name": "static"})["name"]
    return params
