#!/usr/bin/env bash
# The prepared device check (tools/gpu_check.py) on a GPU machine, from a fresh checkout: results in $OUT
# (default out/gpu_check). Any extra arguments go to gpu_check.py (e.g. --device cpu --quick).
# A hard stop at 590 s (the device tool allows 600 s a command): each section is time-boxed inside and the JSON is written as it goes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT"
timeout 590 python3 tools/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
