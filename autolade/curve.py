"""The step-latency curve c(k): what one cached forward of k packed tokens costs.

Lookahead decoding wins when it accepts r tokens per step and r * c(1) / c(k) > 1. This
module measures c(k) on the real model and derives "spare compute" and the speedup bound;
``autolade.predict`` prices a measured acceptance table (r and k per setting) on it to choose
settings. ``autolade.hardware`` re-exports everything here.
"""

from __future__ import annotations

import inspect
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ProfileError

CPU_KS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # geometric, plus in-betweens where CPU curves bend
GPU_KS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)  # GPUs stay flat much further
SPARE_COMPUTE_RATIO = 1.25  # "spare compute" = largest k costing at most this times c(1)
CURVE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class StepCurve:
    """Median milliseconds of one cached forward of k packed tokens, per context length."""

    points: dict[int, dict[int, float]]  # {context: {k: ms}}, every context measured at the same ks
    device: str = "cpu"  # torch device the model ran on
    dtype: str = "float32"  # model dtype, e.g. "float32" / "bfloat16"
    repeats: int = 5  # timed forwards per point (the median is kept)
    model: str | None = None  # model name, for display only
    torch_threads: int | None = None  # torch.get_num_threads() while measuring (CPU)
    spread: dict[int, dict[int, float]] | None = None  # {context: {k: (max - min) / median}} over the repeats
    notes: tuple[str, ...] = ()  # e.g. "system busy while measuring ..."; shown with the table

    def __post_init__(self) -> None:
        if not isinstance(self.points, dict) or not self.points:
            raise ProfileError("step curve: points must be a non-empty {context: {k: ms}} mapping")
        for context, row in self.points.items():
            if not isinstance(context, int) or context < 0:
                raise ProfileError(f"step curve: context must be an integer >= 0, got {context!r}")
            if not isinstance(row, dict) or 1 not in row:
                raise ProfileError(f"step curve: context {context} must include k=1 (the greedy step)")
            for k, ms in row.items():
                if not isinstance(k, int) or k < 1:
                    raise ProfileError(f"step curve: k must be an integer >= 1, got {k!r}")
                if not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
                    raise ProfileError(f"step curve: cost at context {context}, k={k} must be positive ms, got {ms!r}")

    @property
    def contexts(self) -> list[int]:
        return sorted(self.points)

    @property
    def ks(self) -> list[int]:
        """The ks measured at every context."""
        common = set.intersection(*(set(row) for row in self.points.values()))
        return sorted(common)

    def cost(self, k: float, context: int | None = None) -> float:
        """c(k) in ms: piecewise-linear in k and in context, clamped to the measured range.

        ``context=None`` averages over the measured contexts.
        """
        if context is None:
            return statistics.fmean(self._cost_at(ctx, k) for ctx in self.contexts)
        contexts = self.contexts
        return _interp(contexts, [self._cost_at(ctx, k) for ctx in contexts], context)

    def _cost_at(self, context: int, k: float) -> float:
        row = self.points[context]
        ks = sorted(row)
        return _interp(ks, [row[x] for x in ks], k)

    def token_cost(self, k: int = 32) -> float:
        """What one more packed token costs relative to a one-token step, on average over 1..k packed
        tokens: (c(k) - c(1)) / ((k - 1) c(1)), at least 0 (a GPU's flat curve: ~0; 2-core CPUs: 0.02-0.03)."""
        one = self.cost(1)
        return max(0.0, (self.cost(k) - one) / ((k - 1) * one))

    def pads_single(self) -> bool:
        """Whether a two-token step costs less than a one-token step here (c(2) < c(1), averaged over the
        measured contexts): then a step with nothing to draft packs a filler draft (``generate(pad_single=)``).
        Measured: the 1.5B Qwen in bf16 on a 2-core EPYC, c(2) 0.84-0.92 c(1) (its one-row bf16 matmuls take a
        slower kernel than two rows); SmolLM2 bf16 1.05 and fp32 1.6-1.9 there do not."""
        return 2 in self.ks and self.cost(2) < self.cost(1)

    def spare_compute(self, context: int | None = None) -> int:
        """Largest measured k such that every measured k' <= k costs at most 1.25 x c(1)."""
        best = 1
        limit = SPARE_COMPUTE_RATIO * self.cost(1, context)
        for k in self.ks:
            if self.cost(k, context) > limit:
                break
            best = k
        return best

    def speedup_bound(self, window: int, ngram: int, guesses: int, *, context: int | None = None) -> float:
        """Upper bound on lookahead speedup over greedy for these W/N/G.

        A step accepts at most N tokens (a full (N-1)-token candidate plus the bonus token)
        and packs k = 1 + (N-1)W + G(N-1) tokens, so the bound is N * c(1) / c(k). Past the
        largest measured k the cost is clamped, which only loosens the bound.
        """
        if window <= 0 or ngram < 2:
            return 1.0
        k = packed_tokens(window=window, ngram=ngram, guesses=guesses)
        return ngram * self.cost(1, context) / self.cost(k, context)

    def noisy_points(self, *, threshold: float = 0.5) -> list[tuple[int, int, float]]:
        """(context, k, spread) of the points whose repeats varied by more than ``threshold`` x median."""
        if not self.spread:
            return []
        return [(ctx, k, sp) for ctx, row in sorted(self.spread.items()) for k, sp in sorted(row.items()) if sp > threshold]

    def table(self) -> str:
        """Readable table: one row per k, one column per context (ms and x c(1))."""
        contexts = self.contexts
        head = "     k  " + "".join(f"  ctx {ctx:>5} ms   (x c1)" for ctx in contexts)
        lines = [head]
        for k in self.ks:
            cells = []
            for ctx in contexts:
                ms = self.points[ctx][k]
                cells.append(f"  {ms:>12.2f}   ({ms / self.points[ctx][1]:>4.2f})")
            lines.append(f"{k:>6}  " + "".join(cells))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": CURVE_FORMAT_VERSION,
            "device": self.device,
            "dtype": self.dtype,
            "repeats": self.repeats,
            "model": self.model,
            "torch_threads": self.torch_threads,
            # JSON keys are strings; from_dict turns them back into ints
            "points": _str_keys(self.points),
            "spread": _str_keys(self.spread) if self.spread else None,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Any) -> StepCurve:
        if not isinstance(data, dict):
            raise ProfileError(f"step curve must be a JSON object, got {type(data).__name__}")
        if data.get("version", CURVE_FORMAT_VERSION) != CURVE_FORMAT_VERSION:
            raise ProfileError(f"step curve version {data.get('version')!r} is not supported (expected {CURVE_FORMAT_VERSION})")
        raw = data.get("points")
        if not isinstance(raw, dict):
            raise ProfileError("step curve: 'points' must be a {context: {k: ms}} object")
        points = _int_keys(raw, "points")
        spread = _int_keys(data["spread"], "spread") if data.get("spread") is not None else None
        notes = data.get("notes") or []
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise ProfileError("step curve: 'notes' must be a list of strings")
        for key, kind in (("device", str), ("dtype", str), ("repeats", int)):
            if key in data and not isinstance(data[key], kind):
                raise ProfileError(f"step curve: '{key}' must be {kind.__name__}, got {data[key]!r}")
        return cls(
            points=points,
            device=data.get("device", "cpu"),
            dtype=data.get("dtype", "float32"),
            repeats=data.get("repeats", 5),
            model=data.get("model"),
            torch_threads=data.get("torch_threads"),
            spread=spread,
            notes=tuple(notes),
        )


