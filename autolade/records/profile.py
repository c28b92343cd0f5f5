"""A tuned profile: the best settings found for one (hardware, model, dtype, workload), and its JSON form.

JSON import is plain ``json`` plus validation; nothing is unpickled or executed. Every
failure is a ``ProfileError`` naming the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from autolade.config import LookaheadConfig
from autolade.errors import ConfigError, ProfileError
from autolade.records.curve import StepCurve

FORMAT = "autolade-profile"
VERSION = 1
DTYPES = ("float32", "bfloat16", "float16")
MAX_SPEEDUP = 100.0  # beyond this a measured speedup is a bug or a typo
MAX_TOKENS_PER_S = 1e6
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def autolade_version() -> str:
    """The installed distribution's version (a checkout run without installing: "0+unknown")."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("autolade")
    except PackageNotFoundError:
        return "0+unknown"


def model_key(name: str | dict[str, str], config_hash: str | None = None) -> str:
    """``name:config_hash``, the model part of a profile's key.

    Takes a name and hash, or the dict ``autolade.machine.models.model_fingerprint(model)`` returns.
    The name tells fine-tunes of one architecture apart; the hash catches config edits.
    """
    if isinstance(name, dict):
        name, config_hash = name["name"], name["config_hash"]
    if config_hash is None:
        raise ProfileError("model_key needs a config hash")
    return f"{name}:{config_hash}"


@dataclass(frozen=True)
class Profile:
    """The settings that ran best for one (hardware, model, dtype, workload), and what they measured."""

    hardware_fingerprint: str  # HardwareProfile.fingerprint, e.g. "cpu:AMD-EPYC:t2:avx512_bf16"
    hardware_class: str  # HardwareProfile.hardware_class, for the nearest-hardware fallback
    model_name: str  # autolade.machine.models.model_fingerprint(model)["name"]
    model_config_hash: str  # autolade.machine.models.model_fingerprint(model)["config_hash"]
    dtype: str  # "float32" | "bfloat16" | "float16"
    workload: str  # tag of the workload tuned for: "code", "chat", "general", ...
    settings: LookaheadConfig  # the W/N/G etc. that ran best
    policy: dict[str, Any] | None = None  # runtime policy, e.g. {"name": "adaptive", ...params}; None = static
    speedup: float | None = None  # measured tokens/s over plain greedy's, same process and prompts
    tokens_per_s: float | None = None  # measured tokens/s with these settings
    baseline_tokens_per_s: float | None = None  # plain greedy tokens/s in the same run
    prompt_set: str | None = None  # prompts measured on, e.g. "humaneval[:20]"
    hardware_summary: str = ""  # HardwareProfile.summary(), for humans
    created: str = field(default_factory=now_iso)  # ISO 8601, UTC
    autolade_version: str = field(default_factory=autolade_version)  # version that measured it
    step_curve: dict[str, Any] | None = None  # StepCurve.to_dict() of this hardware/model/dtype, if measured
    # the steps it was measured (tuned) or priced (predicted) on: compiled (True) or eager (False); None: not
    # recorded (profiles from before compiled steps existed, which ran eager)
    compiled: bool | None = None
    notes: str = ""  # free text
    id: int | None = None  # row id in a ProfileStore; None for a profile read from a file

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def model_fingerprint(self) -> str:
        """``name:config_hash`` (see ``model_key``)."""
        return model_key(self.model_name, self.model_config_hash)

    @property
    def curve(self) -> StepCurve | None:
        return StepCurve.from_dict(self.step_curve) if self.step_curve is not None else None

    def with_(self, **changes: Any) -> Profile:
        return replace(self, **changes)

    def describe(self) -> str:
        s = self.settings
        lines = [
            f"profile #{self.id}" if self.id is not None else "profile (not stored)",
            f"  hardware:  {self.hardware_fingerprint}  (class {self.hardware_class})",
            f"  model:     {self.model_name}  config {self.model_config_hash}  {self.dtype}",
            f"  workload:  {self.workload}" + (f"  prompts {self.prompt_set}" if self.prompt_set else ""),
            f"  settings:  W={s.window} N={s.ngram} G={s.guesses} prompt_lookup={s.prompt_lookup}x{s.prompt_lookup_drafts}"
            + (" scaled by match length" if s.prompt_lookup_scaled else ""),
        ]
        if self.policy:
            lines.append(f"  policy:    {json.dumps(self.policy, sort_keys=True)}")
        if self.speedup is not None or self.tokens_per_s is not None:
            parts = []
            if self.speedup is not None:
                parts.append(f"{self.speedup:.2f}x greedy")
            if self.tokens_per_s is not None:
                parts.append(f"{self.tokens_per_s:.1f} tok/s")
            if self.baseline_tokens_per_s is not None:
                parts.append(f"greedy {self.baseline_tokens_per_s:.1f} tok/s")
            lines.append(f"  measured:  {', '.join(parts)}")
        lines.append(f"  created:   {self.created}  autolade {self.autolade_version}")
        if self.compiled is not None:
            lines.append(f"  steps:     {'compiled' if self.compiled else 'eager'} when measured")
        if self.step_curve is not None:
            lines.append(f"  curve:     spare compute k={self.curve.spare_compute()}")
        if self.notes:
            lines.append(f"  notes:     {self.notes}")
        return "\n".join(lines)


