"""Acceptance tables: how many tokens each setting accepts per step, measured once per model and workload.

Under greedy decoding the tokens a step accepts depend on the model, the workload and the
setting, never on the hardware (the output is the same token sequence everywhere); what a step
costs depends on the hardware, and the step curve c(k) measures that. An ``AcceptanceTable``
holds the first half, so it travels between machines: ``autolade.runtime.predict`` prices it with the
local curve.

Only settings whose plan depends on acceptance alone are tabulated (``autolade.records.grid``).

JSON (``to_json``/``from_json``) is plain data validated field by field; nothing is unpickled
or executed. Every failure is a ``ProfileError`` naming the field.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from autolade.config import LookaheadConfig
from autolade.errors import ConfigError, ProfileError
from autolade.records.grid import Setting, replayable
from autolade.records.profile import DTYPES, autolade_version, get_field, is_number, now_iso
from autolade.records.vocab import as_fingerprints

FORMAT = "autolade-acceptance"
VERSION = 1
REPLAYED_ON = "; prompt lookup replayed on "  # joins a table's engine prompt set and the one replay counted on
MAX_PACKED = 4096  # a packed step beyond this many tokens is a bug or a typo
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceRow:
    """What one setting accepted over the table's prompts (every prompt measured: a row is complete)."""

    setting: Setting  # what ran
    tokens_per_step_mean: float  # mean over prompts of (new tokens - 1) / steps, as res.stats.tokens_per_step
    tokens_per_step_sd: float  # their sample standard deviation over prompts (0 for one prompt)
    packed_per_step_mean: float  # mean over prompts of the mean packed tokens per step
    packed_per_step_sd: float  # their sample standard deviation over prompts
    packed_hist: dict[int, int]  # {packed tokens k: steps that packed k}, all prompts together
    steps: int  # decode steps (forwards after the prefill), all prompts
    tokens: int  # tokens those steps committed (new tokens - 1 per prompt: the first comes from the prefill)
    context_min: int  # KV length (prompt + committed - 1) seen at a step, smallest
    context_median: int  # ... median over all steps
    context_max: int  # ... largest
    prompts: int | None = None  # prompts this row was counted on; None = the table's ``prompts``
    counted_by: str = "engine"  # "engine" (autolade's decoder) or "replay" (greedy outputs replayed, lookup-only rows)
    # tokens/step factor from this row's prompts to the table's: how much more (or less) the replayed settings accepted
    # on all of the table's prompts than on this row's first ``prompts`` (1.0 = the same prompts); prediction applies it
    sample_scale: float = 1.0

    def __post_init__(self) -> None:
        _validate_row(self)

    @property
    def label(self) -> str:
        return self.setting.label

    @property
    def tokens_per_step(self) -> float:
        """Pooled tokens / steps: what prices the setting (total tokens over total step cost)."""
        return self.tokens / self.steps

    @property
    def packed_mean(self) -> float:
        """Histogram-weighted mean packed size."""
        return sum(k * n for k, n in self.packed_hist.items()) / self.steps

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.setting.to_dict(),
            "tokens_per_step": {"mean": self.tokens_per_step_mean, "sd": self.tokens_per_step_sd},
            "packed_per_step": {"mean": self.packed_per_step_mean, "sd": self.packed_per_step_sd},
            "packed_hist": {str(k): n for k, n in sorted(self.packed_hist.items())},
            "steps": self.steps,
            "tokens": self.tokens,
            "context": {"min": self.context_min, "median": self.context_median, "max": self.context_max},
        } | ({"prompts": self.prompts} if self.prompts is not None else {}) | (
            {"counted_by": self.counted_by} if self.counted_by != "engine" else {}) | (
            {"sample_scale": self.sample_scale} if self.sample_scale != 1.0 else {})


