#!/usr/bin/env python3
"""Lookahead sampling vs HF sampling: throughput at a few temperatures on MT-Bench and HumanEval.

    python tools/bench_sampling.py --dtype bfloat16 --prompts 10 --max-new-tokens 128 \
        --temperatures 0.7,1.0 --config default --config 4,4,4 --out out/bench_sampling

For every (set, temperature, prompt) each method runs once, in an order that rotates from
prompt to prompt, so that drift of a shared machine spreads over all methods. HF is
``model.generate(do_sample=True, temperature=T)`` (transformers' defaults otherwise: top_k=50);
autolade is ``autolade.generate(do_sample=True, temperature=T, seed=i)`` with the same
defaults, so both sample from the same distribution (tests/test_sampling.py). Sampled outputs
differ (and so may their lengths, at EOS), so speedups are throughput ratios: (method tokens /
method time) / (HF tokens / HF time), per set from the sums, and the median of per-prompt ratios.
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

from autolade import api
from autolade.config import parse_config
from autolade.tuning.harness import rotate, run_autolade, run_hf, setting_label
from autolade.workloads import encode_prompt, load_workload

HF = "hf-sample"


def parse_spec(spec: str) -> dict:
    """``default`` (what generate picks: stored profile, else built-in) or ``W,N,G[,LOOKUP][,key=value...]``."""
    return {} if spec == "default" else {"config": parse_config(spec)}


def label(spec: str) -> str:
    return "autolade (default)" if spec == "default" else f"autolade {setting_label(parse_config(spec))}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--sets", default="chat,code")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--config", action="append", default=None, help="default or W,N,G[,LOOKUP]; repeatable")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a small model on a shared CPU)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default="out/bench_sampling", help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    specs = args.config or ["default", "4,4,4"]
    temps = [float(t) for t in args.temperatures.split(",")]
    model, tok = api.load(args.model, dtype=args.dtype)
    methods = [(HF, None)] + [(label(s), parse_spec(s)) for s in specs]
    sets = {name: load_workload(name, limit=args.prompts) for name in args.sets.split(",")}
    encoded = {n: [encode_prompt(tok, p.text, kind=p.kind) for p in ps] for n, ps in sets.items()}

    def call(name, kw, ids, temperature, seed):
        """(new tokens, seconds, autolade stats or None): HF sampling (seeded through torch's global
        generator, before the clock starts) or autolade sampling with its own seed."""
        sample = {"do_sample": True, "temperature": temperature}
        if name == HF:
            torch.manual_seed(seed)
            run = run_hf(model, ids, max_new_tokens=args.max_new_tokens, **sample)
        else:
            run = run_autolade(model, ids, max_new_tokens=args.max_new_tokens, seed=seed, **sample, **kw)
        return len(run.tokens), run.seconds, run.stats

    first = next(iter(encoded.values()))[0]
    for _ in range(args.warmup):
        for name, kw in methods:
            call(name, kw, first, temps[0], 0)

    runs = []
    load0 = os.getloadavg()[0]
    k = 0
    for set_name, prompts in encoded.items():
        for temperature in temps:
            for i, ids in enumerate(prompts):
                order = rotate(methods, k)
                k += 1
                for name, kw in order:
                    n, secs, stats = call(name, kw, ids, temperature, i)
                    runs.append(
                        dict(set=set_name, temperature=temperature, prompt=i, method=name, tokens=n, time_s=secs,
                             tokens_per_step=getattr(stats, "tokens_per_step", None),
                             accepted_per_step=getattr(stats, "accepted_per_step", None),
                             settings=getattr(stats, "settings", None), policy=getattr(stats, "policy", None))
                    )  # fmt: skip
                    print(f"{set_name} T={temperature} #{i} {name}: {n} tok {secs:.2f}s", file=sys.stderr)

    summary = []
    for set_name in encoded:
        for temperature in temps:
            mine = [r for r in runs if r["set"] == set_name and r["temperature"] == temperature]
            hf = {r["prompt"]: r for r in mine if r["method"] == HF}
            hf_tps = sum(r["tokens"] for r in hf.values()) / sum(r["time_s"] for r in hf.values())
            for name, _ in methods:
                rs = [r for r in mine if r["method"] == name]
                tps = sum(r["tokens"] for r in rs) / sum(r["time_s"] for r in rs)
                per = [(r["tokens"] / r["time_s"]) / (hf[r["prompt"]]["tokens"] / hf[r["prompt"]]["time_s"]) for r in rs]
                tps_step = [r["tokens_per_step"] for r in rs if r["tokens_per_step"] is not None]
                summary.append(
                    dict(set=set_name, temperature=temperature, method=name, tokens=sum(r["tokens"] for r in rs),
                         tokens_per_s=tps, speedup=tps / hf_tps, median_speedup=statistics.median(per),
                         tokens_per_step=statistics.mean(tps_step) if tps_step else None)
                )  # fmt: skip
    env = dict(model=args.model, dtype=args.dtype, threads=args.threads, device=str(next(model.parameters()).device),
               torch=torch.__version__, max_new_tokens=args.max_new_tokens, prompts=args.prompts,
               load_avg_start=round(load0, 2), load_avg_end=round(os.getloadavg()[0], 2),
               cpus=os.cpu_count(), command=" ".join(sys.argv))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(environment=env, summary=summary, runs=runs), indent=1))
    md = markdown(summary, env)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


def markdown(summary, env) -> str:
    lines = [
        f"{env['model']} {env['dtype']} on {env['device']} ({env['threads']} torch thread(s), {env['cpus']} CPUs, "
        f"load average {env['load_avg_start']} -> {env['load_avg_end']}), {env['prompts']} prompts per set, "
        f"{env['max_new_tokens']} new tokens at most, seed = prompt index.",
        "",
        "| set | T | method | tokens | tok/s | speedup vs HF sampling | median per-prompt | tokens/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        tps = f"{s['tokens_per_step']:.2f}" if s["tokens_per_step"] is not None else "1.00"
        lines.append(
            f"| {s['set']} | {s['temperature']} | {s['method']} | {s['tokens']} | {s['tokens_per_s']:.1f} | "
            f"{s['speedup']:.2f}x | {s['median_speedup']:.2f}x | {tps} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
