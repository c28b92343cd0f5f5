"""``autolade tune``: an Optuna search of W/N/G (and the runtime policy) against measured speed.

Each trial runs the tuning prompts, every one interleaved with plain greedy (``model.generate``),
so the objective is a ratio to greedy and machine drift cancels. Outputs are checked against the
greedy reference: a divergence that is not float noise (the reference's top-2 logit gap there is
above the dtype's noise) fails the trial. The winner is re-measured on a held-out split it never
saw, against greedy and transformers' prompt lookup, and saved as a profile.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config import LookaheadConfig
from .engine.memory import AnswerMemory
from .engine.recycle import RecycleSource
from .errors import ConfigError
from .harness import (
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
from .policies import AdaptiveParams, make_policy
from .prompts import workload_tag

PAPER_A100_7B = {"window": 15, "ngram": 5, "guesses": 15}  # the paper's table for 7B models on an A100


class ExactnessError(RuntimeError):
    """A trial's output left the greedy reference at a position that is not float noise."""


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


@dataclass
class Candidate:
    """One point of the search space, ready to run."""

    config: LookaheadConfig
    policy: dict[str, Any] | None  # None = static

    def label(self) -> str:
        """The setting's one label (``autolade.harness.setting_label``): equal for equal behaviour."""
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


@dataclass
class TuneResult:
    best: Candidate
    holdout: Measured
    speedup: float  # held-out, vs HF greedy, ratio of total times
    ci: tuple[float, float]  # 95% bootstrap interval over held-out prompts
    vs_pld: float  # held-out, vs HF prompt lookup
    study_name: str
    storage: str
    trials_run: int
    finalists: list[tuple[Candidate, float]]  # (candidate, held-out speedup)
    profile_id: int | None = None
    report_png: Path | None = None


# --- measuring ------------------------------------------------------------------------------


class Runner:
    """Times greedy, HF prompt lookup and autolade on one prompt (``autolade.harness``), and checks exactness."""

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


# --- the search -----------------------------------------------------------------------------


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


# --- acceptance tables in the search (autolade.tables, autolade.predict) ----------------------

HOPELESS = 0.8  # a tabulated setting predicted below this x greedy is pruned before it is timed


def predicted_start(table, curve) -> dict[str, Any] | None:
    """Trial params of the setting ``table`` predicts best on ``curve`` (``predict.choose``); None
    without a table or curve, or when greedy is the prediction (it is enqueued anyway)."""
    if table is None or curve is None:
        return None
    from .predict import choose
    from .tables import policy_spec

    best = choose(table, curve)
    if best.setting.greedy:
        return None
    params = _params_of(best.setting.config, policy_spec(best.setting))
    if best.setting.policy == "lookup":
        params["lookup_sizing"] = "length"
    return params


def prune_reason(cand: Candidate, table, curve, *, floor: float = HOPELESS) -> str | None:
    """Why ``cand`` is hopeless before timing it: the table measured its setting and ``curve``
    prices it below ``floor`` x greedy. None when it may win or the table does not cover it."""
    if table is None or curve is None or cand.config.greedy_only:
        return None
    from .predict import predict_setting
    from .tables import covered

    setting = covered(table, cand.config, cand.policy)
    if setting is None:
        return None
    p = predict_setting(table, setting, curve)
    if p.speedup >= floor:
        return None
    return (f"acceptance table predicts {p.speedup:.2f}x greedy (< {floor:g}): {p.tokens_per_step:.2f} tokens/step "
            f"at {p.packed_per_step:.1f} packed/step on this machine's curve")


def tabulated_setting(cand: Candidate):
    """The acceptance ``Setting`` that ``cand`` runs, if its policy is tabulated (static, or the
    plain lookup policy); None otherwise (adaptive, cost-aware, lookup with its own parameters)."""
    from .acceptance import Setting

    name = (cand.policy or {"name": "static"})["name"]
    if name == "static" or (name == "lookup" and set(cand.policy) == {"name"}):
        return Setting.of(cand.config, policy=name)
    return None


