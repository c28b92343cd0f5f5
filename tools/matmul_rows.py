#!/usr/bin/env python3
"""What one matmul of k rows costs on this machine, k = 1, 2, 3, ...: where a one-token step is dearer than two.

A decode step of k packed tokens multiplies k rows by every weight matrix. On a 2-core EPYC a one-row
bf16 product took a slower kernel than two rows (the 1.5B Qwen's [k, 1536] x [1536, 8960]: 1.29 vs
0.99 ms), which is why that model's step curve reads c(2) < c(1) and ``generate()`` pads lone steps
there (``StepCurve.pads_single``). Interleaved over k, median of ``--repeats`` rounds of ``--calls`` calls.

    python3 tools/matmul_rows.py --dtype bfloat16 float32 --shape 1536 8960
"""

from __future__ import annotations

import argparse
import statistics
import time


def measure(*, dtype: str, shape: tuple[int, int], rows: list[int], repeats: int, calls: int) -> dict[int, float]:
    """{k: median ms of one [k, shape[0]] x [shape[0], shape[1]] product}."""
    import torch

    dt = getattr(torch, dtype)
    weight = torch.randn(shape[1], shape[0], dtype=dt)  # nn.Linear layout: [out, in]
    inputs = {k: torch.randn(k, shape[0], dtype=dt) for k in rows}
    times: dict[int, list[float]] = {k: [] for k in rows}
    with torch.inference_mode():
        for _ in range(repeats):
            for k in rows:
                t = time.perf_counter()
                for _ in range(calls):
                    torch.nn.functional.linear(inputs[k], weight)
                times[k].append((time.perf_counter() - t) / calls * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--shape", nargs=2, type=int, default=[1536, 8960], metavar=("IN", "OUT"))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4, 8])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args(argv)
    print(f"[k, {args.shape[0]}] x [{args.shape[0]}, {args.shape[1]}], ms (median of {args.repeats} x {args.calls})")
    for dtype in args.dtype:
        ms = measure(dtype=dtype, shape=tuple(args.shape), rows=args.rows, repeats=args.repeats, calls=args.calls)
        print(f"{dtype:>9}: " + "  ".join(f"k={k} {v:.3f}" for k, v in ms.items()) + f"  (c(2)/c(1) {ms.get(2, float('nan')) / ms[args.rows[0]]:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