def _validate(p: Profile) -> None:
    for name in ("hardware_fingerprint", "hardware_class", "model_name", "model_config_hash"):
        _string(name, getattr(p, name), limit=300)
    _string("workload", p.workload, limit=64)
    if not _TAG.fullmatch(p.workload):
        raise ProfileError(f"workload must be a short tag (letters, digits, . _ + -), got {p.workload!r}")
    if p.dtype not in DTYPES:
        raise ProfileError(f"dtype must be one of {', '.join(DTYPES)}, got {p.dtype!r}")
    if not isinstance(p.settings, LookaheadConfig):
        raise ProfileError(f"settings must be a LookaheadConfig, got {type(p.settings).__name__}")
    if p.policy is not None:
        if not isinstance(p.policy, dict) or not isinstance(p.policy.get("name"), str) or not p.policy["name"]:
            raise ProfileError(f"policy must be an object with a string 'name', got {p.policy!r}")
        try:
            json.dumps(p.policy, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"policy must be plain JSON (strings, numbers, lists, objects): {exc}") from None
    _number("speedup", p.speedup, upper=MAX_SPEEDUP)
    _number("tokens_per_s", p.tokens_per_s, upper=MAX_TOKENS_PER_S)
    _number("baseline_tokens_per_s", p.baseline_tokens_per_s, upper=MAX_TOKENS_PER_S)
    if p.prompt_set is not None:
        _string("prompt_set", p.prompt_set, limit=300)
    for name, limit in (("hardware_summary", 8000), ("notes", 8000)):
        if not isinstance(getattr(p, name), str) or len(getattr(p, name)) > limit:
            raise ProfileError(f"{name} must be text of at most {limit} characters")
    _string("autolade_version", p.autolade_version, limit=64)
    _string("created", p.created, limit=64)
    try:
        datetime.fromisoformat(p.created)
    except ValueError:
        raise ProfileError(f"created must be an ISO 8601 date, got {p.created!r}") from None
    if p.step_curve is not None:
        StepCurve.from_dict(p.step_curve)  # raises ProfileError naming what is wrong
    if p.compiled is not None and not isinstance(p.compiled, bool):
        raise ProfileError(f"measured.compiled must be true, false or null, got {p.compiled!r}")
    if p.id is not None and (isinstance(p.id, bool) or not isinstance(p.id, int) or p.id < 1):
        raise ProfileError(f"id must be a positive integer or None, got {p.id!r}")


