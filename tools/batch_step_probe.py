"""The batched step's forward alone, eager against compiled: ms of a [B, K] forward at a given context, interleaved.

    python3 tools/batch_step_probe.py --model smollm2-135m --dtype bfloat16 --rows 2,4,8 --widths 2,4,8,16,32 --context 300

Each of B rows holds ``--context`` prompt columns (random tokens, prefilled one row at a time and joined, as the
batch decoder does); a step of K tokens per row (causal within the row) runs eager (``ModelRunner`` on a plain
``BatchKVCache``) and compiled (``CompiledBatchRunner`` on a fixed one), alternately, ``--repeats`` times; the
median of each is printed with their ratio, and the cache is cut back to the context after each forward. The
compiled graph is built first, untimed. Writes OUT.json if ``-o`` is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import autolade
from autolade.engine.batch_compiled import CompiledBatchRunner
from autolade.engine.decode import ModelRunner, prefill
from autolade.engine.layout import additive
from autolade.machine.hardware import environment, load_average


def filled(runner: ModelRunner, cache, rows: int, context: int, vocab: int):
    """``cache`` with ``rows`` rows of ``context`` random prompt tokens."""
    for b in range(rows):
        single = runner.new_cache(context + 1)
        ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(b))
        prefill(runner, single, ids)
        cache.join(single)
    return cache


def step_inputs(rows: int, width: int, context: int, vocab: int, dtype: torch.dtype):
    ids = torch.randint(0, vocab, (rows, width))  # [B, K]
    positions = torch.arange(context, context + width).expand(rows, width).contiguous()
    block = torch.tril(torch.ones(width, width, dtype=torch.bool))  # [K, K]
    visible = torch.cat([torch.ones(rows, width, context, dtype=torch.bool), block.expand(rows, width, width)], dim=2)
    return ids, positions, additive(visible, dtype)  # mask [B, 1, K, context + K]


def timed(runner: ModelRunner, cache, ids, positions, mask, context: int) -> float:
    cache.reserve(ids.shape[1])
    t0 = time.perf_counter()
    runner.rows_forward(ids, positions, cache, mask=mask, keep=0)
    ms = (time.perf_counter() - t0) * 1e3
    cache.truncate(context)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", default="2,4,8")
    ap.add_argument("--widths", default="2,4,8,16,32")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args()
    model, _ = autolade.load(args.model, dtype=args.dtype)
    eager, compiled = ModelRunner(model), CompiledBatchRunner(model)
    vocab = eager.vocab
    report = {"environment": environment(model), "load_average_at_start": load_average(), "context": args.context,
              "cells": []}
    with torch.inference_mode():
        caches = {}
        for rows in [int(r) for r in args.rows.split(",")]:
            caches[rows] = (filled(eager, eager.new_batch_cache(args.context + 64), rows, args.context, vocab),
                            filled(compiled, compiled.new_batch_cache(args.context + 64), rows, args.context, vocab))
        t0 = time.perf_counter()
        first = next(iter(caches))
        timed(compiled, caches[first][1], *step_inputs(first, 2, args.context, vocab, eager.dtype), args.context)
        print(f"graph built in {time.perf_counter() - t0:.1f} s", flush=True)
        for rows, (plain, fixed) in caches.items():
            for width in [int(k) for k in args.widths.split(",")]:
                ms = {"eager": [], "compiled": []}
                for _ in range(args.repeats):
                    inputs = step_inputs(rows, width, args.context, vocab, eager.dtype)
                    ms["eager"].append(timed(eager, plain, *inputs, args.context))
                    ms["compiled"].append(timed(compiled, fixed, *inputs, args.context))
                med = {k: statistics.median(v) for k, v in ms.items()}
                cell = {"rows": rows, "width": width, "ms": ms, "median_ms": med, "ratio": med["compiled"] / med["eager"]}
                report["cells"].append(cell)
                print(f"B={rows} K={width}: eager {med['eager']:.1f} ms, compiled {med['compiled']:.1f} ms, "
                      f"compiled / eager {cell['ratio']:.2f}", flush=True)
    report["graphs"] = compiled.log.compiles
    print(f"graphs: {compiled.log.compiles}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
