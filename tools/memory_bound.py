#!/usr/bin/env python3
"""What could a memory of earlier answers gain? Offline replay over real greedy outputs.

    python tools/draft_bound.py --dtype bfloat16 --sets chat --prompts 1000 --save-traces out/traces-chat.json
    python tools/draft_bound.py --dtype bfloat16 --sets code --prompts 1000 --save-traces out/traces-code.json
    python tools/memory_bound.py --traces out/traces-chat.json out/traces-code.json --sizes 10,30,all

Warms an ``AnswerMemory`` with the greedy outputs of the tuning split (the prompts ``autolade tune``
tunes on), then replays the held-out split with scaled prompt lookup (the CPU default) with and
without the memory as an extra draft source, priced by this machine's stored step curve. Also
replays each workload with the *other* workload's memory (a workload the memory has never seen),
and times a memory query against c(1). Forwards only: no engine overhead, no window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autolade.engine.memory import AnswerMemory, MemoryConfig
from autolade.tuning.replay import Lookup, Trace, WithMemory, replay


def split_traces(rows: list[dict], workload: str) -> tuple[list[dict], list[dict]]:
    """(tuning, held-out) rows by the prompt ids of autolade's tuning split."""
    from autolade.bench import load_sets

    held = {p.id for p in load_sets([workload], heldout=True)[workload]}
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def memory_of(rows: list[dict], size: int, config: MemoryConfig) -> AnswerMemory:
    mem = AnswerMemory(config)
    mem.add_many(r["output"] for r in rows[:size])
    return mem


def query_ms(mem: AnswerMemory, traces: list[Trace], *, queries: int = 2000) -> float:
    """Mean wall ms of one memory query over contexts taken from ``traces``."""
    contexts = [list(t.prompt + t.output[:i])[-mem.config.max_ngram :] for t in traces for i in range(1, len(t.output), 7)]
    contexts = (contexts * (queries // max(len(contexts), 1) + 1))[:queries]
    t0 = time.perf_counter()
    for c in contexts:
        mem.drafts(c)
    return (time.perf_counter() - t0) * 1000 / len(contexts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", nargs="+", required=True, help="JSON files from tools/draft_bound.py --save-traces")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--sizes", default="10,30,all", help="tuning-split answers in the memory")
    ap.add_argument("--scale-to", type=int, default=1000, help="answers in the memory for the query-time check")
    ap.add_argument("--config", default="{}", help='MemoryConfig fields as JSON, e.g. \'{"min_support": 3}\'')
    ap.add_argument("--curve-from", default=None, help="price steps with this profile JSON's step curve (a shipped, quiet one)")
    ap.add_argument("--curve", default=None, help="price steps with these c(k) in ms, as k=ms pairs (e.g. from "
                    "`autolade profile` output): 1=234.2,2=206.2,8=234.3,16=323.5")
    ap.add_argument("--floor", choices=["curve", "config"], default="curve",
                    help="what a memory draft token must be worth to be packed: priced by the curve, as generate() does "
                         "where a curve is stored (default), or the config's min_alive (as with no curve)")
    ap.add_argument("-o", "--output", default=None, help="also write the report here (markdown)")
    args = ap.parse_args(argv)

    from autolade import api

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from draft_bound import stored_curve

    if args.curve:
        from autolade.records.curve import StepCurve

        try:
            points = {int(k): float(ms) for k, ms in (pair.split("=") for pair in args.curve.split(","))}
        except ValueError:
            ap.error(f"--curve wants k=ms pairs separated by commas, e.g. 1=234.2,16=323.5; got {args.curve!r}")
        curve = StepCurve(points={128: points}, dtype=args.dtype)
    elif args.curve_from:
        from autolade.store.db import read_profile_file

        curve = read_profile_file(args.curve_from).curve
    else:
        model, _ = api.load(args.model, dtype=args.dtype)
        curve = stored_curve(model)
    config = MemoryConfig(**json.loads(args.config))
    token_cost = curve.token_cost() if args.floor == "curve" else None
    data: dict[str, list[dict]] = {}
    for f in args.traces:  # one set may come in several files (tuning answers, held-out outputs): rows add up
        for w, rows in json.loads(Path(f).read_text()).items():
            data.setdefault(w, []).extend(rows)
    splits = {w: split_traces(rows, w) for w, rows in data.items()}
    base = lambda: Lookup(length=16, drafts=3, scaled=True)
    floor = f"token cost {token_cost:.4f} x tokens/step" if token_cost is not None else f"min_alive {config.min_alive}"
    lines = [f"memory config: {config}", f"step curve ({curve.dtype}): c(1)={curve.cost(1):.2f} ms; floor: {floor}", "",
             "| held-out set | memory | answers | tok/step | packed/step | x greedy (curve) | x no memory |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for w, (tuning, held) in splits.items():
        traces = [Trace(tuple(r["prompt"]), tuple(r["output"])) for r in held]
        plain = replay(base, traces, curve)
        lines.append(f"| {w} ({len(held)}) | none | 0 | {plain.tokens_per_step:.3f} | {plain.packed_per_step:.1f} | "
                     f"{plain.speedup:.3f} | 1.000 |")
        sizes = [len(tuning) if s == "all" else min(int(s), len(tuning)) for s in args.sizes.split(",")]
        mems = [(w, n, memory_of(tuning, n, config)) for n in sizes]
        mems += [(o, len(splits[o][0]), memory_of(splits[o][0], len(splits[o][0]), config)) for o in splits if o != w]
        for src, n, mem in mems:
            for only in (False, True):
                r = replay(lambda mem=mem, only=only: WithMemory(base(), mem, only_unmatched=only, token_cost=token_cost),
                           traces, curve)
                tag = f"{src} tuning{' (unmatched steps)' if only else ''}"
                lines.append(f"| {w} ({len(held)}) | {tag} | {n} | {r.tokens_per_step:.3f} | {r.packed_per_step:.1f} | "
                             f"{r.speedup:.3f} | {r.speedup / plain.speedup:.3f} |")
        print("\n".join(lines[-(1 + 2 * len(mems)):]), file=sys.stderr, flush=True)
    # query time at scale: the tuning answers repeated up to --scale-to answers
    all_rows = [r for tuning, _ in splits.values() for r in tuning]
    repeated = (all_rows * (args.scale_to // max(len(all_rows), 1) + 1))[: args.scale_to]
    big = memory_of(repeated, len(repeated), config)
    held_traces = [Trace(tuple(r["prompt"]), tuple(r["output"])) for _, held in splits.values() for r in held]
    ms = query_ms(big, held_traces)
    lines += ["", f"memory query at {len(big)} answers ({big.tokens} tokens): {ms:.3f} ms = "
              f"{100 * ms / curve.cost(1):.1f}% of c(1)"]
    report = "\n".join(lines)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
