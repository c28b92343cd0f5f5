"""The device check's ``compiled`` section (``devcheck.DeviceCheck``): the compiled step on each model.

Per model: exactness of compiled lookahead against HF greedy (token for token, a flip only within the noise
gap), the compiled step's curve next to the eager one at the same widths, and a side-by-side run of HF greedy
eager, HF greedy on a StaticCache with its compiled forward, HF prompt lookup, autolade eager and autolade
compiled (``bench_compiled_<model>.json``). Where the hardware profile knows the memory bandwidth, the
weights-read limit (bytes of weights / bandwidth) is recorded beside the measured ms per token.
"""

from __future__ import annotations

import time
from typing import Any

import torch


def compiled_section(check: Any, record: dict[str, Any], deadline: float) -> None:
    from autolade.bench.report import write_json
    from autolade.bench.run import load_sets, run_benchmark
    from autolade.config import parse_method
    from autolade.engine.compiled import BUCKETS, CompiledRunner, buckets_for
    from autolade.engine.decode import lookahead_decode
    from autolade.machine.step_curve import measure_compiled_curve, measure_step_curve
    from autolade.tuning.harness import divergence, greedy_reference, noise_gap
    from autolade.workloads import encode_prompt

    sizes = check.sizes
    record["models"] = {}
    config, _ = parse_method(sizes.compiled_spec)
    widths = buckets_for(config.packed_size(), sizes.compiled_buckets or BUCKETS)
    for name in sizes.compiled_models:
        if time.monotonic() > deadline:
            record.setdefault("skipped", []).append(f"{name}: time box")
            continue
        try:
            model, tok = check.model(name, sizes.compiled_dtype)
        except Exception as exc:  # a model this machine cannot load (not converted here): said, and the next runs
            record.setdefault("skipped", []).append(f"{name}: not loaded ({type(exc).__name__}: {exc})")
            continue
        out: dict[str, Any] = {"dtype": sizes.compiled_dtype, "config": sizes.compiled_spec, "buckets": list(widths)}
        record["models"][name] = out
        prompts = load_sets(["chat"], limit=sizes.compiled_prompts, heldout=True)["chat"]
        runner = CompiledRunner(model, capacity=sizes.compiled_capacity, buckets=widths)
        runs = []
        for prompt in prompts:
            ids = encode_prompt(tok, prompt.text, kind=prompt.kind).to(model.device)
            ref = greedy_reference(model, ids, max_new_tokens=sizes.compiled_tokens, keep_logits=True)
            tokens, _ = lookahead_decode(model, ids, config=config, max_new_tokens=sizes.compiled_tokens,
                                         eos_ids=[], runner=runner)
            div = divergence(ref.tokens, tokens[: len(ref.tokens)], ref)
            runs.append({"prompt": prompt.id, "exact": div is None,
                         "within_noise": div is None or div.within_noise(noise_gap(model.dtype)),
                         "diverged_at": None if div is None else div.index})
        out["exactness"] = runs
        out["all_exact"] = all(r["within_noise"] for r in runs)
        out["warmup_s"] = {str(k): round(v, 2) for k, v in runner.log.warmup_s.items()}
        out["graphs"] = runner.log.compiles
        check.write()
        if time.monotonic() > deadline:
            record.setdefault("skipped", []).append(f"{name}: curve and bench, time box")
            continue
        kwargs = dict(contexts=sizes.curve_contexts, repeats=sizes.curve_repeats, warmup=1)
        compiled = measure_compiled_curve(model, buckets=widths, name=name, **kwargs)
        eager = measure_step_curve(model, ks=list(widths), name=name, **kwargs)
        out["curve"] = {"compiled": compiled.to_dict(), "eager": eager.to_dict()}
        ctx = compiled.contexts[0]
        out["compiled_over_eager"] = {str(k): round(compiled.points[ctx][k] / eager.points[ctx][k], 3) for k in widths}
        out["weights_read_ms"] = _weights_read_ms(model, check.result["sections"]["environment"].get("hardware", {}))
        check.write()
        if time.monotonic() > deadline:
            record.setdefault("skipped", []).append(f"{name}: bench, time box")
            continue
        methods = {"autolade eager": {"config": config, "compile": False},
                   "autolade compiled": {"config": config, "compile": True}}
        report = run_benchmark(
            model=model, tokenizer=tok, prompts={"chat": prompts}, configs=methods, baselines=("greedy", "pld", "static"),
            max_new_tokens=sizes.compiled_tokens, warmup=1, repeats=sizes.bench_repeats,
            max_seconds=max(deadline - time.monotonic(), 1.0),
        )  # fmt: skip
        write_json(report, check.out / f"bench_compiled_{name}.json")
        out["bench"] = [{k: s.to_dict()[k] for k in ("method", "tokens_per_s", "speedup", "exact")} for s in report.summaries]
        check.write()


def _weights_read_ms(model: torch.nn.Module, hardware: dict[str, Any]) -> dict[str, Any] | None:
    """Bytes of weights over the memory bandwidth the hardware profile reports: the per-token floor of decoding."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gpus = hardware.get("gpus") or []
    bandwidth = (gpus[0].get("mem_bandwidth") if gpus else None) or hardware.get("cpu_mem_bandwidth")
    if not bandwidth:
        return None
    return {"weight_bytes": weights, "bandwidth_bytes_s": bandwidth, "ms": round(weights / bandwidth * 1000, 3)}
