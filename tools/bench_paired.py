#!/usr/bin/env python3
"""Paired comparison of two methods of an `autolade bench` run, on the prompts where they wrote the same tokens.

    python tools/bench_paired.py out/bench-bf16-heldout-all.json --base "al lookup16x3s"

In bf16 the methods' outputs drift apart (float noise flips near-ties), so a method's `x greedy`
compares different texts: one that wandered into a repetitive answer looks faster. On prompts where
two methods produced identical tokens, their time ratio is the like-for-like speed difference.
Prints, per set and method: how many prompts matched the base, the base/method time ratio over
them (sum of times) and its geometric mean per prompt, and the ratio over all prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autolade.bench.report import HF_GREEDY


def paired(report: dict, base: str) -> list[dict]:
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for run in report["runs"]:
        by.setdefault((run["set"], run["prompt"]), {})[run["method"]] = run
    for runs in by.values():  # the report keeps the tokens of the reference and of diverged runs only
        ref = runs.get(HF_GREEDY, {}).get("tokens")
        for run in runs.values():
            if run.get("tokens") is None and run.get("exact"):
                run["tokens"] = ref
    methods = [m for m in dict.fromkeys(r["method"] for r in report["runs"]) if m != base]
    if not any(base in runs for runs in by.values()):
        known = ", ".join(dict.fromkeys(r["method"] for r in report["runs"]))
        raise SystemExit(f"no method {base!r} in this report; methods: {known}")
    rows = []
    for set_name in dict.fromkeys(k[0] for k in by):
        for method in methods:
            same, logs, total = [0.0, 0.0], [], [0.0, 0.0]
            for (s, _), runs in by.items():
                if s != set_name or base not in runs or method not in runs:
                    continue
                a, b = runs[base], runs[method]
                total[0] += a["time_s"]
                total[1] += b["time_s"]
                if a["tokens"] == b["tokens"]:
                    same[0] += a["time_s"]
                    same[1] += b["time_s"]
                    logs.append(math.log(a["time_s"] / b["time_s"]))
            rows.append({"set": set_name, "method": method, "identical": len(logs),
                         "ratio_identical": same[0] / same[1] if same[1] else None,
                         "geomean_identical": math.exp(statistics.fmean(logs)) if logs else None,
                         "ratio_all": total[0] / total[1] if total[1] else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", help="OUT.json written by `autolade bench --out OUT`")
    ap.add_argument("--base", required=True, help="the method to compare against, e.g. 'al lookup16x3s'")
    args = ap.parse_args(argv)
    rows = paired(json.loads(Path(args.report).read_text()), args.base)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    print("| set | method | identical to base | x base (identical) | geo-mean | x base (all prompts) |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['set']} | {r['method']} | {r['identical']} | {fmt(r['ratio_identical'])} | "
              f"{fmt(r['geomean_identical'])} | {fmt(r['ratio_all'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
