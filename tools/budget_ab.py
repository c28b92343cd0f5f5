"""A/B of the batched step budget (issue 36), interleaved group by group in one process: the current one
(``engine.budget.step_widths``: the best common width, rows cut to their first tree nodes) against the one
before it (whole rows dropped one at a time while that raised tokens/ms, kept here as ``old_budget``).
SmolLM2 bf16, held-out prompts, 96 new tokens, settings as generate() picks them, memory off:

    python3 tools/budget_ab.py chat,code 2,4,8 16      # sets, batch sizes, prompts per set
    python3 tools/budget_ab.py chat,code 4,8 16 clamp  # old arm: today's budget on a curve clamped at its largest k
    python3 tools/budget_ab.py chat,code 4,8 16 norest # old arm: rows packed alone go on drafting every step

The second form A/Bs the step curve's pricing past its largest measured k: the budget before prices a step of
rows x width past it as the largest k (``StepCurve.cost`` clamped then), the current one goes on along the
last measured segment. The old arm swaps ``step_widths`` in ``autolade.engine.batch``'s namespace for its runs (a measurement
harness, not a way to configure the engine). Writes out/budget-ab.json after every cell.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

import autolade
import autolade.engine.batch as batch_engine
from autolade.bench.padding import padded
from autolade.bench.run import load_sets
from autolade.engine.batch import REST_MAX
from autolade.engine.budget import step_widths
from autolade.runtime.settings import default_resolver
from autolade.workloads import encode_prompt


def old_budget(step_cost, sizes, gains) -> list[int]:
    """The budget before: rows to pack alone, dropped one at a time while a drop raised tokens per ms."""
    if step_cost is None or len(sizes) == 0:
        return []
    n = len(sizes)
    drafting = {b for b in range(n) if sizes[b] > 1}

    def rate(rows: set[int]) -> float:
        width = max((sizes[b] for b in rows), default=1)
        return (n + sum(gains[b] for b in rows)) / step_cost(n * width)

    best = rate(drafting)
    while drafting:
        drop, value = max(((b, rate(drafting - {b})) for b in drafting), key=lambda x: x[1])
        if value <= best:
            break
        drafting.discard(drop)
        best = value
    return sorted(b for b in range(n) if sizes[b] > 1 and b not in drafting)


def old_widths(step_cost, sizes, trees, curves) -> list[int]:
    gains = [c.at(64) for c in curves]  # Row.gain was the EMA of accepted drafts of whole trees, from 1.0: this
    alone = set(old_budget(step_cost, sizes, gains))
    return [1 if b in alone else s for b, s in enumerate(sizes)]


def clamped_widths(step_cost, sizes, trees, curves) -> list[int]:
    """Today's budget with c(k) clamped at the stored curve's largest measured k (StepCurve.cost before)."""
    top = CLAMP_AT[0]
    return step_widths(None if step_cost is None else (lambda k: step_cost(min(k, top))), sizes, trees, curves)


CLAMP_AT = [64]  # set from the stored curve in main()
OLD_ARMS = {"budget": old_widths, "clamp": clamped_widths, "norest": step_widths}  # norest: REST_MAX = 0 in its runs


def main() -> None:
    sets_arg, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    old_arm = sys.argv[4] if len(sys.argv) > 4 else "budget"
    old = OLD_ARMS[old_arm]
    model, tok = autolade.load("smollm2-135m", dtype="bfloat16")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    curve = default_resolver().curve(model)
    if curve is not None:
        CLAMP_AT[0] = max(curve.ks)
    out, path = {"cells": [], "old_arm": old_arm, "curve_largest_k": CLAMP_AT[0]}, Path(f"out/budget-ab-{old_arm}.json")
    path.parent.mkdir(exist_ok=True)
    for name in sets_arg.split(","):
        rows = [encode_prompt(tok, p.text, kind=p.kind) for p in load_sets([name], limit=limit, heldout=True)[name]]
        for b in batches:
            seconds, tokens = {"old": 0.0, "new": 0.0}, {"old": 0, "new": 0}
            steps = {"old": [0.0] * 5, "new": [0.0] * 5}  # steps, packed, width, rows cut, rows alone
            for g in range(0, len(rows) - b + 1, b):
                ids, mask = padded(rows[g : g + b], pad)
                for arm in ("old", "new") if g % (2 * b) == 0 else ("new", "old"):
                    batch_engine.step_widths = old if arm == "old" else step_widths
                    batch_engine.REST_MAX = 0 if (arm == "old" and old_arm == "norest") else REST_MAX
                    with torch.inference_mode():
                        t0 = time.perf_counter()
                        res = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=96, workload=name,
                                                memory=False, pad_token_id=pad)
                        seconds[arm] += time.perf_counter() - t0
                    s = res.batch
                    tokens[arm] += s.new_tokens
                    row_steps = s.rows_per_step * s.steps
                    for i, v in enumerate((s.steps, s.packed_per_step * s.steps, s.width_per_step * s.steps,
                                           s.cut_share * row_steps, s.alone_share * row_steps)):
                        steps[arm][i] += v
            batch_engine.step_widths, batch_engine.REST_MAX = step_widths, REST_MAX
            rate = {a: tokens[a] / seconds[a] for a in seconds}
            cell = {"set": name, "batch": b, **{f"{a}_tok_s": round(rate[a], 2) for a in rate},
                    "new_over_old": round(rate["new"] / rate["old"], 3),
                    **{f"{a}_tokens_per_step": round(tokens[a] / steps[a][0], 2) for a in rate},
                    **{f"{a}_packed_width_cut_alone_per_step": [round(x / steps[a][0], 2) for x in steps[a][1:]] for a in rate}}
            out["cells"].append(cell)
            print(json.dumps(cell), flush=True)
            path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
