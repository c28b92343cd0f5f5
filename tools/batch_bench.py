"""Throughput of batched lookahead: B prompts at once, total new tokens per second, three ways,
interleaved group by group in one process:

  hf        HF ``model.generate`` on the left-padded batch, greedy (its own batched decoding)
  hf-static the same on a ``StaticCache`` with generate's compiled forward (``--arms``; what a user who compiles
            HF runs: ``tuning.harness.static_kwargs``; a graph per batch size, built in each B's untimed warm-up)
  batched   ``autolade.generate`` on the same padded batch: all rows in one forward per step (eager)
  one-by-one ``autolade.generate`` on each row alone, one after the other (eager)
  batched-compiled, one-by-one-compiled: the same with ``compile=True`` (``--arms``; warmed up before timing)
  continuous-compiled  every prompt of the cell through the server's ``ModelServer`` at most B rows at a time,
            compiled: a row that finishes is replaced by the next prompt at the next step (``autolade serve`` /
            ``autolade batch``), so no batch runs down to its slowest row (``--arms``; one run per cell, after
            its groups)

    python3 tools/batch_bench.py --model smollm2-135m --dtype float32 --sets chat,code --batch 1,2,4,8 --prompts 8 -o out/batch-bench

Prompts: the held-out MT-Bench (chat, through the chat template) and HumanEval (code, raw) prompts,
the first ``--prompts`` of each set, cut into groups of B. Every row's tokens are checked: batched
against one-by-one (the same engine; a mismatch is reported with the position, and in bf16 can be a
tie), HF's padded batch against HF greedy on each row alone is not expected to hold in bf16 (padding
changes the kernels' sums) and is only counted. Writes OUT.json after every cell; prints a table.
The memory is off (a fresh home), so no answer is drafted from an earlier prompt's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import autolade
from autolade.bench.padding import new_rows, padded
from autolade.bench.run import load_sets
from autolade.config import parse_config
from autolade.machine.hardware import environment, load_average
from autolade.machine.models import eos_ids
from autolade.tuning.harness import static_kwargs
from autolade.workloads import encode_prompt

ARMS = ("hf", "batched", "one-by-one", "batched-compiled", "one-by-one-compiled", "hf-static", "continuous-compiled")


def run_group(model, rows, *, config, workload: str, n: int, pad: int, eos: set[int],
              arms: tuple[str, ...] = ARMS[:3], static_length: int = 0) -> dict:
    """Every arm on one group of rows. ``static_length``: the tokens hf-static's cache holds (one capacity for
    every group, so that no group's length recompiles its graph)."""
    ids, mask = padded(rows, pad)
    timing, outputs, res = {}, {}, None
    for arm in [a for a in arms if a != "continuous-compiled"]:
        t0 = time.perf_counter()
        if arm.startswith("hf"):
            static = static_kwargs(model, max(static_length, ids.shape[1] + n)) if arm == "hf-static" else {}
            hf = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=pad, **static)
            outputs[arm] = new_rows(hf, ids.shape[1], eos)
        elif arm.startswith("batched"):
            out = autolade.generate(model, ids, attention_mask=mask, max_new_tokens=n, config=config, workload=workload,
                                    memory=False, pad_token_id=pad, compile=arm.endswith("compiled"))
            res = out if res is None or arm == "batched-compiled" else res  # the compiled arm's stats, where it ran
            outputs[arm] = new_rows(out.sequences, ids.shape[1], eos) if len(rows) > 1 else [out.sequences[0, ids.shape[1] :].tolist()]
        else:
            outputs[arm] = [autolade.generate(model, r, max_new_tokens=n, config=config, workload=workload, memory=False,
                                              compile=arm.endswith("compiled")).sequences[0, r.shape[1] :].tolist()
                            for r in rows]  # fmt: skip
        timing[arm] = time.perf_counter() - t0
    alone = "one-by-one" if "one-by-one" in outputs else "one-by-one-compiled"
    batched = [a for a in ("batched", "batched-compiled") if a in outputs]
    batch = getattr(res, "batch", None)
    return {"seconds": timing, "tokens": {k: sum(len(o) for o in v) for k, v in outputs.items()}, "alone": outputs[alone],
            "batched_equals_one_by_one": {a: sum(x == y for x, y in zip(outputs[a], outputs[alone])) for a in batched},
            "hf_equals_one_by_one": sum(a == b for a, b in zip(outputs["hf"], outputs[alone])),
            "rows": len(rows), "steps": batch.steps if batch else res.stats.steps,
            "settings": (res.stats[0] if batch else res.stats).settings_source,
            "hole_share": batch.hole_share if batch else None, "packed_per_step": batch.packed_per_step if batch else None, "width_per_step": batch.width_per_step if batch else None,
            "alone_share": batch.alone_share if batch else None, "cut_share": batch.cut_share if batch else None}


