#!/usr/bin/env python3
"""How well a quick step curve's c(1) stands for what plain greedy costs on this machine, over a few minutes.

Every predicted speedup divides by c(1), the curve's one-token forward: it is what greedy pays a token. On the
2-core EPYC the 1.5B Qwen's one-token bf16 forward switched between two speeds from one minute to the next
(c(1) ~187 ms in one quick curve, ~238 ms in the next; HF greedy ~211-218 ms a token in between), so one quick
curve, read in seconds, prices every setting against whichever speed it caught. Each round times HF greedy
(ms per token after the prefill, 40 tokens on a held-out MT-Bench prompt), then a quick curve with 3 and with
9 repeats (``autolade profile --quick`` uses 3); the last line is greedy again.

    python3 tools/greedy_reference.py --model qwen2.5-coder-1.5b --rounds 2
"""

from __future__ import annotations

import argparse
import os
import time


def greedy_ms(model, ids, new: int = 40) -> float:
    """HF greedy's ms per token after the first (the prefill's), ``new`` tokens forced."""
    import torch

    with torch.inference_mode():
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        return (time.perf_counter() - t - prefill) * 1000 / (new - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    from autolade import api
    from autolade.machine.step_curve import measure_step_curve
    from autolade.workloads import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload

    model, tok = api.load(args.model, dtype=args.dtype)
    prompt = split_workload(load_workload("chat"), holdout_fraction=HOLDOUT_FRACTION)[1][0]
    ids = encode_prompt(tok, prompt.text, kind=prompt.kind)
    print(f"{args.model} {args.dtype}, load {os.getloadavg()[0]:.2f}, prompt {prompt.id} ({ids.shape[1]} tokens)", flush=True)
    for i in range(args.rounds):
        g = greedy_ms(model, ids)
        for repeats in (3, 9):
            c = measure_step_curve(model, ks=(1, 2, 4, 8, 16, 32, 64), contexts=(128,), repeats=repeats, warmup=1)
            p, spread = c.points[128], c.spread[128]
            print(f"round {i}: greedy {g:.1f} ms/token | curve, {repeats} repeats: c(1) {p[1]:.0f} (spread {spread[1]:.2f}) "
                  f"c(2) {p[2]:.0f} c(8) {p[8]:.0f} c(16) {p[16]:.0f} | c(1)/greedy {p[1] / g:.2f}, c(8)/c(1) {p[8] / p[1]:.2f}",
                  flush=True)
    print(f"greedy at the end {greedy_ms(model, ids):.1f} ms/token; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
