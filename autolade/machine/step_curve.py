"""Measuring the step-latency curve c(k) on the real model (``autolade.records.curve.StepCurve``
is the data it gives), the stored-or-measured lookup, and its plot."""

from __future__ import annotations

import inspect
import os
import statistics
from pathlib import Path
from typing import Any

from autolade.errors import ProfileError
from autolade.records.curve import CPU_KS, GPU_KS, SPARE_COMPUTE_RATIO, StepCurve


def measure_step_curve(
    model: Any,
    *,
    ks: list[int] | tuple[int, ...] | None = None,
    contexts: list[int] | tuple[int, ...] = (128, 512),
    repeats: int = 5,
    warmup: int = 2,
    name: str | None = None,
    clock: Any = None,
) -> StepCurve:
    """Time one cached forward of k packed tokens after a prefill of ``context`` tokens.

    Each point is the median of ``repeats`` forwards (after ``warmup`` untimed ones) of k
    tokens with explicit position ids and a float 4-D additive mask [1, 1, k, context + k]
    (causal inside the block: the cost is what matters here, not the pattern). The cache is
    cropped back to ``context`` after every forward, so each point sees the same prefix.
    The repeats run in interleaved rounds over all ks, so a burst of outside load spreads
    over the curve instead of bending one point; ``spread`` and ``notes`` record the noise.

    Each k runs the attention implementation the decode loop would (``engine/attention.py``): on a
    flash-attn model k = 1 is flash's causal one-token forward (no mask), k > 1 sdpa with the mask.
    ``clock`` (default: a ``DeviceClock`` of the model's device) reads finished work: CUDA is
    synchronised before every reading.
    """
    import torch

    from autolade.engine.attention import AttentionSwitch, is_flash
    from autolade.engine.clock import DeviceClock

    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    ks = _checked_ks(model, ks, contexts, repeats=repeats, warmup=warmup, device_type=device.type)
    vocab = int(model.config.vocab_size)
    cache_arg = cache_kwarg(model)
    clock = clock or DeviceClock(device)
    attention = AttentionSwitch.for_model(model)
    loaded = attention.current
    gen = torch.Generator().manual_seed(0)
    load_before = _load_average()
    points: dict[int, dict[int, float]] = {}
    spread: dict[int, dict[int, float]] = {}
    try:
        with torch.inference_mode():
            for context in contexts:
                cache = _new_cache()
                attention.use("prefill")
                if context > 0:
                    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
                    model(input_ids=prefix, use_cache=True, **{cache_arg: cache})
                inputs = {k: _step_inputs(torch, k, context, vocab=vocab, device=device, dtype=dtype, gen=gen) for k in ks}

                def step(k: int, inputs=inputs, cache=cache, context=context) -> float:  # bound: this context's
                    attention.use("single" if k == 1 else "packed")
                    kwargs = inputs[k]
                    if k == 1 and is_flash(attention.current):  # causal: the engine passes no mask either
                        kwargs = {key: value for key, value in kwargs.items() if key != "attention_mask"}
                    start = clock.now()
                    model(**kwargs, use_cache=True, **{cache_arg: cache})
                    elapsed = clock.since(start)
                    _crop(cache, k, context)
                    return elapsed * 1000.0

                for k in ks:
                    for _ in range(warmup):
                        step(k)
                # interleaved rounds: a burst of outside load hits every k a little, not one k a lot
                times: dict[int, list[float]] = {k: [] for k in ks}
                for _ in range(repeats):
                    for k in ks:
                        times[k].append(step(k))
                points[int(context)] = {k: statistics.median(t) for k, t in times.items()}
                spread[int(context)] = {k: (max(t) - min(t)) / statistics.median(t) for k, t in times.items()}
    finally:
        attention.set(loaded)  # a flash model ends as it began
    notes = _noise_notes(load_before, spread)
    return StepCurve(
        points=points,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        repeats=repeats,
        model=name,
        torch_threads=torch.get_num_threads() if device.type == "cpu" else None,
        spread=spread,
        notes=tuple(notes),
    )


