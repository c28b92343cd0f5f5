"""Acceptance rows counted by replay: one greedy output per prompt counts every prompt-lookup setting.

Greedy output does not depend on how it was drafted, so the prompt-lookup settings (static, and the
``lookup`` policy) can be counted over greedy outputs without the model (``replay.replay_trace``):
exactly the engine's steps and packed sizes in fp32. ``autolade accept --replay-prompts M`` uses
this to rest those rows on many more prompts than the engine-counted window rows, which carry a
``sample_scale`` for the difference between their prompts and all of them.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autolade.errors import ProfileError
from autolade.records.acceptance import AcceptanceRow, AcceptanceTable
from autolade.records.grid import Setting, replayable
from autolade.tuning.acceptance_measure import row_from_runs


@dataclass(frozen=True)
class _ReplayedRun:
    """The part of ``res.stats`` that ``row_from_runs`` reads, from a replayed trace."""

    steps: int
    new_tokens: int
    tokens_per_step: float
    per_step: dict[str, list[int]]


def replay_row(setting: Setting, traces: Sequence[Any]) -> AcceptanceRow:
    """A row for a static prompt-lookup setting counted by replaying greedy outputs (``replay.Trace``)
    instead of running the engine: the same drafts, the same accepted lengths, no model. Exact where
    the engine's output is the greedy one (fp32); in bf16 the engine's own output may differ late."""
    from autolade.tuning.replay import lookup_rule, replay_trace

    if not replayable(setting):
        raise ProfileError(f"setting {setting.label!r} cannot be replayed: only prompt-lookup settings (static or "
                           "the lookup policy) can")
    runs = []
    for trace in traces:
        steps = replay_trace(lookup_rule(setting.config, setting.policy), trace)
        n_new = len(trace.output)
        runs.append((len(trace.prompt), _ReplayedRun(
            steps=len(steps), new_tokens=n_new, tokens_per_step=(n_new - 1) / len(steps) if steps else float(n_new),
            per_step={"packed": [k for k, _ in steps], "accepted": [a for _, a in steps]})))
    return replace(row_from_runs(setting, runs), prompts=len(traces), counted_by="replay")


def add_replayed_rows(table: AcceptanceTable, model: Any, prompts: Sequence[Any], settings: Sequence[Setting], *,
                      progress: Callable[[str], None] | None = None,
                      outputs: dict[tuple[int, ...], Sequence[int]] | None = None) -> AcceptanceTable:
    """``table`` with every replayable setting of ``settings`` counted by replay over the greedy outputs
    (HF ``generate``, one run per prompt) of ``prompts``: one greedy pass instead of one engine run per
    setting, so the prompt-lookup rows can rest on many more prompts than the window rows. A row
    already counted on at least as many prompts is kept. ``outputs``: greedy outputs already made
    (prompt ids -> new ids, e.g. ``tools/draft_bound.py --save-traces``), used instead of running greedy."""
    import torch

    from autolade.tuning.harness import run_greedy
    from autolade.tuning.replay import Trace

    wanted = [s for s in settings if replayable(s)]
    if not wanted or not prompts:
        return table
    # rows keep the prompt count they were counted on when the table's grows
    table = replace(table, rows=tuple(replace(r, prompts=table.row_prompts(r)) for r in table.rows))
    known, counted = _known_scales(table, len(prompts)), {r.label: r.prompts for r in table.rows}
    if known is not None and all(counted.get(s.label, 0) >= len(prompts) for s in wanted):
        # an earlier run replayed these prompts already (a resumed table): no greedy pass to make again
        if progress is not None:
            progress(f"  every prompt-lookup setting was replayed on {len(prompts)} prompts before: kept")
        return replace(table, rows=tuple(_scaled(r, known, len(prompts)) for r in table.rows),
                       prompts=max(table.prompts, len(prompts)))
    traces = []
    for i, ids in enumerate(prompts):
        ids = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids, dtype=torch.long)
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        known = (outputs or {}).get(tuple(ids[0].tolist()))
        out = list(known)[: table.max_new_tokens] if known is not None else run_greedy(
            model, ids, max_new_tokens=table.max_new_tokens).tokens
        traces.append(Trace(tuple(ids[0].tolist()), tuple(out)))
        if progress is not None:
            progress(f"  greedy output {i + 1}/{len(prompts)}: {len(out)} tokens{' (saved)' if known is not None else ''}")
    whole = {s.label: replay_row(s, traces) for s in wanted}
    for setting in wanted:
        row = whole[setting.label]
        if setting.label in {r.label for r in table.rows} and table.row_prompts(table.row(setting.label)) >= len(traces):
            continue
        table = table.with_row(row)
        if progress is not None:
            progress(f"  {setting.label:<36} {row.tokens_per_step:.3f} tokens/step over {len(traces)} prompts (replayed)")
    # rows the engine counted on the first n prompts only (windows): how much easier or harder those n prompts
    # were than all of them, measured on the replayed settings, so prediction compares like with like
    scaled, scales = [], {}
    for r in table.rows:
        n = table.row_prompts(r)
        if r.counted_by == "engine" and n < len(traces):
            if n not in scales:  # one per prompt count, not per row
                scales[n] = sample_scale(wanted, traces, n, whole=whole)
            scale = scales[n]
            if progress is not None:
                progress(f"  {r.label:<36} counted on {n} prompts: tokens/step x {scale:.3f} for all {len(traces)}")
            r = replace(r, sample_scale=scale)
        scaled.append(r)
    return replace(table, rows=tuple(scaled), prompts=max(table.prompts, len(traces)))


def _known_scales(table: AcceptanceTable, m: int) -> dict[int, float] | None:
    """{prompt count: sample scale} of the engine rows counted on fewer than ``m`` prompts, from the rows
    already scaled; None where some prompt count has no scaled row yet (a scale of exactly 1.0 reads as
    not scaled: recomputing it costs one greedy pass, never a wrong row)."""
    fewer = [r for r in table.rows if r.counted_by == "engine" and table.row_prompts(r) < m]
    scales = {table.row_prompts(r): r.sample_scale for r in fewer if r.sample_scale != 1.0}
    return scales if {table.row_prompts(r) for r in fewer} <= scales.keys() else None


def _scaled(row: AcceptanceRow, scales: Mapping[int, float], m: int) -> AcceptanceRow:
    """``row`` with the known scale of its prompt count when the engine counted it on fewer than ``m``
    (its ``prompts`` is set: ``add_replayed_rows`` fills it in first)."""
    return replace(row, sample_scale=scales[row.prompts]) if row.counted_by == "engine" and row.prompts < m else row


def sample_scale(settings: Sequence[Setting], traces: Sequence[Any], n: int, *,
                 whole: Mapping[str, AcceptanceRow] | None = None) -> float:
    """Geometric mean over the replayable non-greedy ``settings`` of tokens/step on all ``traces`` over
    tokens/step on the first ``n``: the prompt sample's bias, to carry a row counted on ``n`` to all.
    ``whole``: the settings' rows over all ``traces`` when already replayed (by label)."""
    ratios = []
    for s in settings:
        if replayable(s) and not s.greedy:
            all_rows = whole[s.label] if whole is not None else replay_row(s, traces)
            ratios.append(all_rows.tokens_per_step / replay_row(s, traces[:n]).tokens_per_step)
    return min(max(math.exp(statistics.fmean(math.log(x) for x in ratios)), 0.2), 5.0) if ratios else 1.0


def read_traces(path: str | Path) -> dict[tuple[int, ...], list[int]]:
    """Greedy outputs saved by ``tools/draft_bound.py --save-traces`` ({set: [{prompt, output}, ...]}):
    prompt ids -> output ids. A file of another shape is a ProfileError naming it."""
    try:
        data = json.loads(Path(path).read_text())
        return {tuple(int(t) for t in r["prompt"]): [int(t) for t in r["output"]] for rows in data.values() for r in rows}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ProfileError(f"{path} is not a greedy-outputs file from tools/draft_bound.py --save-traces ({exc})") from None
