"""The step-latency curve c(k): what one cached forward of k packed tokens costs.

Lookahead decoding wins when it accepts r tokens per step and r * c(1) / c(k) > 1. This
module is the data: the measured points, "spare compute", the speedup bound and the JSON form.
``autolade.machine.step_curve`` measures it on the real model; ``autolade.runtime.predict`` prices
a measured acceptance table (r and k per setting) on it to choose settings.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, replace
from typing import Any

from autolade.errors import ProfileError

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
    compiled: bool = False  # measured through the compiled step (engine/compiled.py) at its bucket widths
    warmup_s: float | None = None  # compiled curves: seconds the first steps spent compiling (None: not recorded)

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
        """c(k) in ms: piecewise-linear in k and in context. Past the largest measured k it goes on along the
        last measured segment (a batched step of 8 rows x 33 tokens is 264 tokens, past a quick curve's 64:
        clamped, it was priced as 64 and the step budget chose widths that cost 2-3x what it thought);
        below k=1 and outside the measured contexts it is clamped.

        ``context=None`` averages over the measured contexts.
        """
        if context is None:
            return statistics.fmean(self._cost_at(ctx, k) for ctx in self.contexts)
        contexts = self.contexts
        return _interp(contexts, [self._cost_at(ctx, k) for ctx in contexts], context)

    def _cost_at(self, context: int, k: float) -> float:
        row = self.points[context]
        ks = sorted(row)
        if k > ks[-1] and len(ks) > 1:  # the last segment's ms per token, at least 0 (a noisy top may dip)
            slope = max(0.0, (row[ks[-1]] - row[ks[-2]]) / (ks[-1] - ks[-2]))
            return row[ks[-1]] + slope * (k - ks[-1])
        return _interp(ks, [row[x] for x in ks], k)

    def token_cost(self, k: int = 32) -> float:
        """What one more packed token costs relative to a one-token step, on average over 1..k packed
        tokens: (c(k) - c(1)) / ((k - 1) c(1)), at least 0 (a GPU's flat curve: ~0; 2-core CPUs: 0.02-0.03)."""
        one = self.cost(1)
        return max(0.0, (self.cost(k) - one) / ((k - 1) * one))

    def pads_single(self) -> bool:
        """Whether a two-token step costs less than a one-token step here (c(2) < c(1), averaged over the
        measured contexts): then a step with nothing to draft packs a filler draft (``generate(pad_single=)``).
        On a compiled curve (``as_run``), no more is enough: a filler in the lone token's bucket is free.
        Measured: the 1.5B Qwen in bf16 on a 2-core EPYC, c(2) 0.84-0.92 c(1) (its one-row bf16 matmuls take a
        slower kernel than two rows); SmolLM2 bf16 1.05 and fp32 1.6-1.9 there do not."""
        if 2 not in self.ks:
            return False
        return self.cost(2) <= self.cost(1) if self.compiled else self.cost(2) < self.cost(1)

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
        largest measured k the cost follows the last measured segment.
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
            "compiled": self.compiled,
            "warmup_s": self.warmup_s,
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
        for key, kind in (("device", str), ("dtype", str), ("repeats", int), ("compiled", bool)):
            if key in data and not isinstance(data[key], kind):
                raise ProfileError(f"step curve: '{key}' must be {kind.__name__}, got {data[key]!r}")
        warmup = data.get("warmup_s")
        if warmup is None and data.get("compiled") is True:  # curves from before the field: their note says it
            said = next((m for n in notes if isinstance(n, str) and (m := re.search(r"warm-up ([0-9.]+) s", n))), None)
            warmup = float(said.group(1)) if said else None
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, (int, float))
                                   or not math.isfinite(warmup) or warmup < 0):
            raise ProfileError(f"step curve: 'warmup_s' must be seconds >= 0 or null, got {warmup!r}")
        return cls(
            points=points,
            device=data.get("device", "cpu"),
            dtype=data.get("dtype", "float32"),
            repeats=data.get("repeats", 5),
            model=data.get("model"),
            torch_threads=data.get("torch_threads"),
            spread=spread,
            notes=tuple(notes),
            compiled=data.get("compiled", False),
            warmup_s=None if warmup is None else float(warmup),
        )


def useful_buckets(compiled: StepCurve) -> tuple[int, ...]:
    """The compiled curve's widths that some step should run at: a bucket is dropped where a wider one costs no
    more (measured on a Zen 4 EPYC in bf16: the one-token bucket cost more than the 8-token one, so a lone token
    runs padded to 8 there; averaged over the measured contexts)."""
    widths = compiled.ks
    return tuple(w for i, w in enumerate(widths) if all(compiled.cost(v) > compiled.cost(w) for v in widths[i + 1 :]))


def bucket_cost(compiled: StepCurve, k: int, context: int | None = None) -> float | None:
    """What a compiled step of ``k`` tokens costs: the cheapest measured bucket >= k (None: wider than all)."""
    costs = [compiled.cost(w, context) for w in compiled.ks if w >= k]
    return min(costs) if costs else None


def as_run(compiled: StepCurve, ks: tuple[int, ...] = CPU_KS) -> StepCurve:
    """The compiled curve as a decode meets it: c(k) = the cost of the cheapest bucket >= k (``useful_buckets``),
    at every k of ``ks`` up to the widest bucket (a step function, where interpolating between buckets would
    under-price)."""
    widths = compiled.ks
    points = {ctx: {k: min(row[w] for w in widths if w >= k) for k in sorted(set(ks) | {1}) if k <= widths[-1]}
              for ctx, row in compiled.points.items()}
    return replace(compiled, points=points, spread=None)


def compile_pays(eager: StepCurve, compiled: StepCurve, *, ks: tuple[int, ...] = (1, 2, 4, 8, 16),
                 margin: float = 0.95) -> bool:
    """Whether the compiled step is cheaper here: the mean over ``ks`` of compiled ``bucket_cost(k)`` / eager c(k)
    is below ``margin``."""
    ratios = []
    for k in ks:
        cost = bucket_cost(compiled, k)
        if cost is None:
            return False  # the compiled curve does not reach this width
        ratios.append(cost / eager.cost(k))
    return sum(ratios) / len(ratios) < margin


def running_curve(eager: StepCurve, compiled: StepCurve | None) -> StepCurve:
    """The curve a decode meets where the stored curves choose: the compiled one as run (``as_run``) where it was
    measured and pays (``compile_pays``), else ``eager``."""
    return as_run(compiled) if compiled is not None and compile_pays(eager, compiled) else eager


def breakeven_tokens(eager: StepCurve, compiled: StepCurve, *, ks: tuple[int, ...] = (1, 2, 4, 8, 16)) -> float | None:
    """New tokens a decode needs before compiled steps win back the warm-up ``compiled`` recorded: at most one step
    per token, each saving the most any width of ``ks`` saves (so a lower bound: drafts that are accepted mean fewer
    steps). None: no warm-up recorded, or no width cheaper compiled."""
    saving = max((eager.cost(k) - cost for k in ks if (cost := bucket_cost(compiled, k)) is not None), default=0.0)
    if compiled.warmup_s is None or saving <= 0:
        return None
    return compiled.warmup_s * 1000.0 / saving


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
