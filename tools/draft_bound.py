#!/usr/bin/env python3
"""How much could a per-step draft-sizing policy gain? Replays drafting rules over real greedy outputs.

    python tools/draft_bound.py --dtype bfloat16 --sets chat,code --heldout --prompts 40 \
        --max-new-tokens 128 --save-traces out/traces-bf16.json

Runs plain greedy (``model.generate(do_sample=False)``) once per prompt, then replays prompt-lookup
drafting rules over those outputs, pricing every step with this machine's stored step-latency curve
(measured first if the store has none): see ``autolade/replay.py``. ``--traces FILE`` replays saved
outputs without the model. Speedups are forwards only (no per-step engine overhead, no window).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autolade.tuning.replay import Trace, bound_report


def greedy_traces(model, tokenizer, sets: list[str], *, heldout: bool, limit: int, max_new_tokens: int) -> dict:
    import torch

    from autolade.bench import load_sets
    from autolade.workloads import encode_prompt

    out: dict[str, list[dict]] = {}
    for name, prompts in load_sets(sets, limit=limit, heldout=heldout).items():
        rows = out.setdefault(name, [])
        for p in prompts:
            ids = encode_prompt(tokenizer, p.text, kind=p.kind)
            with torch.inference_mode():
                seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.eos_token_id)
            rows.append({"id": p.id, "prompt": ids[0].tolist(), "output": seq[0, ids.shape[1]:].tolist()})
            print(f"  {name} {p.id}: {len(rows[-1]['output'])} tokens", file=sys.stderr, flush=True)
    return out


def stored_curve(model):
    from autolade.machine.hardware import probe_hardware
    from autolade.machine.step_curve import stored_or_measured
    from autolade.store.db import ProfileStore

    return stored_or_measured(model, store=ProfileStore(), hardware=probe_hardware(quick=True),
                              log=lambda m: print(m, file=sys.stderr))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    ap.add_argument("--sets", default="chat,code")
    ap.add_argument("--heldout", action="store_true", help="only the prompts `autolade tune` holds out")
    ap.add_argument("--prompts", type=int, default=40, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--traces", default=None, help="replay saved greedy outputs (JSON from --save-traces)")
    ap.add_argument("--save-traces", default=None)
    args = ap.parse_args(argv)

    from autolade import api

    model, tok = api.load(args.model, dtype=args.dtype)
    curve = stored_curve(model)
    if args.traces:
        data = json.loads(Path(args.traces).read_text())
    else:
        t0 = time.perf_counter()
        data = greedy_traces(model, tok, args.sets.split(","), heldout=args.heldout, limit=args.prompts,
                             max_new_tokens=args.max_new_tokens)
        print(f"greedy outputs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if args.save_traces:
            Path(args.save_traces).parent.mkdir(parents=True, exist_ok=True)
            Path(args.save_traces).write_text(json.dumps(data))

    sets = {name: [Trace(tuple(r["prompt"]), tuple(r["output"])) for r in rows] for name, rows in data.items()}
    print(bound_report(sets, curve))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