def _str_keys(table: dict[int, dict[int, float]]) -> dict[str, dict[str, float]]:
    # JSON keys are strings; _int_keys turns them back
    return {str(ctx): {str(k): round(v, 4) for k, v in sorted(row.items())} for ctx, row in sorted(table.items())}


def _int_keys(raw: Any, name: str) -> dict[int, dict[int, float]]:
    try:
        return {int(ctx): {int(k): float(v) for k, v in row.items()} for ctx, row in raw.items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProfileError(f"step curve: '{name}' must map integer contexts to {{k: value}}: {exc}") from None


def packed_tokens(*, window: int, ngram: int, guesses: int) -> int:
    """k = 1 + (N-1)W + G(N-1): the packed tokens of one lookahead step (no prompt lookup)."""
    if window <= 0 or ngram < 2:
        return 1
    return 1 + (ngram - 1) * window + guesses * (ngram - 1)


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation through sorted xs, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]  # pragma: no cover - unreachable for sorted xs


# --- measuring ------------------------------------------------------------------------------


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

    from .engine.attention import AttentionSwitch, is_flash
    from .engine.clock import DeviceClock

    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    if ks is None:
        ks = GPU_KS if device.type == "cuda" else CPU_KS
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
    vocab = int(model.config.vocab_size)
    cache_kwarg = _cache_kwarg(model)
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
                    model(input_ids=prefix, use_cache=True, **{cache_kwarg: cache})
                inputs = {k: _step_inputs(torch, k, context, vocab=vocab, device=device, dtype=dtype, gen=gen) for k in ks}

                def step(k: int, inputs=inputs, cache=cache, context=context) -> float:  # bound: this context's
                    attention.use("single" if k == 1 else "packed")
                    kwargs = inputs[k]
                    if k == 1 and is_flash(attention.current):  # causal: the engine passes no mask either
                        kwargs = {key: value for key, value in kwargs.items() if key != "attention_mask"}
                    start = clock.now()
                    model(**kwargs, use_cache=True, **{cache_kwarg: cache})
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