def record_trial(store, model, tokenizer, runs: Sequence[tuple[int, Any]], cand: Candidate, *, workload: str,
                 max_new_tokens: int) -> int | None:
    """Count what ``cand`` accepted in the trial's own runs (``Measured.runs``: prompt length and
    ``res.stats`` per prompt; no extra run) and add it to the store's acceptance table for this model,
    workload and dtype as a new row (a table is started if none exists; a setting the table has already
    measured is kept as it was). Returns the table's store id, or None when skipped."""
    from .acceptance import Setting
    from .acceptance_measure import empty_table, row_from_runs
    from .models import model_fingerprint
    from .vocab_fingerprint import model_tokenizer_fingerprints

    setting = tabulated_setting(cand)
    if store is None or setting is None or not runs:
        return None
    prices = {getattr(st, "draft_price", None) for _, st in runs}
    if setting.config.recycle and prices != {None}:  # its recycled drafts were cut at this machine's price: say so
        if len(prices) > 1:
            return None
        setting = Setting.of(setting.config, policy=setting.policy, token_cost=round(prices.pop(), 4))
    fp = model_fingerprint(model)
    table = store.find_acceptance(model_fingerprint=fp, tokenizer_fingerprint=model_tokenizer_fingerprints(model, tokenizer),
                                  workload=workload, dtype=fp["dtype"])
    if table is not None and any(r.label == setting.label for r in table.rows):
        return None
    row = row_from_runs(setting, runs)
    if table is not None and row.tokens > table.prompts * (table.max_new_tokens - 1):
        return None  # more than the table's prompts could hold: measured on a larger run
    if table is None:
        table = empty_table(model, tokenizer, workload=workload, max_new_tokens=max_new_tokens, prompts=len(runs),
                            prompt_set=f"{workload} tuning split[:{len(runs)}]")
    return store.save_acceptance(table.with_row(row))


def study_name_for(hardware: str, model: str, dtype: str, workload: str, *, memory: bool = False) -> str:
    """The default study name; a study with the memory is its own study (its trials measure more)."""
    name = f"{model}-{dtype}-{workload}{'-memory' if memory else ''}-{hardware}"
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", name)[:120]


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna logs only warnings inside this scope; the caller's optuna verbosity comes back after."""
    import optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