@dataclass(frozen=True)
class AcceptanceTable:
    """Tokens per step of candidate settings for one (model, tokenizer, workload, dtype); hardware-free."""

    model_name: str  # autolade.machine.models.model_fingerprint(model)["name"]
    model_config_hash: str  # ... ["config_hash"]
    tokenizer_fingerprint: str  # tokenizer_fingerprint(tokenizer): vocab size + hash of sample pieces (or a legacy one)
    workload: str  # workload tag: "chat", "code", a file's stem
    dtype: str  # "float32" | "bfloat16" | "float16": greedy outputs differ slightly between dtypes
    max_new_tokens: int  # per prompt
    prompts: int  # prompts every row was measured on
    rows: tuple[AcceptanceRow, ...]  # one per setting, in measuring order
    prompt_set: str = ""  # e.g. "chat[:10]", for humans
    measured_on: str = ""  # informational: where it ran (the hardware does not change the counts)
    created: str = field(default_factory=now_iso)  # ISO 8601, UTC; also tells one measuring run's saves apart
    autolade_version: str = field(default_factory=autolade_version)  # version that measured it

    def __post_init__(self) -> None:
        _validate_table(self)

    @property
    def model_fingerprint(self) -> str:
        """``name:config_hash``, as profiles and curves key the model."""
        return f"{self.model_name}:{self.model_config_hash}"

    @property
    def context_median(self) -> int:
        """The workload's typical KV length: the median of the rows' median contexts."""
        return int(statistics.median(r.context_median for r in self.rows))

    def row(self, label: str) -> AcceptanceRow:
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(f"no row {label!r}; rows: {', '.join(r.label for r in self.rows)}")

    def with_row(self, row: AcceptanceRow) -> AcceptanceTable:
        """This table with one more row (a label already present is replaced)."""
        return replace(self, rows=(*(r for r in self.rows if r.label != row.label), row))

    def row_prompts(self, row: AcceptanceRow) -> int:
        return row.prompts if row.prompts is not None else self.prompts

    def merged(self, other: AcceptanceTable) -> AcceptanceTable:
        """Both tables' rows (same model, tokenizer, workload, dtype and length): for a setting in both,
        the row counted on more prompts (this table's on a tie). Rows keep their own prompt counts."""
        key = ("model_fingerprint", "tokenizer_fingerprint", "workload", "dtype", "max_new_tokens")
        if any(getattr(self, k) != getattr(other, k) for k in key):
            raise ProfileError("only tables of the same model, tokenizer, workload, dtype and max_new_tokens merge")
        own = lambda t: tuple(replace(r, prompts=t.row_prompts(r)) for r in t.rows)
        rows = {r.label: r for r in own(other)}
        for r in own(self):
            if r.label not in rows or r.prompts >= rows[r.label].prompts:
                rows[r.label] = r
        return replace(self, rows=tuple(rows.values()), prompts=max(self.prompts, other.prompts))

    def check_for(self, *, model_fingerprint: str | dict[str, str], tokenizer_fingerprint: str | Sequence[str],
                  dtype: str | None = None) -> None:
        """ProfileError unless this table was measured for that model, tokenizer (any of its
        fingerprints, ``tokenizer_fingerprints``) and dtype."""
        if isinstance(model_fingerprint, dict):
            model_fingerprint = f"{model_fingerprint['name']}:{model_fingerprint['config_hash']}"
        if model_fingerprint != self.model_fingerprint:
            raise ProfileError(
                f"acceptance table is for model {self.model_fingerprint}, not {model_fingerprint}: acceptance "
                "depends on the model; measure this one with `autolade accept --model ...`"
            )
        fps = as_fingerprints(tokenizer_fingerprint)
        if self.tokenizer_fingerprint not in fps:
            raise ProfileError(
                f"acceptance table is for tokenizer {self.tokenizer_fingerprint}, not {fps[0]}: "
                "the prompts tokenize differently; measure with this tokenizer via `autolade accept`"
            )
        if dtype is not None and dtype != self.dtype:
            raise ProfileError(f"acceptance table was measured in {self.dtype}, not {dtype}; measure with --dtype {dtype}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": {"name": self.model_name, "config_hash": self.model_config_hash, "dtype": self.dtype},
            "tokenizer": self.tokenizer_fingerprint,
            "workload": self.workload,
            "max_new_tokens": self.max_new_tokens,
            "prompts": self.prompts,
            "prompt_set": self.prompt_set,
            "measured": {"on": self.measured_on, "created": self.created, "autolade_version": self.autolade_version},
            "rows": [r.to_dict() for r in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> AcceptanceTable:
        if not isinstance(data, dict):
            raise ProfileError(f"an acceptance table must be a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ProfileError(f"format must be {FORMAT!r}, got {data.get('format')!r}: not an autolade acceptance table")
        if data.get("version") != VERSION:
            raise ProfileError(f"acceptance table version {data.get('version')!r} is not supported (this autolade reads {VERSION})")
        model = get_field(data, "model", dict)
        measured = get_field(data, "measured", dict, required=False) or {}
        rows = get_field(data, "rows", list)
        if not rows:
            raise ProfileError("rows: an acceptance table file must hold at least one measured setting")
        return cls(
            model_name=get_field(model, "name", str, where="model"),
            model_config_hash=get_field(model, "config_hash", str, where="model"),
            dtype=get_field(model, "dtype", str, where="model"),
            tokenizer_fingerprint=get_field(data, "tokenizer", str),
            workload=get_field(data, "workload", str),
            max_new_tokens=get_field(data, "max_new_tokens", int),
            prompts=get_field(data, "prompts", int),
            prompt_set=get_field(data, "prompt_set", str, required=False) or "",
            measured_on=get_field(measured, "on", str, where="measured", required=False) or "",
            created=get_field(measured, "created", str, where="measured"),
            autolade_version=get_field(measured, "autolade_version", str, where="measured"),
            rows=tuple(_row_from_dict(r, i) for i, r in enumerate(rows)),
        )

    @classmethod
    def from_json(cls, text: str, *, source: str = "acceptance table") -> AcceptanceTable:
        """Parse JSON text (plain json: nothing executed) and validate it; ProfileError names the source."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{source}: not valid JSON ({exc}); truncated or not an acceptance table?") from None
        try:
            return cls.from_dict(data)
        except ProfileError as exc:
            raise ProfileError(f"{source}: {exc}") from None


# --- files ---------------------------------------------------------------------------------


def read_acceptance_file(path: str | Path) -> AcceptanceTable:
    """One ``autolade-acceptance`` JSON file, validated; ProfileError names the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None
    return AcceptanceTable.from_json(text, source=str(path))


def write_acceptance_file(table: AcceptanceTable, path: str | Path) -> Path:
    """Write the table's JSON atomically (temporary file, then rename): a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(table.to_json(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def import_acceptance(path: str | Path, store: Any, *, model_fingerprint: str | dict[str, str] | None = None,
                      tokenizer_fingerprint: str | Sequence[str] | None = None, dtype: str | None = None) -> int:
    """Read, validate and store a shared table; returns its store id. With ``model_fingerprint`` and
    ``tokenizer_fingerprint`` (this model's), a table measured for another model or tokenizer is a
    ProfileError. Nothing is written unless every check passes."""
    table = read_acceptance_file(path)
    if model_fingerprint is not None or tokenizer_fingerprint is not None:
        if model_fingerprint is None or tokenizer_fingerprint is None:
            raise ProfileError("import_acceptance: give both model_fingerprint and tokenizer_fingerprint, or neither")
        table.check_for(model_fingerprint=model_fingerprint, tokenizer_fingerprint=tokenizer_fingerprint, dtype=dtype)
    return store.save_acceptance(table)


# --- validation ----------------------------------------------------------------------------


def _validate_row(r: AcceptanceRow) -> None:
    where = f"row {r.setting.label!r}" if isinstance(r.setting, Setting) else "row"
    if not isinstance(r.setting, Setting):
        raise ProfileError(f"{where}: setting must be a Setting, got {type(r.setting).__name__}")
    for name in ("steps", "tokens", "context_min", "context_median", "context_max"):
        value = getattr(r, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name in ("steps", "tokens") else 0):
            raise ProfileError(f"{where}: {name} must be a {'positive' if name in ('steps', 'tokens') else 'non-negative'} integer, got {value!r}")
    if r.prompts is not None and (isinstance(r.prompts, bool) or not isinstance(r.prompts, int) or r.prompts < 1):
        raise ProfileError(f"{where}: prompts must be a positive integer or absent, got {r.prompts!r}")
    if r.counted_by not in ("engine", "replay"):
        raise ProfileError(f"{where}: counted_by must be 'engine' or 'replay', got {r.counted_by!r}")
    if r.counted_by == "replay" and not replayable(r.setting):
        raise ProfileError(f"{where}: only prompt-lookup settings (static or the lookup policy) can be counted by replay "
                           "(a window needs the model)")
    if not is_number(r.sample_scale) or not 0.2 <= r.sample_scale <= 5.0:
        raise ProfileError(f"{where}: sample_scale must be a number in [0.2, 5], got {r.sample_scale!r}")
    if not r.context_min <= r.context_median <= r.context_max:
        raise ProfileError(f"{where}: contexts must satisfy min <= median <= max, got {r.context_min}/{r.context_median}/{r.context_max}")
    if not isinstance(r.packed_hist, dict) or not r.packed_hist:
        raise ProfileError(f"{where}: packed_hist must be a non-empty {{k: steps}} mapping")
    for k, n in r.packed_hist.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_PACKED:
            raise ProfileError(f"{where}: packed size {k!r} must be an integer in 1..{MAX_PACKED}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ProfileError(f"{where}: packed_hist[{k}] must be a positive step count, got {n!r}")
    if sum(r.packed_hist.values()) != r.steps:
        raise ProfileError(f"{where}: packed_hist counts {sum(r.packed_hist.values())} steps but steps={r.steps}")
    if r.setting.greedy and set(r.packed_hist) != {1}:
        raise ProfileError(f"{where}: a greedy setting packs 1 token a step, packed_hist says {r.packed_hist}")
    capacity = sum(k * n for k, n in r.packed_hist.items())
    if not r.steps <= r.tokens <= capacity:
        raise ProfileError(
            f"{where}: tokens={r.tokens} is impossible for {r.steps} steps packing {capacity} tokens in all "
            "(each step commits at least 1 and at most its packed size)"
        )
    k_lo, k_hi = min(r.packed_hist), max(r.packed_hist)
    for name, lo, hi in (("tokens_per_step_mean", 1.0, k_hi), ("packed_per_step_mean", k_lo, k_hi)):
        value = getattr(r, name)
        if not is_number(value) or not lo - 1e-9 <= value <= hi + 1e-9:
            raise ProfileError(f"{where}: {name} must be a number in [{lo:g}, {hi:g}], got {value!r}")
    for name in ("tokens_per_step_sd", "packed_per_step_sd"):
        value = getattr(r, name)
        if not is_number(value) or value < 0 or value > MAX_PACKED:
            raise ProfileError(f"{where}: {name} must be a finite number >= 0, got {value!r}")


def _validate_table(t: AcceptanceTable) -> None:
    for name, limit in (("model_name", 300), ("model_config_hash", 300), ("tokenizer_fingerprint", 300),
                        ("workload", 64), ("created", 64), ("autolade_version", 64)):
        value = getattr(t, name)
        if not isinstance(value, str) or not value.strip() or len(value) > limit:
            raise ProfileError(f"{name} must be a non-empty string of at most {limit} characters, got {value!r:.80}")
    for name in ("prompt_set", "measured_on"):
        if not isinstance(getattr(t, name), str) or len(getattr(t, name)) > 8000:
            raise ProfileError(f"{name} must be text of at most 8000 characters")
    if not _TAG.fullmatch(t.workload):
        raise ProfileError(f"workload must be a short tag (letters, digits, . _ + -), got {t.workload!r}")
    if t.dtype not in DTYPES:
        raise ProfileError(f"dtype must be one of {', '.join(DTYPES)}, got {t.dtype!r}")
    for name in ("max_new_tokens", "prompts"):
        value = getattr(t, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{name} must be a positive integer, got {value!r}")
    try:
        datetime.fromisoformat(t.created)
    except ValueError:
        raise ProfileError(f"created must be an ISO 8601 date, got {t.created!r}") from None
    if not isinstance(t.rows, tuple) or not all(isinstance(r, AcceptanceRow) for r in t.rows):
        raise ProfileError("rows must be a tuple of AcceptanceRow")
    labels = [r.label for r in t.rows]
    if len(set(labels)) != len(labels):
        raise ProfileError(f"row labels must be unique, got {labels}")
    for r in t.rows:
        # the steps commit at most max_new_tokens - 1 tokens per prompt (the first comes from the prefill)
        if r.tokens > t.row_prompts(r) * (t.max_new_tokens - 1):
            raise ProfileError(f"row {r.label!r}: tokens={r.tokens} exceeds {t.row_prompts(r)} prompts x "
                               f"{t.max_new_tokens - 1} decoded tokens each")


def _row_from_dict(data: Any, index: int) -> AcceptanceRow:
    where = f"rows[{index}]"
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be an object, got {type(data).__name__}")
    label = get_field(data, "label", str, where=where)
    try:
        config = LookaheadConfig.from_dict(get_field(data, "settings", dict, where=where))
    except ConfigError as exc:
        raise ProfileError(f"{where}.settings: {exc}") from None
    tps = get_field(data, "tokens_per_step", dict, where=where)
    pps = get_field(data, "packed_per_step", dict, where=where)
    ctx = get_field(data, "context", dict, where=where)
    hist_raw = get_field(data, "packed_hist", dict, where=where)
    try:
        hist = {int(k): v for k, v in hist_raw.items()}
    except ValueError:
        raise ProfileError(f"{where}.packed_hist: keys must be integer packed sizes, got {sorted(hist_raw)}") from None
    number = (int, float)
    return AcceptanceRow(
        setting=Setting(label=label, config=config, policy=get_field(data, "policy", str, where=where, required=False) or "static",
                        token_cost=get_field(data, "token_cost", number, where=where, required=False)),
        tokens_per_step_mean=float(get_field(tps, "mean", number, where=f"{where}.tokens_per_step")),
        tokens_per_step_sd=float(get_field(tps, "sd", number, where=f"{where}.tokens_per_step")),
        packed_per_step_mean=float(get_field(pps, "mean", number, where=f"{where}.packed_per_step")),
        packed_per_step_sd=float(get_field(pps, "sd", number, where=f"{where}.packed_per_step")),
        packed_hist=hist,
        steps=get_field(data, "steps", int, where=where),
        tokens=get_field(data, "tokens", int, where=where),
        context_min=get_field(ctx, "min", int, where=f"{where}.context"),
        context_median=get_field(ctx, "median", int, where=f"{where}.context"),
        context_max=get_field(ctx, "max", int, where=f"{where}.context"),
        prompts=get_field(data, "prompts", int, where=where, required=False),
        counted_by=get_field(data, "counted_by", str, where=where, required=False) or "engine",
        sample_scale=float(get_field(data, "sample_scale", number, where=where, required=False) or 1.0),
    )


def engine_prompt_set(prompt_set: str) -> str:
    """The part of a table's ``prompt_set`` that the engine counted on, without what replay added."""
    return prompt_set.split(REPLAYED_ON)[0]
