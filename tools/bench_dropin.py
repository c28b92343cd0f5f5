#!/usr/bin/env python3
"""The drop-in's own cost: ``autolade.generate()`` vs ``model.generate(custom_generate=autolade.hf.lookahead)``.

    python tools/bench_dropin.py --dtype bfloat16 --prompts 10 --max-new-tokens 128 --out out/bench_dropin

Both run the same engine with the same explicit settings (``--config``, default the CPU built-in
scaled prompt lookup; ``--policy`` optional), greedy, on MT-Bench and HumanEval prompts, interleaved
in one process (the order rotates per prompt, so drift of a shared machine spreads over both).
What differs is transformers' input preparation around the drop-in (generation config, logits
processors, stopping criteria, its unused DynamicCache). Prints and writes the time ratio
drop-in / direct per set (sums of times, and the median of per-prompt ratios), and checks that
both wrote the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import autolade.hf
from autolade import api
from autolade.config import parse_method
from autolade.runtime.defaults import CPU_DEFAULT
from autolade.runtime.policies import make_policy
from autolade.tuning.harness import TIMER, Timed, hf_kwargs, rotate, run_autolade, setting_label
from autolade.workloads import encode_prompt, load_workload

DIRECT, DROPIN = "autolade.generate", "model.generate(custom_generate=lookahead)"


def run_dropin(model, ids, *, max_new_tokens: int, config, policy) -> Timed:
    """The drop-in on one prompt, timed like harness.run_autolade (the policy built before the clock)."""
    kwargs = hf_kwargs(model, ids, max_new_tokens=max_new_tokens)
    stats = []
    out, secs = TIMER(ids.device, lambda: model.generate(ids, **kwargs, custom_generate=autolade.hf.lookahead, config=config,
                                                         policy=policy, memory=False, lookahead_on_stats=stats.append))  # fmt: skip
    return Timed(out[0, ids.shape[1] :].tolist(), secs, stats[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--sets", default="chat,code")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--config", default=None, help="W,N,G[,LOOKUP][,key=value...] (default: the CPU built-in scaled lookup)")
    ap.add_argument("--policy", default=None, help="a runtime policy or preset (default: static, or the config's policy=)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default="out/bench_dropin", help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    config, spec_policy = parse_method(args.config) if args.config else (CPU_DEFAULT, None)
    policy_spec = args.policy or spec_policy
    model, tok = api.load(args.model, dtype=args.dtype)
    sets = {name: load_workload(name, limit=args.prompts) for name in args.sets.split(",")}
    encoded = {n: [encode_prompt(tok, p.text, kind=p.kind) for p in ps] for n, ps in sets.items()}

    def call(method, ids) -> Timed:
        policy = make_policy(policy_spec, config)  # a fresh one per run, before the clock
        if method == DIRECT:
            return run_autolade(model, ids, max_new_tokens=args.max_new_tokens, config=config, policy=policy)
        return run_dropin(model, ids, max_new_tokens=args.max_new_tokens, config=config, policy=policy)

    methods = [DIRECT, DROPIN]
    first = next(iter(encoded.values()))[0]
    for _ in range(args.warmup):
        for m in methods:
            call(m, first)

    runs, k = [], 0
    load0 = os.getloadavg()[0]
    for set_name, prompts in encoded.items():
        for i, ids in enumerate(prompts):
            for m in rotate(methods, k):
                t = call(m, ids)
                runs.append(dict(set=set_name, prompt=i, method=m, tokens=t.tokens, time_s=t.seconds, steps=t.stats.steps,
                                 settings_source=t.stats.settings_source))  # fmt: skip
                print(f"{set_name} #{i} {m}: {len(t.tokens)} tok {t.seconds:.3f}s", file=sys.stderr)
            k += 1

    summary = []
    for set_name in encoded:
        by = {}
        for r in runs:
            if r["set"] == set_name:
                by.setdefault(r["prompt"], {})[r["method"]] = r
        direct = sum(p[DIRECT]["time_s"] for p in by.values())
        dropin = sum(p[DROPIN]["time_s"] for p in by.values())
        summary.append(dict(set=set_name, prompts=len(by), direct_s=direct, dropin_s=dropin, ratio=dropin / direct,
                            median_ratio=statistics.median(p[DROPIN]["time_s"] / p[DIRECT]["time_s"] for p in by.values()),
                            identical=sum(p[DROPIN]["tokens"] == p[DIRECT]["tokens"] for p in by.values())))  # fmt: skip
    env = dict(model=args.model, dtype=args.dtype, threads=torch.get_num_threads(), setting=setting_label(config, policy_spec),
               max_new_tokens=args.max_new_tokens, prompts=args.prompts, torch=torch.__version__,
               load_avg_start=round(load0, 2), load_avg_end=round(os.getloadavg()[0], 2), cpus=os.cpu_count(),
               command=" ".join(sys.argv))  # fmt: skip
    for r in runs:
        r["tokens"] = len(r["tokens"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(environment=env, summary=summary, runs=runs), indent=1))
    lines = [
        f"{env['model']} {env['dtype']}, {env['setting']}, {env['threads']} torch thread(s), {env['cpus']} CPUs, load average "
        f"{env['load_avg_start']} -> {env['load_avg_end']}, {env['max_new_tokens']} new tokens at most",
        "",
        "| set | prompts | identical tokens | autolade.generate s | drop-in s | drop-in / direct | median per prompt |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        lines.append(f"| {s['set']} | {s['prompts']} | {s['identical']}/{s['prompts']} | {s['direct_s']:.2f} | "
                     f"{s['dropin_s']:.2f} | {s['ratio']:.3f} | {s['median_ratio']:.3f} |")  # fmt: skip
    md = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if all(s["identical"] == s["prompts"] for s in summary) else 1


if __name__ == "__main__":
    raise SystemExit(main())
