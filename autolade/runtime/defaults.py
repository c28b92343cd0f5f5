"""The built-in settings, per device, for when nothing was measured: no profile, no acceptance table."""

from __future__ import annotations

from autolade.config import SCALED_LOOKUP, LookaheadConfig

# Three prompt-lookup drafts scaled by match length, no window: on the 2-core EPYC it was the best
# setting measured on held-out MT-Bench and HumanEval prompts in both dtypes (BENCHMARKS.md, held-out).
CPU_DEFAULT = SCALED_LOOKUP


def builtin_default(device_type: str) -> tuple[LookaheadConfig, dict | None]:
    """Defaults when nothing was measured. On a CPU every packed token costs (fp32: a packed step ~2x
    a one-token step; bf16 less), so prompt lookup only, with short drafts after weak matches; GPUs
    get the paper's setting, adapted at run time."""
    if device_type == "cpu":
        return CPU_DEFAULT, None
    return LookaheadConfig(window=15, ngram=5, guesses=15), {"name": "adaptive", "max_window": 24, "start_window": 15}