def measure_compiled_curve(
    model: Any, *, buckets: tuple[int, ...] | None = None, contexts: tuple[int, ...] = (256,), repeats: int = 5,
    warmup: int = 2, name: str | None = None, clock: Any = None,
) -> StepCurve:
    """The compiled step's curve (``StepCurve.compiled``): the median ms of a compiled step at each bucket width
    (``engine.compiled.default_buckets``: a CPU's one dynamic graph at many widths, a GPU's few graphs; a width of 1
    runs as the narrowest the runner has), through the very ``CompiledRunner`` a decode uses, on its static cache after a
    random prefix of each context. The first call of each bucket compiles it: its time is in ``notes``, not in
    the curve. Repeats interleave over the buckets, as in ``measure_step_curve``."""
    import time

    import torch

    from autolade.engine.clock import DeviceClock
    from autolade.engine.compiled import CompiledRunner, default_buckets, static_capacity

    param = next(model.parameters())
    device = param.device
    widths = _checked_ks(model, buckets or default_buckets(device), contexts, repeats=repeats, warmup=warmup,
                         device_type=device.type)
    capacity = static_capacity(max(contexts) + widths[-1])
    runner = CompiledRunner(model, capacity=capacity, buckets=tuple(widths))
    clock = clock or DeviceClock(device)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    load_before = _load_average()
    points: dict[int, dict[int, float]] = {}
    spread: dict[int, dict[int, float]] = {}
    t_compile = time.perf_counter()
    try:
        with torch.inference_mode():
            for context in contexts:
                cache = runner.new_cache(capacity)
                prefix = torch.randint(0, vocab, (1, max(context, 1)), generator=gen).to(device)
                runner.forward(prefix, torch.arange(prefix.shape[1], device=device)[None], cache, kind="prefill")
                inputs = {k: _step_inputs(torch, k, prefix.shape[1], vocab=vocab, device=device, dtype=param.dtype, gen=gen)
                          for k in widths}

                def step(k: int, inputs=inputs, cache=cache, base=prefix.shape[1]) -> float:
                    x = inputs[k]
                    start = clock.now()
                    runner.forward(x["input_ids"], x["position_ids"], cache, mask=x["attention_mask"], keep=0)
                    elapsed = clock.since(start)
                    cache.truncate(base)
                    return elapsed * 1000.0

                for k in widths:
                    for _ in range(max(warmup, 1)):  # the first call compiles
                        step(k)
                times: dict[int, list[float]] = {k: [] for k in widths}
                for _ in range(repeats):
                    for k in widths:
                        times[k].append(step(k))
                points[int(context)] = {k: statistics.median(t) for k, t in times.items()}
                spread[int(context)] = {k: (max(t) - min(t)) / statistics.median(t) for k, t in times.items()}
    finally:
        runner.attention.set(runner.loaded_attention)
    notes = _noise_notes(load_before, spread)
    notes.append(f"compiled ({runner.mode}): warm-up {runner.log.warmup_total_s:.1f} s for {runner.log.compiles} graphs "
                 f"(buckets {', '.join(map(str, widths))}); {time.perf_counter() - t_compile:.1f} s in all")
    return StepCurve(points=points, device=str(device), dtype=str(param.dtype).removeprefix("torch."), repeats=repeats,
                     model=name, torch_threads=torch.get_num_threads() if device.type == "cpu" else None, spread=spread,
                     notes=tuple(notes), compiled=True, warmup_s=round(runner.log.warmup_total_s, 3))


def _checked_ks(model: Any, ks: Any, contexts: Any, *, repeats: int, warmup: int, device_type: str) -> list[int]:
    """The sorted ks to time (1 always among them), checked against the model's position limit."""
    if ks is None:
        ks = GPU_KS if device_type == "cuda" else CPU_KS
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ProfileError(f"ks must be positive integers, got {ks}")
    if 1 not in ks:
        ks = [1, *ks]
    if repeats < 1 or warmup < 0:
        raise ProfileError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and max(contexts) + ks[-1] > limit:
        raise ProfileError(
            f"context {max(contexts)} + k {ks[-1]} exceeds the model's max_position_embeddings={limit}; "
            "use shorter contexts or smaller ks"
        )
    return ks