def stored_or_measured(model: Any, *, store: Any, hardware: Any, log: Any = None) -> StepCurve:
    """This machine's stored step curve for ``model`` (a ``ProfileStore`` and a probed hardware
    profile), measured and saved first when there is none (once per hardware/model/dtype)."""
    from .models import model_fingerprint

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


def _cache_kwarg(model: Any) -> str:
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


# --- which dtype to run -----------------------------------------------------------------------

# bf16 is recommended over fp32 only when its step curve predicts decoding at least this much
# faster: it gives up fp32 greedy's outputs (a bf16 model is exactly greedy in bf16) for the speed.
DTYPE_MARGIN = 1.10


def recommend_dtype(curves: dict[str, StepCurve], *, table: Any = None) -> tuple[str, str]:
    """(dtype, why) from this model's step curves in float32 and bfloat16 on this machine.

    What decides decoding speed is the step curve, not a raw matmul rate: each dtype's predicted
    time per token is c(1) / s, s the speedup ``autolade.predict.choose`` predicts from the
    acceptance ``table`` (an ``AcceptanceTable`` of this model; either dtype's: acceptance barely
    depends on it) on that dtype's curve; without a table, greedy's c(1). bf16 wins when that is
    ``DTYPE_MARGIN`` x faster than fp32's. On an AMX Xeon, say, c(1) is the same in both dtypes
    but bf16 packs 16 tokens for 1.11 x c(1) and fp32 for ~2 x c(1): with a table whose windows
    accept, bf16 decodes faster although its one-token step is no cheaper.
    """
    missing = [d for d in ("float32", "bfloat16") if d not in curves]
    if missing:
        raise ValueError(f"recommend_dtype needs step curves for float32 and bfloat16; missing {', '.join(missing)} "
                         f"(measure it with `autolade profile --dtype {missing[0]}`)")
    seen = {dtype: _per_token(curves[dtype], table) for dtype in ("float32", "bfloat16")}
    ratio = seen["float32"][0] / seen["bfloat16"][0]
    basis = "" if table is not None else "; no acceptance table, so greedy steps only (`autolade accept` measures one)"
    detail = "; ".join(
        f"{dtype} {ms:.2f} ms/token (c(1) {curves[dtype].cost(1):.1f} ms, {label})" for dtype, (ms, label) in seen.items()
    ) + basis
    if ratio >= DTYPE_MARGIN:
        return "bfloat16", (f"step curves predict {ratio:.2f}x float32's decoding speed for this model ({detail}); "
                            "outputs then match bf16 greedy, not fp32 greedy (pass --dtype bfloat16 to choose it)")
    return "float32", (f"step curves predict bfloat16 at only {ratio:.2f}x float32's decoding speed for this model ({detail}): "
                       "bf16 would cost precision for little speed")


def _per_token(curve: StepCurve, table: Any) -> tuple[float, str]:
    """(predicted ms per token, the setting that gives it): the table's choice on this curve, else greedy."""
    if table is None:
        return curve.cost(1), "greedy"
    from .predict import choose

    best = choose(table, curve)
    return curve.cost(1, table.context_median) / best.speedup, f"{best.setting.label} at {best.speedup:.2f}x greedy"


def stored_dtype_advice(curve: StepCurve, *, store: Any, hardware: Any, model_fingerprint: dict[str, str],
                        table: Any = None) -> tuple[str | None, str]:
    """(dtype, why) for this machine and model: ``curve`` (this dtype's) against the other dtype's
    latest stored curve, priced with the acceptance ``table`` if given (see ``recommend_dtype``);
    ``(None, how to measure it)`` when the other curve is not stored yet."""
    if curve.dtype not in ("float32", "bfloat16"):
        return None, f"no dtype advice for {curve.dtype}: it compares float32 and bfloat16 step curves"
    other = "bfloat16" if curve.dtype == "float32" else "float32"
    stored = store.latest_curve(hardware_fingerprint=hardware.fingerprint, model_fingerprint=model_fingerprint, dtype=other)
    if stored is None:
        return None, (f"no {other} step curve of this model on this machine yet: run `autolade profile --dtype {other}` "
                      "to compare the two dtypes")
    return recommend_dtype({curve.dtype: curve, other: stored}, table=table)
