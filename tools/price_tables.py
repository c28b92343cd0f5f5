#!/usr/bin/env python3
"""Price a model's shipped acceptance tables on a step curve measured elsewhere.

Acceptance under greedy is a property of the model and the workload; the cost of a step is the
machine's. This pairs the two offline: the curve from ``tools/arch_curve.py`` (random weights, any
device) or from a device check's ``gpu_check.json``, the tables from ``profiles/``, and prints what
``autolade.runtime.predict.choose`` would pick there, with the ranking.

    python3 tools/price_tables.py docs/bench/gpu-h200-20261204/arch_curves_qwen.json --model qwen2.5-coder-1.5b
    python3 tools/price_tables.py docs/bench/gpu-h200-20261204/gpu_check.json --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def curve_from(path: Path, model: str):
    """The model's curve from an arch_curve output ({"curves": {name: {"curve": ...}}}) or a device check's JSON."""
    from autolade.records.curve import StepCurve

    data = json.loads(path.read_text())
    if "curves" in data:
        if model not in data["curves"]:
            raise SystemExit(f"{path} has no curve for {model!r}; it has {', '.join(data['curves'])}")
        return StepCurve.from_dict(data["curves"][model]["curve"])
    try:
        return StepCurve.from_dict(data["sections"]["curve"]["curve"])
    except (KeyError, TypeError):
        raise SystemExit(f"{path}: neither an arch_curve output nor a device check with a curve section") from None


def main(argv: list[str] | None = None) -> int:
    from autolade.paths import repo_profiles_dir
    from autolade.runtime.predict import choose, format_predictions, predict
    from autolade.store.tables import shipped_tables

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("curve", type=Path, help="arch_curve.py output or gpu_check.json")
    parser.add_argument("--model", required=True, help="the tables' model name, e.g. qwen2.5-coder-1.5b")
    parser.add_argument("--context", type=int, default=512, help="KV length to read c(k) at (default 512)")
    parser.add_argument("--tables", type=Path, default=None, help="folder of acceptance tables (default: profiles/)")
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args(argv)
    curve = curve_from(args.curve, args.model)
    found = [(t, label) for t, label in shipped_tables([args.tables or repo_profiles_dir()]) if t.model_name == args.model]
    if not found:
        raise SystemExit(f"no acceptance table for {args.model!r}: measure one with `autolade accept --model {args.model}`")
    for table, label in sorted(found, key=lambda f: (f[0].workload, f[0].dtype)):
        chosen = choose(table, curve, context=args.context)
        print(f"== {args.model} {table.workload} ({table.dtype} table {label}), context {args.context}: "
              f"chosen {chosen.setting.label}, predicted {chosen.speedup:.2f}x greedy")  # fmt: skip
        print(format_predictions(predict(table, curve, context=args.context)[: args.top]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