def _string(name: str, value: Any, *, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise ProfileError(f"{name} is longer than {limit} characters")


def _number(name: str, value: Any, *, upper: float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0 or value >= upper:
        raise ProfileError(f"{name} must be a finite number in (0, {upper:g}), got {value!r}")


# --- JSON -----------------------------------------------------------------------------------


def export_profile(profile: Profile) -> dict[str, Any]:
    """The shareable JSON form (no local row id)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "hardware": {
            "fingerprint": profile.hardware_fingerprint,
            "class": profile.hardware_class,
            "summary": profile.hardware_summary,
        },
        "model": {"name": profile.model_name, "config_hash": profile.model_config_hash, "dtype": profile.dtype},
        "workload": profile.workload,
        "settings": profile.settings.to_dict(),
        "policy": profile.policy,
        "measured": {
            "speedup": profile.speedup,
            "tokens_per_s": profile.tokens_per_s,
            "baseline_tokens_per_s": profile.baseline_tokens_per_s,
            "prompt_set": profile.prompt_set,
            "compiled": profile.compiled,
        },
        "created": profile.created,
        "autolade_version": profile.autolade_version,
        "step_curve": profile.step_curve,
        "notes": profile.notes,
    }


def import_profile(data: Any) -> Profile:
    """Validate a dict parsed from JSON and build the Profile; ProfileError names what is wrong."""
    if not isinstance(data, dict):
        raise ProfileError(f"a profile must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ProfileError(f"format must be {FORMAT!r}, got {data.get('format')!r}: not an autolade profile")
    version = data.get("version")
    if version != VERSION:
        raise ProfileError(f"profile version {version!r} is not supported (this autolade reads version {VERSION})")
    hardware = _section(data, "hardware")
    model = _section(data, "model")
    measured = _section(data, "measured", required=False) or {}
    settings_raw = get_field(data, "settings", dict)
    try:
        settings = LookaheadConfig.from_dict(settings_raw)
    except ConfigError as exc:
        raise ProfileError(f"settings: {exc}") from None
    return Profile(
        hardware_fingerprint=get_field(hardware, "fingerprint", str, where="hardware"),
        hardware_class=get_field(hardware, "class", str, where="hardware"),
        hardware_summary=get_field(hardware, "summary", str, where="hardware", required=False) or "",
        model_name=get_field(model, "name", str, where="model"),
        model_config_hash=get_field(model, "config_hash", str, where="model"),
        dtype=get_field(model, "dtype", str, where="model"),
        workload=get_field(data, "workload", str),
        settings=settings,
        policy=get_field(data, "policy", dict, required=False),
        speedup=get_field(measured, "speedup", (int, float), where="measured", required=False),
        tokens_per_s=get_field(measured, "tokens_per_s", (int, float), where="measured", required=False),
        baseline_tokens_per_s=get_field(measured, "baseline_tokens_per_s", (int, float), where="measured", required=False),
        prompt_set=get_field(measured, "prompt_set", str, where="measured", required=False),
        created=get_field(data, "created", str),
        autolade_version=get_field(data, "autolade_version", str),
        step_curve=get_field(data, "step_curve", dict, required=False),
        compiled=measured.get("compiled"),  # validated by Profile: true, false or absent
        notes=get_field(data, "notes", str, required=False) or "",
    )


def profile_from_json(text: str, *, source: str = "profile") -> Profile:
    """Parse JSON text (plain json: nothing executed) and import it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{source}: not valid JSON ({exc})") from None
    try:
        return import_profile(data)
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None


def profile_to_json(profile: Profile) -> str:
    return json.dumps(export_profile(profile), indent=2, allow_nan=False) + "\n"


def _section(data: dict, key: str, *, required: bool = True) -> dict | None:
    return get_field(data, key, dict, required=required)


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool: what every numeric field of the stored formats must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def get_field(data: dict, key: str, kind: type | tuple[type, ...], *, where: str = "", required: bool = True) -> Any:
    """``data[key]`` checked to be a ``kind`` (never a bool); None when absent and not ``required``.
    ProfileError names the field as ``where.key``."""
    name = f"{where}.{key}" if where else key
    if key not in data or data[key] is None:
        if required:
            raise ProfileError(f"missing field '{name}'")
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        wanted = {"dict": "object", "str": "string", "int or float": "number"}.get(wanted, wanted)
        raise ProfileError(f"field '{name}' must be {wanted}, got {type(value).__name__} {value!r:.60}")
    return value

