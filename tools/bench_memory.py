#!/usr/bin/env python3
"""The n-gram memory, timed: the same setting with and without earlier answers, held-out prompts.

    python tools/draft_bound.py --dtype bfloat16 --sets chat --prompts 1000 --save-traces out/traces-chat.json
    python tools/bench_memory.py --dtype bfloat16 --traces out/traces-chat.json out/traces-code.json --prompts 10

In a fresh AUTOLADE_HOME (the user's memory is never touched), the memory of each workload is warmed
with the greedy outputs of its tuning split only (from the traces), then every held-out prompt runs,
interleaved in one process: HF greedy, HF prompt lookup, autolade without memory, autolade with its
workload's memory (read only, so every prompt sees the same memory), and autolade with the *other*
workload's memory (a workload that memory has never seen). Same setting for every autolade run.
``--uncut`` adds the workload's memory with ``min_alive=0`` (every draft packed as long as its
evidence allows, the memory before drafts had to earn their length); ``--no-other`` drops the
other workload's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", nargs="+", required=True, help="JSON files from tools/draft_bound.py --save-traces")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--prompts", type=int, default=10, help="held-out prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--config", default=None, help="W,N,G[,LOOKUP][,key=value...] (default: the CPU built-in scaled lookup)")
    ap.add_argument("--uncut", action="store_true", help="also time the memory with min_alive=0 (no cut by earned length)")
    ap.add_argument("--no-other", action="store_true", help="skip the other workload's memory")
    ap.add_argument("-o", "--output", default="out/bench_memory", help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)

    os.environ["AUTOLADE_HOME"] = tempfile.mkdtemp(prefix="autolade-bench-memory-")  # before autolade reads it
    import torch

    from autolade import api
    from autolade.config import parse_method
    from autolade.engine.memory import AnswerMemory, MemoryConfig
    from autolade.machine.models import model_fingerprint
    from autolade.records.profile import model_key
    from autolade.runtime.defaults import CPU_DEFAULT
    from autolade.store.memory import add_answers, open_memory_store
    from autolade.tuning.harness import divergence, rotate, run_autolade, run_greedy, run_pld
    from autolade.workloads import encode_prompt, load_workload, split_workload

    config, _ = parse_method(args.config) if args.config else (CPU_DEFAULT, None)
    model, tok = api.load(args.model, dtype=args.dtype)
    key = model_key(model_fingerprint(model))
    data: dict[str, list[dict]] = {}
    for f in args.traces:  # one set may come in several files: rows add up (as in tools/memory_bound.py)
        for w, rows in json.loads(Path(f).read_text()).items():
            data.setdefault(w, []).extend(rows)
    sets = list(data)
    uncut: dict[str, AnswerMemory] = {}
    with open_memory_store() as store:
        for w, rows in data.items():
            tuning = {p.id for p in split_workload(load_workload(w))[0]}
            warm = [r["output"] for r in rows if r["id"] in tuning]
            add_answers(store, model_key=key, workload=w, answers=warm, source="bench_memory", keep=100_000)
            uncut[w] = AnswerMemory(MemoryConfig(min_alive=0.0))
            uncut[w].add_many(warm)
            print(f"{w}: memory warmed with {len(warm)} tuning-split answers", file=sys.stderr)

    report: dict[str, dict] = {}
    per_prompt: dict[str, dict] = {}  # set -> prompt id -> method -> this prompt's seconds and tokens
    for w in sets:
        other = next((o for o in sets if o != w), None)
        methods = {
            "HF greedy": lambda ids: run_greedy(model, ids, max_new_tokens=args.max_new_tokens),
            "HF prompt lookup": lambda ids: run_pld(model, ids, max_new_tokens=args.max_new_tokens),
            "autolade": lambda ids: run_autolade(model, ids, max_new_tokens=args.max_new_tokens, config=config, memory=False),
            "autolade + memory": lambda ids, w=w: run_autolade(model, ids, max_new_tokens=args.max_new_tokens, config=config,
                                                               memory="read", workload=w),
        }
        if args.uncut:
            methods["autolade + memory, uncut"] = lambda ids, w=w: run_autolade(
                model, ids, max_new_tokens=args.max_new_tokens, config=config, memory=uncut[w])
        if other and not args.no_other:
            methods[f"autolade + {other} memory"] = lambda ids, o=other: run_autolade(
                model, ids, max_new_tokens=args.max_new_tokens, config=config, memory="read", workload=o)
        held = split_workload(load_workload(w))[1][: args.prompts]
        totals = {m: {"seconds": 0.0, "tokens": 0, "steps": 0, "exact": 0, "memory_tokens": 0} for m in methods}
        warm_ids = encode_prompt(tok, held[0].text, kind=held[0].kind)
        for fn in methods.values():
            fn(warm_ids)  # untimed warm-up of every method
        for i, p in enumerate(held):
            before = {m: dict(t) for m, t in totals.items()}
            ids = encode_prompt(tok, p.text, kind=p.kind)
            ref = None
            for name in rotate(list(methods), i):
                with torch.inference_mode():
                    run = methods[name](ids)
                if name == "HF greedy":
                    ref = run.tokens
                t = totals[name]
                t["seconds"] += run.seconds
                t["tokens"] += len(run.tokens)
                t["_tokens"] = run.tokens
                if run.stats is not None and hasattr(run.stats, "accepted_by"):
                    t["steps"] += run.stats.steps
                    t["memory_tokens"] += run.stats.accepted_by.get("memory", 0)
            for t in totals.values():
                t["exact"] += divergence(ref, t.pop("_tokens")) is None
            per_prompt.setdefault(w, {})[p.id] = {m: {"seconds": t["seconds"] - before[m]["seconds"],
                                                      "tokens": t["tokens"] - before[m]["tokens"]} for m, t in totals.items()}
            print(f"  {w} {p.id}: " + ", ".join(f"{m} {t['tokens'] / t['seconds']:.1f} tok/s" for m, t in totals.items()),
                  file=sys.stderr, flush=True)
        base = totals["HF greedy"]["tokens"] / totals["HF greedy"]["seconds"]
        plain = totals["autolade"]["tokens"] / totals["autolade"]["seconds"]
        report[w] = {m: {**t, "tok_s": t["tokens"] / t["seconds"], "x_greedy": t["tokens"] / t["seconds"] / base,
                         "x_no_memory": t["tokens"] / t["seconds"] / plain} for m, t in totals.items()}
        report[w]["_prompts"] = len(held)

    lines = [f"model {args.model} {args.dtype}, setting {config.to_dict()}, {args.max_new_tokens} new tokens, held-out prompts", "",
             "| set | method | tok/s | x HF greedy | x autolade without memory | tok/step | memory tokens | exact |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for w, methods in report.items():
        n = methods.pop("_prompts")
        for m, r in methods.items():
            tps = f"{(r['tokens'] - n) / r['steps']:.2f}" if r["steps"] else "-"
            lines.append(f"| {w} ({n}) | {m} | {r['tok_s']:.1f} | {r['x_greedy']:.3f} | {r['x_no_memory']:.3f} | {tps} | "
                         f"{r['memory_tokens'] or '-'} | {r['exact']}/{n} |")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**report, "_per_prompt": per_prompt}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
