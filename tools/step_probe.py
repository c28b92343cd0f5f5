#!/usr/bin/env python3
"""What one engine step costs on this device against the curve's c(k), with random weights (cost only).

The step curve times bare forwards; a decode step adds drafting, the mask, verification and the
cache rollback. This runs autolade's decode loop on a randomly initialised model of a named
architecture (``tools/arch_curve.py``'s table) over a repetitive prompt, so drafts get accepted and
packed steps reach their full size, and reports per setting the median forward and step time, next to
c(k); then a torch.profiler table of a short greedy and a short lookahead decode. Acceptance here
means nothing (random weights); the times per step are the point.

    python3 tools/step_probe.py --device cuda --out out/step_probe      # GPU machine, about a minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import arch_curve


def main(argv: list[str] | None = None, *, archs: dict[str, dict] = arch_curve.ARCHS) -> int:
    import torch

    from autolade.config import GREEDY, LookaheadConfig
    from autolade.engine.clock import DeviceClock
    from autolade.engine.decode import lookahead_decode
    from autolade.machine.step_curve import measure_step_curve

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--arch", default="smollm2-135m", choices=sorted(archs))
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per decode")
    parser.add_argument("--profile", action="store_true", help="also write torch.profiler tables")
    parser.add_argument("--out", default="out/step_probe")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = DeviceClock(args.device)
    model = arch_curve.build(args.arch, device=args.device, dtype=args.dtype, archs=archs)
    vocab = model.config.vocab_size
    context = 512  # KV length the curve is read at (the prompt below is 400 tokens, plus what it decodes)
    curve = measure_step_curve(model, ks=[1, 8, 32, 64, 96], contexts=[context], repeats=5, name=args.arch)
    result: dict = {"arch": args.arch, "device": args.device, "dtype": args.dtype, "curve_ms": curve.points[context], "runs": {}}
    base = torch.randint(0, vocab, (1, 60), generator=torch.Generator().manual_seed(0))
    prompt = base.repeat(1, 7)[:, :400].to(args.device)  # [1, 400], repetitive: prompt lookup finds drafts
    settings = {
        "greedy": GREEDY,
        "W15N5G15+L10": LookaheadConfig(window=15, ngram=5, guesses=15, prompt_lookup=10),
        "L10": LookaheadConfig(window=0, guesses=0, prompt_lookup=10),
        "W4N3G4": LookaheadConfig(window=4, ngram=3, guesses=4, prompt_lookup=0),
    }
    for name, config in settings.items():
        for _ in range(3):  # the last of three: the first ones warm caches and kernels up
            t0 = clock.now()
            tokens, log = lookahead_decode(model, prompt, config=config, max_new_tokens=args.tokens)
            wall = clock.since(t0)
        steps = log.steps
        row = {"wall_s": wall, "steps": len(steps), "tokens": len(tokens),
               "forward_ms_median": statistics.median(s.forward_ms for s in steps),
               "step_ms_median": statistics.median(s.step_ms for s in steps),
               "packed_median": statistics.median(s.packed for s in steps)}  # fmt: skip
        row["c_of_packed_ms"] = curve.cost(min(row["packed_median"], curve.ks[-1]), context)
        result["runs"][name] = row
        print(f"{name:<14} {row['steps']:3d} steps, packed {row['packed_median']:5.1f}, forward {row['forward_ms_median']:6.1f} ms, "
              f"step {row['step_ms_median']:6.1f} ms, c(packed) {row['c_of_packed_ms']:6.1f} ms, wall {wall:.2f} s", flush=True)  # fmt: skip
        (out / "step_probe.json").write_text(json.dumps(result, indent=1))
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        for name in ("greedy", "W15N5G15+L10"):
            with profile(activities=activities) as prof:
                lookahead_decode(model, prompt, config=settings[name], max_new_tokens=16)
                clock.now()
            (out / f"profile_{name.replace('+', '_')}.txt").write_text(prof.key_averages().table(sort_by="cpu_time_total", row_limit=30))
    print(f"wrote {out / 'step_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
