#!/usr/bin/env python3
"""The step curve c(k) of a model architecture on this device, from its config alone.

What a forward of k packed tokens costs depends on the shapes, the dtype and the device, not on
the weights' values, so a randomly initialised model of the same config prices a step the same as
the real one. This measures the paper's models (and the registry's Qwen) on a machine where their
weights are not at hand (a GPU machine that cannot reach the hub), for ``autolade.runtime.predict`` to pair
with acceptance measured elsewhere (acceptance under greedy is hardware-free). Never a claim about
output: the weights are random.

    python3 tools/arch_curve.py --device cuda --dtype bfloat16 --out out/arch_curves.json
    python3 tools/arch_curve.py --device cpu --arch qwen2.5-coder-1.5b --ks 1,4,16 --contexts 64 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Shapes from each model's published config.json (hidden, intermediate, layers, heads, kv heads, vocab).
ARCHS: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192),
    "qwen2.5-coder-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                               tie_word_embeddings=False),
    "qwen2.5-coder-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                             tie_word_embeddings=False),
    "llama2-7b-chat": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096),
    "llama2-13b-chat": dict(model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                            num_attention_heads=40, num_key_value_heads=40, vocab_size=32000, max_position_embeddings=4096),
}  # fmt: skip


def build(name: str, *, device: str, dtype: str, archs: dict[str, dict] = ARCHS):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(archs[name])
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


def main(argv: list[str] | None = None, *, archs: dict[str, dict] = ARCHS) -> int:
    import torch

    from autolade.machine.step_curve import measure_step_curve

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--arch", default=",".join(archs), help=f"comma-separated, from {', '.join(archs)}")
    parser.add_argument("--ks", default="1,2,4,8,16,32,48,64,96,128,192,256")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="out/arch_curves.json")
    args = parser.parse_args(argv)
    unknown = [a for a in args.arch.split(",") if a not in archs]
    if unknown:
        parser.error(f"unknown architecture {unknown[0]!r}; pick from {', '.join(archs)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    result = {"device": args.device, "device_name": device_name, "dtype": args.dtype, "torch": torch.__version__,
              "weights": "random (cost only)", "curves": {}}  # fmt: skip
    ks = [int(k) for k in args.ks.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    for name in args.arch.split(","):
        t0 = time.perf_counter()
        with torch.no_grad():
            model = build(name, device=args.device, dtype=args.dtype, archs=archs)
            curve = measure_step_curve(model, ks=ks, contexts=contexts, repeats=args.repeats, name=name)
        params = sum(p.numel() for p in model.parameters())
        result["curves"][name] = {"params": params, "curve": curve.to_dict(), "seconds": time.perf_counter() - t0}
        out.write_text(json.dumps(result, indent=1))  # as it goes
        c1 = curve.cost(1, contexts[0])
        ratios = "  ".join(f"{k}:{curve.cost(k, contexts[0]) / c1:.2f}" for k in ks)
        print(f"{name} ({params / 1e9:.2f}B) c(1)={c1:.2f} ms at {contexts[0]}; c(k)/c(1): {ratios}", flush=True)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
