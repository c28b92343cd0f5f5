"""The one-sequence compiled step with attention over the whole static capacity against over the prefix and the
step only (``CompiledRunner(ruler=)``), interleaved, at one context:

    python3 tools/compiled_ruler_probe.py --model smollm2-135m --dtype bfloat16 --context 300 --capacity 1024

Both runners are CPU dynamic graphs (one each, built first, untimed); a step of K tokens (causal) on ``--context``
random prompt tokens runs ``--repeats`` times per runner, alternately; medians and their ratio are printed.
Writes OUT.json if ``-o`` is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import autolade
from autolade.engine.compiled import CompiledRunner
from autolade.engine.decode import prefill
from autolade.machine.hardware import environment, load_average


def step(runner: CompiledRunner, width: int, context: int, vocab: int) -> float:
    ids = torch.randint(0, vocab, (1, width))
    positions = torch.arange(context, context + width)[None]  # [1, K]
    mask = torch.zeros((1, 1, width, context + width), dtype=runner.dtype)
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    mask[..., context:] = torch.where(causal, 0.0, torch.finfo(runner.dtype).min)
    t0 = time.perf_counter()
    runner.rows_forward(ids, positions, runner.cache, mask=mask, keep=0)
    ms = (time.perf_counter() - t0) * 1e3
    runner.cache.truncate(context)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--widths", default="2,8,16,32,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args()
    model, _ = autolade.load(args.model, dtype=args.dtype)
    runners = {name: CompiledRunner(model, capacity=args.capacity, ruler=name == "ruler") for name in ("capacity", "ruler")}
    vocab = runners["ruler"].vocab
    report = {"environment": environment(model), "load_average_at_start": load_average(), "context": args.context,
              "capacity": args.capacity, "cells": []}
    prompt = torch.randint(0, vocab, (1, args.context), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for name, runner in runners.items():
            prefill(runner, runner.new_cache(args.capacity), prompt)
            t0 = time.perf_counter()
            step(runner, 8, args.context, vocab)
            print(f"{name}: graph built in {time.perf_counter() - t0:.1f} s", flush=True)
        for width in [int(k) for k in args.widths.split(",")]:
            ms = {name: [] for name in runners}
            for _ in range(args.repeats):
                for name, runner in runners.items():
                    ms[name].append(step(runner, width, args.context, vocab))
            med = {name: statistics.median(v) for name, v in ms.items()}
            cell = {"width": width, "ms": ms, "median_ms": med, "ratio": med["ruler"] / med["capacity"]}
            report["cells"].append(cell)
            print(f"K={width}: whole capacity {med['capacity']:.1f} ms, prefix only {med['ruler']:.1f} ms, "
                  f"ratio {cell['ratio']:.2f}", flush=True)
    report["graphs"] = {name: r.log.compiles for name, r in runners.items()}
    print(f"graphs: {report['graphs']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
