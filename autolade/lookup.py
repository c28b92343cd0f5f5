"""Which settings generate() uses when the caller gives none: a stored or shared profile for this
hardware, model, dtype and workload; else the default derived from a measured step-latency curve;
else a built-in default."""

from __future__ import annotations

import re
import torch

from .config import SCALED_LOOKUP, LookaheadConfig

WORKLOAD_ORDER = ("general", "chat", "code")  # tried in turn when the caller names no workload
_CODE_HINTS = re.compile(r"(^\s*(def|class|import|from|#include|fn|func|public|return)\b)|```|[{};]\s*$", re.M)


# Three prompt-lookup drafts scaled by match length, no window: on the 2-core EPYC it was the best
# setting measured on held-out MT-Bench and HumanEval prompts in both dtypes (BENCHMARKS.md, held-out).
CPU_DEFAULT = SCALED_LOOKUP


def builtin_default(dtype: torch.dtype, device_type: str) -> tuple[LookaheadConfig, dict | None]:
    """Defaults when nothing was measured. On a CPU every packed token costs (fp32: a packed step ~2x
    a one-token step; bf16 less), so prompt lookup only, with short drafts after weak matches; GPUs
    get the paper's setting, adapted at run time."""
    if device_type == "cpu":
        return CPU_DEFAULT, None
    return LookaheadConfig(window=15, ngram=5, guesses=15), {"name": "adaptive", "max_window": 24, "start_window": 15}


_CODE_REQUEST = re.compile(
    r"\b(write|implement|complete|fix|refactor|debug)\b.*\b(code|function|program|script|class|method|python|"
    r"javascript|typescript|java|rust|sql|bash)\b", re.I | re.S)


def infer_workload(text: str) -> str:
    """'code' for text that looks like source code or asks for some (the answer will be code), else 'chat'."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    hits = len(_CODE_HINTS.findall(text))
    if lines and hits >= max(2, len(lines) // 4):
        return "code"
    return "code" if _CODE_REQUEST.search(text) else "chat"


class ProfileLookup:
    """This model, dtype and machine, and the profile store to look them up in."""

    def __init__(self, model: torch.nn.Module) -> None:
        from .hardware import probe_hardware
        from .models import model_fingerprint
        from .store import ProfileStore

        param = next(model.parameters())
        device = "cpu" if param.device.type == "cpu" else f"cuda:{param.device.index or 0}"
        self.hardware = probe_hardware(device=device, measure=False)
        self.fingerprint = model_fingerprint(model)
        self.store = ProfileStore()

    def curve(self):
        """This machine's latest step-latency curve for this model and dtype, or None."""
        fp = self.fingerprint
        return self.store.latest_curve(hardware_fingerprint=self.hardware.fingerprint, model_fingerprint=fp,
                                       dtype=fp["dtype"])

    def find(self, workload: str):
        """(profile or None, source): the store, then the shared JSON files in ``profiles/``; exact
        hardware first, then the same hardware class."""
        return self.store.lookup(
            hardware_fingerprint=self.hardware.fingerprint, hardware_class=self.hardware.hardware_class,
            model_fingerprint=self.fingerprint, dtype=self.fingerprint["dtype"], workload=workload,
        )


def stored_cost(model: torch.nn.Module):
    """c(k) in ms (``StepCurve.cost``) from this machine's stored step-latency curve for this model
    and dtype, or None when none was measured."""
    curve = ProfileLookup(model).curve()
    return curve.cost if curve is not None else None


def stored_profile(model: torch.nn.Module, workload: str):
    """(profile, source) for exactly this workload; a ``ConfigError`` that names the fix if there is none."""
    from .errors import ConfigError
    from .tune import workload_tag

    tag = workload_tag(workload)
    prof, source = ProfileLookup(model).find(tag)
    if prof is None:
        raise ConfigError(f"no {tag!r} profile for this model, dtype and machine: run "
                          f"`autolade tune --workload {workload}` or import one (`autolade profiles import FILE`)")
    return prof, source


def resolve_profile(model: torch.nn.Module, *, workload: str | None = None) -> tuple[LookaheadConfig, str, dict | None]:
    """(config, source, policy spec) for this model on this machine."""
    from .curve import default_settings

    here = ProfileLookup(model)
    # the named workload first; a profile of another workload on this machine beats a blind default
    for tag in [workload] * bool(workload) + [t for t in WORKLOAD_ORDER if t != workload]:
        prof, source = here.find(tag)
        if prof is not None:
            note = "" if tag == workload or not workload else f", no {workload!r} profile"
            return prof.settings, f"{source} ({tag}{note})", prof.policy
    curve = here.curve()
    param = next(model.parameters())
    if curve is not None:
        config = default_settings(curve, workload=workload)
        if config.lookahead:  # a curve flat enough for a Jacobi window (GPUs)
            return config, "default (from this machine's step-latency curve)", None
        # No window pays: scaled prompt lookup. Where even 2 packed tokens cost >1.25x one (fp32 on
        # small CPUs) the cost-aware policy sizes or skips each draft by the curve: 1.05x-1.12x the
        # static rule in fp32 here, level with it in bf16, whose curve is smooth (BENCHMARKS.md).
        if curve.spare_compute() < 2:
            return SCALED_LOOKUP, "default (cost-aware lookup on this machine's step-latency curve)", {"name": "cost-aware"}
        return SCALED_LOOKUP, "default (scaled lookup; this machine's step-latency curve)", None
    config, policy = builtin_default(param.dtype, param.device.type)
    return config, "default (built-in; run `autolade tune` for this machine)", policy

