#!/usr/bin/env python3
"""Side-by-side benchmark, as a script: the same options as `autolade bench` (see --help).

    python tools/bench.py --dtype bfloat16 --sets chat,code --prompts 10 --max-new-tokens 128 \
        --config 0,0,0,0 --config 0,4,0,10 --config 4,4,4,10 --out out/bench-bf16

For users without the console script; runs from a checkout without installing the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autolade.cli.main import bench_command

if __name__ == "__main__":
    bench_command.main(prog_name="tools/bench.py")
