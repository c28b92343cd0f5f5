"""The prepared device check: environment, exactness, step curve, predicted settings and a short bench,
written to ``--out`` (default ``$OUT``, else ``out/gpu_check``) as it goes. See autolade/devcheck.py.

    python3 tools/gpu_check.py                      # on a GPU machine: full sizes, under 9 minutes
    python3 tools/gpu_check.py --device cpu --quick # toy sizes, what CI runs
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's autolade, installed or not


def main(argv: list[str] | None = None) -> int:
    import torch

    from autolade.bench.devcheck import DeviceCheck, sizes_for

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda:0 when torch sees a GPU)")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else out/gpu_check)")
    parser.add_argument("--quick", action="store_true", help="toy sizes (k up to 32, 1 prompt, 16 tokens)")
    parser.add_argument("--models", default=None, help="comma-separated registry names (default: smollm2-135m,gemma3-270m)")
    args = parser.parse_args(argv)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    out = args.out or os.environ.get("OUT") or "out/gpu_check"
    sizes = sizes_for(torch.device(device).type, quick=args.quick)
    if args.models:
        sizes = replace(sizes, models=tuple(m.strip() for m in args.models.split(",") if m.strip()))
    result = DeviceCheck(out=out, device=device, sizes=sizes, log=lambda msg: print(msg, flush=True)).run()
    for name, section in result["sections"].items():
        print(f"{name:<12} {section['status']:<8} {section.get('seconds', 0):7.1f} s  {section.get('error', '')}")
    print(f"exact: {result['exact']}; wrote {Path(out) / 'gpu_check.json'}")
    return 0 if result["ok"] and result["exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
