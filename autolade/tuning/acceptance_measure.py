"""Counting an acceptance table on the real engine: every setting on every prompt, greedy, never timed.

``measure_acceptance`` is what ``autolade accept`` runs (resumable: a table saved after each row
skips the rows it has), ``recount_rows`` what ``autolade accept --recount`` runs; ``row_from_runs`` counts a row from runs already made (the tuner's timed
ones, or ``acceptance_replay``'s replayed ones).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from autolade.errors import ProfileError
from autolade.records.acceptance import REPLAYED_ON, AcceptanceRow, AcceptanceTable, engine_prompt_set
from autolade.records.grid import Setting, default_grid
from autolade.records.vocab import model_tokenizer_fingerprint


def measure_row(model: Any, prompts: Sequence[Any], setting: Setting, *, max_new_tokens: int) -> AcceptanceRow:
    """Run the real engine (``autolade.api.generate``, greedy, explicit config and policy, lone steps
    never padded) on every prompt and count what it accepted and packed. Nothing is timed."""
    import torch

    from autolade.api import generate

    runs = []
    for ids in prompts:
        ids = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids, dtype=torch.long)
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        price = False if setting.token_cost is None else setting.token_cost  # counts of the setting alone, at its price
        # never padded: a lone step's filler draft follows this machine's curve (c(2) < c(1)), and a table is
        # hardware-free; the prediction prices lone steps at c(2) where the curve pads them
        res = generate(model, ids, max_new_tokens=max_new_tokens, config=setting.config, policy=setting.policy,
                       memory=False, price_drafts=price, pad_single=False)
        runs.append((ids.shape[1], res.stats))
    return row_from_runs(setting, runs)


def row_from_runs(setting: Setting, runs: Sequence[tuple[int, Any]]) -> AcceptanceRow:
    """Count what ``setting`` accepted and packed from runs already made, one ``(prompt length,
    res.stats)`` per prompt (``measure_row``'s, or the tuner's timed ones: counts need no extra run)."""
    per_prompt_tps, per_prompt_packed, hist, contexts = [], [], {}, []
    steps = tokens = 0
    for prompt_len, st in runs:
        if st.steps == 0:
            continue  # the prefill's token ended it (eos, or max_new_tokens=1): no step to count
        packed, accepted = st.per_step["packed"], st.per_step["accepted"]
        steps += st.steps
        tokens += st.new_tokens - 1
        per_prompt_tps.append(st.tokens_per_step)
        per_prompt_packed.append(sum(packed) / len(packed))
        for k in packed:
            hist[k] = hist.get(k, 0) + 1
        context = prompt_len  # KV length at the first step: the prompt (the prefill's token is fed in)
        for a in accepted:
            contexts.append(context)
            context += a + 1
    if not steps:
        raise ProfileError(f"setting {setting.label!r} took no decode step on any prompt: raise max_new_tokens")
    return AcceptanceRow(
        setting=setting,
        tokens_per_step_mean=statistics.fmean(per_prompt_tps),
        tokens_per_step_sd=statistics.stdev(per_prompt_tps) if len(per_prompt_tps) > 1 else 0.0,
        packed_per_step_mean=statistics.fmean(per_prompt_packed),
        packed_per_step_sd=statistics.stdev(per_prompt_packed) if len(per_prompt_packed) > 1 else 0.0,
        packed_hist=dict(sorted(hist.items())),
        steps=steps,
        tokens=tokens,
        context_min=min(contexts),
        context_median=int(statistics.median(contexts)),
        context_max=max(contexts),
    )


def empty_table(model: Any, tokenizer: Any = None, *, workload: str, max_new_tokens: int, prompts: int,
                prompt_set: str = "", measured_on: str = "") -> AcceptanceTable:
    """A table with no rows yet for this model (fingerprint, tokenizer, dtype) and measurement."""
    from autolade.machine.models import model_fingerprint

    fp = model_fingerprint(model)
    return AcceptanceTable(
        model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=fp["dtype"],
        tokenizer_fingerprint=model_tokenizer_fingerprint(model, tokenizer),
        workload=workload, max_new_tokens=max_new_tokens, prompts=prompts, rows=(),
        prompt_set=prompt_set, measured_on=measured_on,
    )  # fmt: skip


def measure_acceptance(
    model: Any,
    prompts: Sequence[Any],
    settings: Sequence[Setting] | None = None,
    *,
    max_new_tokens: int,
    workload: str,
    tokenizer: Any = None,
    prompt_set: str = "",
    measured_on: str = "",
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[AcceptanceTable], None] | None = None,
    resume_from: AcceptanceTable | None = None,
) -> AcceptanceTable:
    """Measure every setting (``default_grid()`` if None) on every prompt (token ids: a list or
    [1, T] / [T] tensors) and return the table. ``on_row`` gets the table so far after each setting,
    so a caller can save as it goes and an interrupted run keeps its complete rows; ``progress`` gets
    one line per setting. Greedy decoding only: acceptance of sampled decoding is not tabulated.
    ``resume_from``: an earlier, interrupted table of the same model, tokenizer, dtype, workload,
    prompt set and length; its rows are kept and their settings not measured again."""
    settings = tuple(default_grid() if settings is None else settings)
    if not prompts:
        raise ProfileError("measure_acceptance needs at least one prompt")
    if not settings or not all(isinstance(s, Setting) for s in settings):
        raise ProfileError("settings must be a non-empty sequence of Setting (see default_grid())")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ProfileError(f"max_new_tokens must be an integer >= 2, got {max_new_tokens!r}")
    table = empty_table(model, tokenizer, workload=workload, max_new_tokens=max_new_tokens, prompts=len(prompts),
                        prompt_set=prompt_set, measured_on=measured_on)
    if resume_from is not None and _same_measurement(resume_from, table):
        # a table grown by replay keeps its prompt count and set; rows measured now say their own count
        table = replace(table, rows=resume_from.rows, created=resume_from.created, prompts=resume_from.prompts,
                        prompt_set=resume_from.prompt_set)
    done = {row.label for row in table.rows}
    for i, setting in enumerate(settings, 1):
        if setting.label in done:
            if progress is not None:
                progress(f"[{i}/{len(settings)}] {setting.label:<34} measured before (resumed)")
            continue
        row = measure_row(model, prompts, setting, max_new_tokens=max_new_tokens)
        table = table.with_row(row if table.prompts == len(prompts) else replace(row, prompts=len(prompts)))
        if progress is not None:
            progress(f"[{i}/{len(settings)}] {setting.label:<34} {row.tokens_per_step:5.2f} tokens/step "
                     f"(sd {row.tokens_per_step_sd:.2f}), {row.packed_mean:6.1f} packed/step, {row.steps} steps")
        if on_row is not None:
            on_row(table)
    return table


def recount_rows(model: Any, prompts: Sequence[Any], table: AcceptanceTable, labels: Sequence[str], *,
                 progress: Callable[[str], None] | None = None,
                 on_row: Callable[[AcceptanceTable], None] | None = None) -> AcceptanceTable:
    """``table`` with the engine rows named by ``labels`` counted again on ``prompts``: the first
    ``len(prompts)`` of the split its rows were counted on, more of them than before, so the top settings'
    ranking rests on more than a handful of prompts without re-counting the whole grid. Each row keeps its
    own prompt count (``AcceptanceRow.prompts``); a row already counted on at least as many prompts is kept
    (a re-count resumes). ``on_row`` gets the table after each row, as in ``measure_acceptance``. The
    rows' ``sample_scale`` is not refreshed here: ``acceptance_replay.add_replayed_rows`` does that."""
    if not prompts:
        raise ProfileError("recount_rows needs at least one prompt")
    labels = list(dict.fromkeys(labels))  # each row once
    known = {r.label: r for r in table.rows}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ProfileError(f"the table has no row {unknown[0]!r}: re-count one of its rows, named as `autolade accept` "
                           f"lists them ({', '.join(sorted(known))})")
    replayed = [label for label in labels if known[label].counted_by == "replay"]
    if replayed:
        raise ProfileError(f"{replayed[0]!r} is counted by replay, not by the engine: grow it with --replay-prompts")
    for i, label in enumerate(labels, 1):
        before = table.row_prompts(table.row(label))
        if before >= len(prompts):
            if progress is not None:
                progress(f"[{i}/{len(labels)}] {label:<34} counted on {before} prompts already: kept")
            continue
        row = replace(measure_row(model, prompts, table.row(label).setting, max_new_tokens=table.max_new_tokens),
                      prompts=len(prompts))
        table = table.with_row(row)
        if progress is not None:
            progress(f"[{i}/{len(labels)}] {label:<34} {row.tokens_per_step:5.2f} tokens/step over {len(prompts)} "
                     f"prompts (was {known[label].tokens_per_step:.2f} over {before})")
        if on_row is not None:
            on_row(table)
    return table


def _same_measurement(a: AcceptanceTable, b: AcceptanceTable) -> bool:
    """Whether ``a`` was measured on the same model, tokenizer, dtype, workload, prompts and length as ``b``,
    or is that measurement grown by replay since (``add_replayed_rows``): its engine rows still counted on
    ``b``'s prompts, its prompt set ``b``'s plus the replayed one."""
    keys = ("model_name", "model_config_hash", "tokenizer_fingerprint", "dtype", "workload", "max_new_tokens")
    if not all(getattr(a, k) == getattr(b, k) for k in keys):
        return False
    if (a.prompts, a.prompt_set) == (b.prompts, b.prompt_set):
        return True
    engine = [r for r in a.rows if r.counted_by == "engine"]
    # rows re-counted on more prompts of the same split (``recount_rows``) still count these first ones
    return (REPLAYED_ON in a.prompt_set and engine_prompt_set(a.prompt_set) == b.prompt_set
            and all(a.row_prompts(r) >= b.prompts for r in engine))
