#!/usr/bin/env python3
"""Token recycling with a fresh table per prompt vs one carried from prompt to prompt (acceptance).

``generate()`` with the memory on keeps a recycling config's ``NextTokenTable`` from call to call in
the process. This counts what that buys, hardware-free by default: the same held-out prompts decoded
by the same setting, (1) each from an empty table, (2) one table carried through them in order,
(3) with ``--warm N``, the table first taught by N tuning-split prompts, then carried. Reports tokens
per step and packed tokens per step per mode; ``--curve`` prices each mode's steps on a step curve
(``tools/arch_curve.py`` output or a device check's JSON: speedup = new tokens x c(1) / sum of
c(packed)), ``--priced`` cuts the recycled nodes by this machine's stored curve, as ``generate()`` does.
Timing on this machine is ``autolade bench -c ...,carry=1``.

    python3 tools/recycle_carry.py --model qwen2.5-coder-1.5b --set chat --prompts 5 \\
        -c 0,0,0,0,recycle=32 --curve docs/bench/gpu-h200-20261204/arch_curves_qwen.json -o out/carry.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def decode_all(model, prompts: Sequence[torch.Tensor], config, *, table, eos: Sequence[int], max_new_tokens: int,
               token_cost: float | None) -> list[dict]:
    """Each prompt decoded in order; ``table`` None: a fresh one each, else that one carried through."""
    from autolade.engine.decode import lookahead_decode

    rows = []
    for ids in prompts:
        new, log = lookahead_decode(model, ids, config=config, max_new_tokens=max_new_tokens, eos_ids=eos,
                                    recycled=table, token_cost=token_cost)
        rows.append({"new_tokens": len(new), "packed": [s.packed for s in log.steps],
                     "recycled_accepted": sum(s.accepted for s in log.steps if s.accepted_from == "recycle")})
    return rows


def summarise(rows: list[dict], curve=None, context: int = 512) -> dict:
    steps = sum(len(r["packed"]) for r in rows)
    decoded = sum(max(r["new_tokens"] - 1, 0) for r in rows)  # the first token comes from the prefill
    out = {"prompts": len(rows), "steps": steps, "tokens_per_step": decoded / steps if steps else 0.0,
           "packed_per_step": sum(sum(r["packed"]) for r in rows) / steps if steps else 0.0,
           "recycled_accepted": sum(r["recycled_accepted"] for r in rows)}
    if curve is not None and steps:
        cost = sum(curve.cost(k, context) for r in rows for k in r["packed"])
        out["speedup_on_curve"] = decoded * curve.cost(1, context) / cost
    return out


def measure(model, held: Sequence[torch.Tensor], config, *, warm: Sequence[torch.Tensor] = (), eos: Sequence[int] = (),
            max_new_tokens: int = 128, token_cost: float | None = None, curve=None) -> dict:
    """{mode: summary} for "fresh", "carried" and (with ``warm`` prompts) "warmed"."""
    from autolade.engine.recycle import NextTokenTable

    kw = dict(eos=eos, max_new_tokens=max_new_tokens, token_cost=token_cost)
    out = {"fresh": summarise(decode_all(model, held, config, table=None, **kw), curve)}
    carried = NextTokenTable()
    out["carried"] = summarise(decode_all(model, held, config, table=carried, **kw), curve)
    out["carried"]["tokens_known"] = carried.known
    out["carried"]["rank_rates"] = [round(carried.hits.rate(r), 3) for r in range(carried.k)]
    if warm:
        warmed = NextTokenTable()
        decode_all(model, warm, config, table=warmed, **kw)
        out["warmed"] = summarise(decode_all(model, held, config, table=warmed, **kw), curve)
        out["warmed"]["warm_prompts"] = len(warm)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--set", default="chat", help="chat or code (held-out prompts)")
    ap.add_argument("--prompts", type=int, default=10, help="held-out prompts, decoded in order")
    ap.add_argument("--warm", type=int, default=0, help="tuning-split prompts that teach a third table first")
    ap.add_argument("--max-new-tokens", "-n", type=int, default=128)
    ap.add_argument("--config", "-c", action="append", default=None, help="W,N,G[,LOOKUP],recycle=R (repeatable)")
    ap.add_argument("--priced", action="store_true", help="cut recycled nodes by this machine's stored step curve")
    ap.add_argument("--curve", type=Path, default=None, help="price the steps on this curve (arch_curve or device check JSON)")
    ap.add_argument("-o", "--output", type=Path, default=None, help="write the results as JSON")
    args = ap.parse_args(argv)

    from autolade import api
    from autolade.config import parse_method
    from autolade.machine.models import eos_ids
    from autolade.workloads import encode_prompt, load_workload, split_workload

    specs = args.config or ["0,0,0,0,recycle=16"]
    configs = [parse_method(spec)[0] for spec in specs]
    if not all(c.recycle for c in configs):
        raise SystemExit("every --config needs recycle=N (N > 0): without recycling there is no table to carry")
    curve = None
    if args.curve is not None:
        from price_tables import curve_from

        curve = curve_from(args.curve, args.model)
    model, tok = api.load(args.model, dtype=args.dtype)
    token_cost = None
    if args.priced:
        from autolade.runtime.settings import stored_token_cost

        token_cost = stored_token_cost(model)
        if token_cost is None:
            raise SystemExit("--priced needs this machine's step curve: run `autolade profile --model ...` first")
    tune, held = split_workload(load_workload(args.set))
    kind = "code" if args.set == "code" else "chat"
    encode = [encode_prompt(tok, p.text, kind=kind) for p in held[: args.prompts]]
    warm = [encode_prompt(tok, p.text, kind=kind) for p in tune[: args.warm]]
    results = {"model": args.model, "dtype": args.dtype, "set": args.set, "token_cost": token_cost,
               "curve": str(args.curve) if args.curve else None, "settings": {}}
    for spec, config in zip(specs, configs):
        found = measure(model, encode, config, warm=warm, eos=eos_ids(model), max_new_tokens=args.max_new_tokens,
                        token_cost=token_cost, curve=curve)
        results["settings"][spec] = found
        for mode, row in found.items():
            priced = f", {row['speedup_on_curve']:.2f}x on the curve" if "speedup_on_curve" in row else ""
            print(f"{spec:<28} {mode:<8} {row['tokens_per_step']:.3f} tokens/step, {row['packed_per_step']:.1f} packed, "
                  f"{row['recycled_accepted']} recycled tokens accepted{priced}", flush=True)
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