@quiet_optuna()
def tune(
    model,
    tokenizer,
    *,
    model_name: str,
    workload: str,
    options: TuneOptions | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    store=None,
    hardware=None,
    curve=None,
    compare_paper: bool = True,
    report_png: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TuneResult:
    """Search, re-measure the finalists on the held-out split, save the winner as a profile."""
    import optuna

    from .models import dtype_name, eos_ids, model_fingerprint
    from .prompts import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload
    from .study_storage import default_storage_url, done_trials, open_storage, open_study, run_trials

    opts = options or TuneOptions()
    if curve is None and opts.search_cost_aware:
        opts = dataclasses.replace(opts, search_cost_aware=False)  # the cost-aware policy needs c(k)
    dtype = dtype_name(next(model.parameters()).dtype)
    tag = workload_tag(workload)
    prompts = load_workload(workload)
    tune_split, hold_split = split_workload(prompts, holdout_fraction=HOLDOUT_FRACTION, seed=opts.seed)
    if not tune_split or not hold_split:
        raise ConfigError(f"workload {workload!r} needs at least 2 prompts (one to tune on, one held out)")
    enc = lambda ps: [encode_prompt(tokenizer, p.text, kind=p.kind) for p in ps]
    tune_ids, hold_ids = enc(tune_split[: opts.tune_prompts]), enc(hold_split[: opts.holdout_prompts])
    runner = Runner(model, max_new_tokens=opts.max_new_tokens, eos=eos_ids(model),
                    cost=curve.cost if curve is not None else None,
                    memory=_stored_memory(model, tag, log) if opts.memory else None)
    hw_fp = hardware.fingerprint if hardware is not None else "unknown"
    storage = storage or default_storage_url()
    study_name = study_name or study_name_for(hw_fp, model_name, dtype, tag, memory=opts.memory)
    max_window = _curve_max_window(curve, opts)
    table = _find_table(store, model, tokenizer, tag, dtype, log)

    def first_trials() -> list[dict[str, Any]]:  # enqueued once, by the worker that creates the study
        best_existing = None
        if store is not None and hardware is not None:
            prof, _ = store.find_profile(hardware_fingerprint=hw_fp, hardware_class=hardware.hardware_class,
                                         model_fingerprint=model_fingerprint(model), dtype=dtype, workload=tag)
            if prof is not None:
                best_existing = _params_of(prof.settings, prof.policy)
        start = predicted_start(table, curve)  # the acceptance table's prediction runs first
        return [start] * bool(start) + warm_starts(curve, best_existing, max_window)

    study = open_study(storage=open_storage(storage), study_name=study_name, warm_starts=first_trials,
                       sampler=optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=8),
                       pruner=optuna.pruners.MedianPruner(n_startup_trials=6, n_warmup_steps=1))
    finished = done_trials(study)
    remaining = max(opts.trials - len(finished), 0)
    log(f"study {study_name!r} in {storage}: {len(finished)} trials done, {remaining} to run")

    def objective(trial) -> float:
        cand = suggest(trial, opts, max_window)
        trial.set_user_attr("label", cand.label())
        if curve is not None and not cand.config.greedy_only:
            cfg = cand.config
            best_case = max(cfg.ngram if cfg.lookahead else 1, cfg.prompt_lookup + 1,
                            RecycleSource.MAX_DEPTH + 1 if cfg.recycle else 1)
            # the step curve may cut every recycled node: the least a step packs leaves them out
            bound = best_case * curve.cost(1) / curve.cost(cfg.with_(recycle=0).packed_size())
            trial.set_user_attr("bound", bound)
            if bound < 1.0:  # even accepting everything it cannot beat greedy on this machine
                raise optuna.TrialPruned(f"speedup bound {bound:.2f} < 1 from the step-latency curve")
        hopeless = prune_reason(cand, table, curve)
        if hopeless is not None:
            trial.set_user_attr("pruned", hopeless)
            raise optuna.TrialPruned(hopeless)

        def report(i: int, m: Measured) -> None:
            trial.report(m.ratio(), i)
            if i + 1 < len(tune_ids) and trial.should_prune():
                raise optuna.TrialPruned()

        m = measure(runner, tune_ids, cand, on_prompt=report)
        trial.set_user_attr("tokens_per_step", sum(m.tokens) / max(sum(m.steps), 1))
        trial.set_user_attr("gaps", m.gaps)
        if runner.memory is None:  # an acceptance table counts the setting alone, never the memory's share
            record_trial(store, model, tokenizer, m.runs, cand, workload=tag, max_new_tokens=opts.max_new_tokens)
        else:
            trial.set_user_attr("memory_accepted", sum(s.accepted_by.get("memory", 0) for _, s in m.runs))
        return m.ratio()

    run_trials(study, objective, trials=opts.trials, budget_s=opts.budget_s, catch=(ExactnessError,), progress=progress)

    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE),
                  key=lambda t: t.value, reverse=True)
    if not done:
        raise ConfigError(f"study {study_name!r} has no completed trial yet: run more trials")
    finalists = pick_finalists([t.params for t in done], opts)
    greedy = Candidate(LookaheadConfig(window=0, guesses=0, prompt_lookup=0), None)
    if not any(c.config.greedy_only for c in finalists):
        finalists.append(greedy)
    log(f"re-measuring {len(finalists)} finalists on {len(hold_ids)} held-out prompts")
    scored = []
    for cand in finalists:
        try:
            m = measure(runner, hold_ids, cand, pld=True, offset=10_000)
        except ExactnessError as exc:
            log(f"  {cand.label()}: dropped, {exc}")
            continue
        scored.append((cand, m))
        log(f"  {cand.label()}: {m.ratio():.3f}x greedy, {m.ratio(m.pld_s):.3f}x prompt lookup")
    best, hold = max(scored, key=lambda cm: cm[1].ratio())
    if hold.ratio() < 1.0 and not best.config.greedy_only:
        best, hold = next(cm for cm in scored if cm[0].config.greedy_only)
    finals = [(c, m.ratio()) for c, m in scored]
    if compare_paper:
        paper = Candidate(LookaheadConfig(**PAPER_A100_7B, prompt_lookup=0), None)
        try:
            pm = measure(runner, hold_ids, paper, offset=10_000)
            finals.append((paper, pm.ratio()))
            log(f"  paper's A100 setting {paper.label()}: {pm.ratio():.3f}x greedy")
        except ExactnessError as exc:
            log(f"  paper's setting diverged: {exc}")
    result = TuneResult(
        best=best, holdout=hold, speedup=hold.ratio(), ci=bootstrap_ci(hold.greedy_s, hold.ours_s, seed=opts.seed),
        vs_pld=hold.ratio(hold.pld_s), study_name=study_name, storage=storage, trials_run=len(done_trials(study)),
        finalists=finals,
    )
    if store is not None and hardware is not None:
        result.profile_id = _save(store, hardware, model, model_name, dtype, tag, result, curve, len(hold_ids),
                                  memory=runner.memory is not None)
    if report_png is not None:
        result.report_png = plot_study(study, report_png)
    return result


def _stored_memory(model, tag: str, log: Callable[[str], None]) -> AnswerMemory | None:
    """The store's n-gram memory of this model and workload, read only (as ``generate(memory="read")``
    opens it), or None (said why)."""
    from .api import _open_memory

    opened = _open_memory(model, "read", tag)
    mem, note = opened.answers, opened.note
    if mem is None or len(mem) == 0:
        log(f"memory: {note if mem is None else 'empty'}; trials run without it "
            "(greedy `autolade generate` runs fill it, or `autolade memory import FILE`)")
        return None
    log(f"memory: {note}; each prompt's own earlier answers left out")
    return mem


