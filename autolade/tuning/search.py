"""``autolade tune``: an Optuna search of W/N/G (and the runtime policy) against measured speed.

Each trial runs the tuning prompts, every one interleaved with plain greedy (``model.generate``),
so the objective is a ratio to greedy and machine drift cancels. Outputs are checked against the
greedy reference: a divergence that is not float noise (the reference's top-2 logit gap there is
above the dtype's noise) fails the trial. The winner is re-measured on a held-out split it never
saw, against greedy and transformers' prompt lookup, and saved as a profile.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.memory import AnswerMemory
from autolade.engine.recycle import RecycleSource
from autolade.errors import ConfigError
from autolade.tuning.report import TuneResult, plot_study, save_profile
from autolade.tuning.space import (
    PAPER_A100_7B,
    TuneOptions,
    curve_max_window,
    params_of,
    pick_finalists,
    suggest,
    warm_starts,
)
from autolade.tuning.table_guidance import acceptance_table, predicted_start, prune_reason, record_trial
from autolade.tuning.trials import Candidate, ExactnessError, Measured, Runner, bootstrap_ci, measure
from autolade.workloads import workload_tag


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

    from autolade.machine.models import dtype_name, eos_ids, model_fingerprint
    from autolade.tuning.study_storage import default_storage_url, done_trials, open_storage, open_study, run_trials
    from autolade.workloads import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload

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
    max_window = curve_max_window(curve, opts)
    table = acceptance_table(store, model, tokenizer, tag, dtype, log)

    def first_trials() -> list[dict[str, Any]]:  # enqueued once, by the worker that creates the study
        best_existing = None
        if store is not None and hardware is not None:
            prof, _ = store.find_profile(hardware_fingerprint=hw_fp, hardware_class=hardware.hardware_class,
                                         model_fingerprint=model_fingerprint(model), dtype=dtype, workload=tag)
            if prof is not None:
                best_existing = params_of(prof.settings, prof.policy)
        start = predicted_start(table, curve)  # the acceptance table's prediction runs first
        return [start] * bool(start) + warm_starts(curve, best_existing, max_window)

    study = open_study(storage=open_storage(storage), study_name=study_name, warm_starts=first_trials,
                       sampler=optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=8),
                       pruner=optuna.pruners.MedianPruner(n_startup_trials=6, n_warmup_steps=1))
    finished = done_trials(study)
    remaining = max(opts.trials - len(finished), 0)
    log(f"study {study_name!r} in {storage}: {len(finished)} trials done, {remaining} to run")

    objective = _objective(runner, tune_ids, opts, max_window=max_window, curve=curve, table=table, store=store,
                           model=model, tokenizer=tokenizer, tag=tag)
    run_trials(study, objective, trials=opts.trials, budget_s=opts.budget_s, catch=(ExactnessError,), progress=progress)

    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE),
                  key=lambda t: t.value, reverse=True)
    if not done:
        raise ConfigError(f"study {study_name!r} has no completed trial yet: run more trials")
    best, hold, finals = _holdout(runner, hold_ids, [t.params for t in done], opts, compare_paper=compare_paper, log=log)
    result = TuneResult(
        best=best, holdout=hold, speedup=hold.ratio(), ci=bootstrap_ci(hold.greedy_s, hold.ours_s, seed=opts.seed),
        vs_pld=hold.ratio(hold.pld_s), study_name=study_name, storage=storage, trials_run=len(done_trials(study)),
        finalists=finals,
    )
    if store is not None and hardware is not None:
        result.profile_id = save_profile(store, hardware, model, model_name, dtype, tag, result, curve, len(hold_ids),
                                         memory=runner.memory is not None)
    if report_png is not None:
        result.report_png = plot_study(study, report_png)
    return result


def _objective(runner: Runner, tune_ids: Sequence[torch.Tensor], opts: TuneOptions, *, max_window: int, curve, table,
               store, model, tokenizer, tag: str) -> Callable[[Any], float]:
    """The study's objective: a trial's speedup over greedy on the tuning prompts (pruned untimed when the
    step curve or the acceptance table says it cannot win; pruned early by the median of earlier trials)."""
    import optuna

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

    return objective


def _holdout(runner: Runner, hold_ids: Sequence[torch.Tensor], ranked: Sequence[dict[str, Any]], opts: TuneOptions, *,
             compare_paper: bool, log: Callable[[str], None]) -> tuple[Candidate, Measured, list[tuple[Candidate, float]]]:
    """Re-measure the finalists among ``ranked`` trial params (best first), and greedy, on the held-out
    prompts: the winner (greedy unless one beats it), its measurement, and (candidate, speedup) of each
    finalist (and of the paper's setting with ``compare_paper``)."""
    finalists = pick_finalists(ranked, opts)
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
    return best, hold, finals


def _stored_memory(model, tag: str, log: Callable[[str], None]) -> AnswerMemory | None:
    """The store's n-gram memory of this model and workload, read only (as ``generate(memory="read")``
    opens it), or None (said why)."""
    from autolade.store.memory import open_memory

    opened = open_memory(model, "read", tag)
    mem, note = opened.answers, opened.note
    if mem is None or len(mem) == 0:
        log(f"memory: {note if mem is None else 'empty'}; trials run without it "
            "(greedy `autolade generate` runs fill it, or `autolade memory import FILE`)")
        return None
    log(f"memory: {note}; each prompt's own earlier answers left out")
    return mem