def _noise_notes(load_before: float | None, spread: dict[int, dict[int, float]]) -> list[str]:
    """What made this measurement noisy: a busy machine when it began, points that varied > 50%."""
    notes = []
    # only the load from before: over a long measurement our own threads raise the average
    if load_before is not None and load_before >= 0.5:
        notes.append(
            f"system busy when measuring began (1-min load average {load_before:.2f} on {os.cpu_count()} CPUs): "
            "other processes inflate and scatter these timings"
        )
    curve_spread = [sp for row in spread.values() for sp in row.values()]
    noisy = sum(sp > 0.5 for sp in curve_spread)
    if noisy:
        notes.append(f"{noisy} of {len(curve_spread)} points varied by more than 50% across repeats: rerun on an idle machine")
    return notes


def stored_or_measured(model: Any, *, store: Any, hardware: Any, log: Any = None) -> StepCurve:
    """This machine's stored step curve for ``model`` (a ``ProfileStore`` and a probed hardware
    profile), measured and saved first when there is none (once per hardware/model/dtype)."""
    from autolade.machine.models import model_fingerprint

    fp = model_fingerprint(model)
    curve = store.latest_curve(hardware_fingerprint=hardware.fingerprint, model_fingerprint=fp, dtype=fp["dtype"])
    if curve is None:
        if log is not None:
            log("measuring the step-latency curve (once per hardware/model/dtype)...")
        curve = measure_step_curve(model, contexts=(256,), repeats=3, warmup=1)
        store.save_curve(curve, hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
                         hardware_summary=hardware.summary(), model_fingerprint=fp, dtype=fp["dtype"])
    return curve


def _step_inputs(torch: Any, k: int, context: int, *, vocab: int, device: Any, dtype: Any, gen: Any) -> dict[str, Any]:
    """k packed tokens after ``context``: ids, explicit positions, float 4-D mask (0 = see, -inf = hide)."""
    ids = torch.randint(0, vocab, (1, k), generator=gen).to(device)
    positions = torch.arange(context, context + k, device=device)[None]
    mask = torch.zeros((1, 1, k, context + k), dtype=dtype, device=device)
    mask[0, 0, :, context:] = torch.triu(torch.full((k, k), float("-inf"), dtype=dtype, device=device), 1)
    return {"input_ids": ids, "position_ids": positions, "attention_mask": mask}


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _new_cache() -> Any:
    from transformers import DynamicCache

    # no config: every layer keeps its full KV, so one [k, context + k] mask fits all layers
    return DynamicCache()


def cache_kwarg(model: Any) -> str:
    """transformers 5.x renames ``past_key_values=`` to ``cache=``; use what this version takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _crop(cache: Any, k: int, context: int) -> None:
    """Drop the k tokens just appended. transformers 5.24: crop(-n) removes n; older: crop(max_length)."""
    params = list(inspect.signature(cache.crop).parameters)
    cache.crop(-k if params and params[0] == "tokens_to_remove" else context)
    length = cache.get_seq_length()
    if length != context:
        raise ProfileError(f"cache crop left {length} tokens, expected {context}; unsupported transformers cache API")


# --- plotting -------------------------------------------------------------------------------


def plot_curve(curve: StepCurve, path: str | Path) -> Path:
    """Write a PNG of c(k) per context (absolute ms, log-2 k axis) with the 1.25 x c(1) line.

    Drawn on a bare ``Figure`` (no pyplot), so the caller's matplotlib backend stays as it was."""
    from matplotlib.figure import Figure

    path = Path(path)
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for ctx in curve.contexts:
        ks = curve.ks
        ax.plot(ks, [curve.points[ctx][k] for k in ks], marker="o", label=f"context {ctx}")
        ax.axhline(SPARE_COMPUTE_RATIO * curve.points[ctx][1], linestyle=":", linewidth=0.8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("packed tokens per step (k)")
    ax.set_ylabel("ms per forward")
    title = f"step-latency curve: {curve.model or 'model'} {curve.dtype} on {curve.device}"
    ax.set_title(f"{title}\nspare compute k={curve.spare_compute()} (dotted: 1.25 x c(1))", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