def _find_table(store, model, tokenizer, tag: str, dtype: str, log: Callable[[str], None]):
    """This model's acceptance table for the workload (``tables.find_table``), or None."""
    if store is None or tokenizer is None:
        return None
    from .models import model_fingerprint
    from .tables import find_table
    from .vocab_fingerprint import model_tokenizer_fingerprints

    table, source = find_table(store, model_fingerprint=model_fingerprint(model),
                               tokenizer_fingerprint=model_tokenizer_fingerprints(model, tokenizer), workload=tag, dtype=dtype)
    log(f"acceptance table: {source}" if table is not None else f"{source}; searching without predictions")
    return table


def _curve_max_window(curve, opts: TuneOptions) -> int:
    """W beyond which even N=2 packs more than 4x c(1) costs: never worth a trial."""
    if curve is None:
        return opts.max_window
    w = opts.max_window
    while w > 1 and curve.cost(1 + 2 * w) > 4 * curve.cost(1):
        w -= 1
    return w


def _params_of(config: LookaheadConfig, policy: dict | None) -> dict[str, Any]:
    params: dict[str, Any] = {"window": config.window, "prompt_lookup": config.prompt_lookup, "recycle": config.recycle}
    if config.window:
        params.update(ngram=config.ngram, guesses=config.guesses)
    if config.prompt_lookup:
        params["prompt_lookup_drafts"] = config.prompt_lookup_drafts
        params["prompt_lookup_scaled"] = config.prompt_lookup_scaled
    if not config.greedy_only:
        params["policy"] = (policy or {"name": "static"})["name"]
    return params


def _save(store, hardware, model, model_name, dtype, tag, result: TuneResult, curve, n_hold: int, *,
          memory: bool = False) -> int:
    from .models import model_fingerprint
    from .profile_format import Profile

    fp = model_fingerprint(model)
    h = result.holdout
    prof = Profile(
        hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
        model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=dtype, workload=tag,
        settings=result.best.config, policy=result.best.policy, speedup=max(result.speedup, 1e-3),
        tokens_per_s=sum(h.tokens) / sum(h.ours_s),
        baseline_tokens_per_s=sum(h.tokens) / sum(h.greedy_s),
        prompt_set=f"{tag}[held-out {n_hold}]", hardware_summary=hardware.summary(),
        step_curve=curve.to_dict() if curve is not None else None,
        notes=f"tuned by autolade tune{' with the n-gram memory' if memory else ''}: study {result.study_name}, 95% CI {result.ci[0]:.2f}-{result.ci[1]:.2f}, "
              f"{result.vs_pld:.2f}x HF prompt lookup",
    )
    return store.save(prof)


def plot_study(study, path: str | Path) -> Path:
    """Speedup per trial (by policy) and the best speedup on a W x N grid (a bare ``Figure``, no
    pyplot: the caller's matplotlib backend stays as it was)."""
    import numpy as np
    import optuna
    from matplotlib.figure import Figure

    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    fig = Figure(figsize=(12, 4.5))
    a, b = fig.subplots(1, 2)
    for name, colour in (("static", "tab:blue"), ("adaptive", "tab:orange"), ("lookup", "tab:green"), (None, "grey")):
        pts = [(t.number, t.value) for t in trials if t.params.get("policy") == name]
        if pts:
            a.scatter(*zip(*pts), c=colour, label=name or "greedy", s=22)
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    a.set(xlabel="trial", ylabel="speedup vs greedy (tuning prompts)", title=study.study_name[:60])
    a.legend(fontsize=8)
    def window(t) -> int:  # the lookup policy runs no window, whatever W the trial drew
        return 0 if t.params.get("policy") == "lookup" else t.params.get("window", 0)

    ws = sorted({window(t) for t in trials})
    ns = sorted({t.params.get("ngram", 0) for t in trials if window(t)}) or [0]
    grid = np.full((len(ns), len(ws)), np.nan)
    for t in trials:
        w, n = window(t), t.params.get("ngram", ns[0]) if window(t) else ns[0]
        i, j = ns.index(n) if n in ns else 0, ws.index(w)
        grid[i, j] = t.value if math.isnan(grid[i, j]) else max(grid[i, j], t.value)
    im = b.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    b.set_xticks(range(len(ws)), ws)
    b.set_yticks(range(len(ns)), ns)
    b.set(xlabel="window W", ylabel="n-gram N (W=0: any)", title="best speedup per W x N")
    fig.colorbar(im, ax=b)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
