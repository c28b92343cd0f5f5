"""Manual check: every installed registry model loads, matches its GGUF, and greedy-decodes sane text
(the Qwen ones, opt-in, are skipped unless `bash tools/setup.sh --qwen` installed them).

    python3 tools/check_models.py            # uses the real user dir (converts once)
    AUTOLADE_HOME=$(mktemp -d) python3 tools/check_models.py   # measures a first load too
"""

from __future__ import annotations

import time

import torch

from autolade.machine.models import MODELS, load, model_fingerprint
from autolade.workloads import encode_prompt

PROMPTS = {
    "smollm2-135m": ("What is the capital of France?", "chat"),
    "gemma3-270m": ("The capital of France is", "code"),  # base model: raw completion
    "qwen2.5-coder-0.5b": ("Write a Python function that reverses a string.", "chat"),
    "qwen2.5-coder-1.5b": ("Write a Python function that reverses a string.", "chat"),
}


def main() -> None:
    for name, spec in MODELS.items():
        if spec.setup_flag and spec.installed_version() is None:
            print(f"{name}: not installed (`{spec.setup}`), skipped")
            continue
        for attempt in ("first", "second"):
            start = time.perf_counter()
            model, tok = load(name)
            print(f"{name}: {attempt} load {time.perf_counter() - start:.2f} s")
        text, kind = PROMPTS[name]
        ids = encode_prompt(tok, text, kind=kind)
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
        tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        print(f"  fingerprint {model_fingerprint(model)}  tied={tied}")
        print(f"  eos={model.generation_config.eos_token_id} chat_template={tok.chat_template is not None}")
        print(f"  greedy: {tok.decode(out[0, ids.shape[1]:])!r}")
        start = time.perf_counter()
        model16, _ = load(name, dtype="bfloat16")
        print(f"  bf16 load {time.perf_counter() - start:.2f} s, dtype {model16.dtype}")
        with torch.no_grad():
            a = model(ids).logits[0, -1]
            b = model16(ids).logits[0, -1].float()
        print(f"  fp32 vs bf16 last-logit max diff {(a - b).abs().max():.3f}, same argmax {bool(a.argmax() == b.argmax())}")


if __name__ == "__main__":
    main()
