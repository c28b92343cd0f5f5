"""``generate`` for a batch: B sequences decoded together, one forward per step (``engine/batch.py``).

The input is what a tokenizer returns for a list of prompts with ``padding_side="left"``:
``input_ids`` [B, T] and ``attention_mask`` [B, T] (1 = token, 0 = padding on the left). Each row
is decoded exactly as ``generate`` decodes it alone (greedy: the tokens of
``model.generate(do_sample=False)`` on that row by itself), with its own drafts, policy and
verifier; the settings (profile, memory, recycling table, draft price) are resolved once for the
batch. The result's ``sequences`` are laid out as ``model.generate`` lays out a padded batch: the
input as given, then each row's new tokens, then ``pad_token_id`` after a row that ended early.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from autolade.engine.batch import BatchLog, RowRequest, decode_batch
from autolade.engine.clock import DeviceClock
from autolade.engine.decode import ModelRunner
from autolade.errors import InputError
from autolade.prepare import GenerateStats, RunSetup, check_input, stats_of


@dataclass(frozen=True)
class BatchStats:
    """What the batch did as a whole; ``res.batch``."""

    rows: int
    steps: int  # forwards after the prefills (each serves every running row)
    new_tokens: int  # all rows together
    wall_s: float  # prefills included
    tokens_per_s: float  # all rows' new tokens / wall
    prefill_ms: float  # the rows' prefills (each row alone)
    forward_ms: float  # the batched decode forwards
    rows_per_step: float  # running rows per forward, averaged over the steps
    packed_per_step: float  # real tokens per forward, all rows together
    width_per_step: float  # the widest row's tokens per forward (every row is padded to it)
    alone_share: float  # of the row-steps, those the step budget packed as the last token alone (drafts not worth the width)
    cut_share: float  # of the row-steps, those the step budget packed with the first part of their tree only
    rest_share: float  # of the row-steps, those that drafted nothing: the budget had packed the row alone lately
    hole_share: float  # of the cache columns the rows attend over, the share masked out (holes), over all steps


@dataclass(frozen=True)
class BatchResult:
    sequences: torch.Tensor  # [B, T + longest new], as model.generate returns for a left-padded batch
    stats: list[GenerateStats]  # per row, in input order
    batch: BatchStats


def split_rows(model: torch.nn.Module, input_ids: Any, attention_mask: Any, max_new_tokens: int) -> list[torch.Tensor]:
    """Each row's tokens [1, T_b] without its left padding, checked as ``generate`` checks one prompt."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InputError("input_ids for a batch must be a [B, T] tensor (tokenizer(prompts, padding=True, return_tensors='pt'))")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise InputError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got {got}")
    mask = attention_mask.to("cpu")
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InputError("attention_mask must hold 0 (padding) and 1 (token) only")
    rows = []
    for b in range(input_ids.shape[0]):
        m = mask[b].bool()
        if not bool(m.any()):
            raise InputError(f"row {b} of the batch is all padding: give every row at least one token")
        first = int(m.nonzero()[0])
        if not bool(m[first:].all()):
            raise InputError(f"row {b}'s attention_mask has padding after its tokens: pad on the left "
                             "(tokenizer.padding_side = 'left'), as decoder-only generation needs")
        try:
            rows.append(check_input(model, input_ids[b : b + 1, first:], max_new_tokens))
        except InputError as e:
            raise InputError(f"row {b}: {e}") from None
    return rows


def run_batch(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, rows: list[torch.Tensor],
    run: RunSetup, max_new_tokens: int, eos: Sequence[int], stop: Callable[[list[int]], bool] | None,
    verifiers: list[Any], on_tokens: Callable[[int, list[int]], None] | None, pad_token_id: int | None,
    step_cost: Callable[[float], float] | None = None, runner: ModelRunner | None = None,
) -> BatchResult:
    """Decode the checked ``rows`` together with the settled ``run``; lay the result out as HF does.
    ``step_cost``: c(k) of this machine's step curve, which decides each step's packed width (``engine.batch.budget``);
    ``runner``: whose forwards run the steps (None: eager; ``engine.batch_compiled.CompiledBatchRunner``: compiled)."""
    policies = [run.policy] + [run.new_policy() for _ in rows[1:]]

    def row_callback(b: int):
        return None if on_tokens is None else (lambda tokens: on_tokens(b, tokens))

    requests = [
        RowRequest(prompt=r[0].tolist(), config=run.config, max_new_tokens=max_new_tokens, eos_ids=eos, stop=stop,
                   policy=p, verifier=v, on_tokens=row_callback(b), memory=run.answers, token_cost=run.token_cost,
                   recycled=run.recycled)
        for b, (r, p, v) in enumerate(zip(rows, policies, verifiers))
    ]  # fmt: skip
    clock = DeviceClock(input_ids.device)
    t0 = clock.now()
    done, log = decode_batch(model, requests, step_cost=step_cost, runner=runner)
    wall = clock.since(t0)
    stats = []
    for row, policy in zip(done, policies):
        note = run.memory_note
        if run.remember is not None:
            note += "" if (why := run.remember(row.out)) is None else f"; {why}"
        s = stats_of(row.log, len(row.out), wall, run.config, run.source, policy)
        stats.append(replace(s, memory=note, draft_price=run.token_cost, padded=False))
    longest = max(len(r.out) for r in done)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    new = torch.full((len(done), longest), pad, dtype=input_ids.dtype, device=input_ids.device)
    for b, row in enumerate(done):
        new[b, : len(row.out)] = torch.tensor(row.out, dtype=input_ids.dtype)
    return BatchResult(sequences=torch.cat([input_ids, new], dim=1), stats=stats, batch=batch_stats(log, done, wall))


def batch_stats(log: BatchLog, done: list, wall: float) -> BatchStats:
    steps = len(log.steps)
    total = sum(len(r.out) for r in done)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    return BatchStats(
        rows=len(done), steps=steps, new_tokens=total, wall_s=wall, tokens_per_s=total / wall if wall > 0 else 0.0,
        prefill_ms=log.prefill_ms, forward_ms=sum(s.forward_ms for s in log.steps),
        rows_per_step=mean([s.rows for s in log.steps]), packed_per_step=mean([s.packed for s in log.steps]),
        width_per_step=mean([s.width for s in log.steps]),
        alone_share=sum(s.alone for s in log.steps) / max(sum(s.rows for s in log.steps), 1),
        rest_share=sum(s.rested for s in log.steps) / max(sum(s.rows for s in log.steps), 1),
        cut_share=sum(s.cut for s in log.steps) / max(sum(s.rows for s in log.steps), 1),
        hole_share=sum(s.holes for s in log.steps) / max(sum(s.rows * s.prefix for s in log.steps), 1),
    )  # fmt: skip
