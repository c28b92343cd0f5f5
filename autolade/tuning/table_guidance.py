"""Acceptance tables in ``autolade tune`` (``autolade.store.tables``, ``autolade.runtime.predict``):
the table's predicted best runs first, a tabulated setting the step curve prices as hopeless is pruned
untimed, and what a tabulated trial accepted is written back as a table row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autolade.tuning.space import params_of
from autolade.tuning.trials import Candidate

HOPELESS = 0.8  # a tabulated setting predicted below this x greedy is pruned before it is timed


def predicted_start(table, curve) -> dict[str, Any] | None:
    """Trial params of the setting ``table`` predicts best on ``curve`` (``predict.choose``); None
    without a table or curve, or when greedy is the prediction (it is enqueued anyway)."""
    if table is None or curve is None:
        return None
    from autolade.runtime.predict import choose, policy_spec

    best = choose(table, curve)
    if best.setting.greedy:
        return None
    params = params_of(best.setting.config, policy_spec(best.setting))
    if best.setting.policy == "lookup":
        params["lookup_sizing"] = "length"
    return params


def prune_reason(cand: Candidate, table, curve, *, floor: float = HOPELESS) -> str | None:
    """Why ``cand`` is hopeless before timing it: the table measured its setting and ``curve``
    prices it below ``floor`` x greedy. None when it may win or the table does not cover it."""
    if table is None or curve is None or cand.config.greedy_only:
        return None
    from autolade.runtime.predict import covered, predict_setting

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
    from autolade.records.grid import Setting

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
    from autolade.machine.models import model_fingerprint
    from autolade.records.grid import Setting
    from autolade.records.vocab import model_tokenizer_fingerprints
    from autolade.tuning.acceptance_measure import empty_table, row_from_runs

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


def acceptance_table(store, model, tokenizer, tag: str, dtype: str, log: Callable[[str], None]):
    """This model's acceptance table for the workload (``tables.find_table``), or None."""
    if store is None or tokenizer is None:
        return None
    from autolade.machine.models import model_fingerprint
    from autolade.records.vocab import model_tokenizer_fingerprints
    from autolade.store.tables import find_table

    table, source = find_table(store, model_fingerprint=model_fingerprint(model),
                               tokenizer_fingerprint=model_tokenizer_fingerprints(model, tokenizer), workload=tag, dtype=dtype)
    log(f"acceptance table: {source}" if table is not None else f"{source}; searching without predictions")
    return table