def run_continuous(model, tok, rows, *, max_rows: int, workload: str, n: int, config) -> tuple[float, list]:
    """Every row through a ``ModelServer`` (the server's own request path and ``BatchLoop``), greedy, ``max_rows``
    in flight, compiled; (seconds, outputs)."""
    from autolade.serve.requests import DecodeRequest
    from autolade.serve.worker import ModelServer

    server = ModelServer(model, tok, name="bench", workload=workload, memory=False, config=config, max_batch=max_rows,
                         compile=True)
    try:  # each request's settings resolved as the server resolves them, before the clock starts
        requests = [server.prepare(DecodeRequest(chat=True, temperature=0.0), r, n, lambda tokens: None)[0] for r in rows]
        t0 = time.perf_counter()
        jobs = [server.loop.submit(request) for request in requests]
        outputs = [job.wait().out for job in jobs]
        return time.perf_counter() - t0, outputs
    finally:
        server.loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--sets", default="chat,code")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per set (cut into groups of B)")
    ap.add_argument("--max-new-tokens", "-n", type=int, default=128)
    ap.add_argument("--config", "-c", default="auto", help="W,N,G[,...] for every row, or auto: what generate() picks for "
                    "the set's workload (stored profile, prediction, default)")
    ap.add_argument("--arms", default=",".join(ARMS[:3]), help=f"what runs, in this order, group by group: {', '.join(ARMS)} "
                    "(hf, a one-by-one and a batched arm are needed: the ratios and the exactness check are against the first two, the step statistics come from the third)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-minutes", type=float, default=60.0, help="start no new cell after this many minutes")
    ap.add_argument("-o", "--out", default="out/batch-bench")
    args = ap.parse_args()
    config = None if args.config == "auto" else parse_config(args.config)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch.split(",")]
    arms = tuple(args.arms.split(","))
    if (set(arms) - set(ARMS) or "hf" not in arms or not {"one-by-one", "one-by-one-compiled"} & set(arms)
            or not {"batched", "batched-compiled"} & set(arms)):  # a group's step statistics come from a batched arm
        ap.error(f"--arms: from {', '.join(ARMS)}, with hf, a one-by-one arm and a batched arm")
    model, tok = autolade.load(args.model, dtype=args.dtype)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = set(eos_ids(model))
    sets = load_sets(args.sets.split(","), limit=args.prompts, heldout=True)
    report = {"environment": environment(model), "load_average_at_start": load_average(), "model": args.model,
              "config": args.config, "arms": list(arms), "cells": []}
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with torch.inference_mode():
        encoded_sets = {name: [encode_prompt(tok, p.text, kind=p.kind) for p in prompts] for name, prompts in sets.items()}
        static_length = max(r.shape[1] for rows in encoded_sets.values() for r in rows) + args.max_new_tokens
        warm = next(iter(encoded_sets.values()))[:2]
        run_group(model, warm, config=config, workload="chat", n=8, pad=pad, eos=eos, arms=arms,
                  static_length=static_length)  # compiles, untimed
        if "continuous-compiled" in arms:
            run_continuous(model, tok, warm, max_rows=2, workload="chat", n=8, config=config)
        for name, encoded in encoded_sets.items():
            for b in sizes:
                if time.perf_counter() - start > 60 * args.max_minutes:
                    break
                groups = [encoded[i : i + b] for i in range(0, len(encoded) - b + 1, b)]
                if "hf-static" in arms and groups:  # its graph is of one batch size: built here, untimed
                    ids, mask = padded(groups[0], pad)
                    model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=pad,
                                   **static_kwargs(model, static_length))
                cells = [run_group(model, g, config=config, workload=name, n=args.max_new_tokens, pad=pad, eos=eos, arms=arms,
                                   static_length=static_length) for g in groups]
                cell = {"set": name, "batch": b, "groups": len(cells), "settings": sorted({c["settings"] for c in cells})}
                if "continuous-compiled" in arms:
                    seconds, outs = run_continuous(model, tok, [r for g in groups for r in g], max_rows=b, workload=name,
                                                   n=args.max_new_tokens, config=config)
                    singles = [o for c in cells for o in c["alone"]]
                    cells[0]["seconds"]["continuous-compiled"] = seconds
                    cells[0]["tokens"]["continuous-compiled"] = sum(len(o) for o in outs)
                    for c in cells[1:]:
                        c["seconds"]["continuous-compiled"], c["tokens"]["continuous-compiled"] = 0.0, 0
                    cell["continuous_equals_one_by_one"] = sum(x == y for x, y in zip(outs, singles))
                for method in arms:
                    tokens = sum(c["tokens"][method] for c in cells)
                    seconds = sum(c["seconds"][method] for c in cells)
                    cell[method] = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2)}
                for key in ("hf_equals_one_by_one", "rows"):
                    cell[key] = sum(c[key] for c in cells)
                cell["batched_equals_one_by_one"] = {a: sum(c["batched_equals_one_by_one"][a] for c in cells)
                                                     for a in cells[0]["batched_equals_one_by_one"]}
                cell["packed_per_step"] = [c["packed_per_step"] for c in cells]
                cell["width_per_step"] = [c["width_per_step"] for c in cells]
                cell["hole_share"] = [c["hole_share"] for c in cells]
                cell["alone_share"] = [c["alone_share"] for c in cells]
                cell["cut_share"] = [c["cut_share"] for c in cells]
                report["cells"].append(cell)
                out.write_text(json.dumps(report, indent=1))
                alone = "one-by-one" if "one-by-one" in arms else "one-by-one-compiled"
                rates = ", ".join(f"{a} {cell[a]['tokens_per_s']}" for a in arms)
                against = [alone] + [h for h in ("hf", "hf-static") if h in arms]
                ratios = ", ".join(f"{a}/{h} {cell[a]['tokens_per_s'] / cell[h]['tokens_per_s']:.2f}x"
                                   for a in arms if a.startswith(("batched", "continuous")) for h in against)
                print(f"{name} B={b}: tok/s {rates}; {ratios}; rows equal {alone} {cell['batched_equals_one_by_one']} "
                      f"of {cell['rows']}", flush=True)

if __name__ == "__main__":
    main()
