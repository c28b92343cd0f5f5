"""Which settings generate() uses when the caller gives none: stored profile, else the default."""

from __future__ import annotations

import torch

from .config import LookaheadConfig


def builtin_default(dtype: torch.dtype, device_type: str) -> LookaheadConfig:
    """Defaults when nothing was measured. On CPU in fp32 a packed step costs ~2x a one-token step,
    so only cheap prompt-lookup drafts; bf16 and GPUs get a small Jacobi window as well."""
    if device_type == "cpu" and dtype == torch.float32:
        return LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=1)
    if device_type == "cpu":
        return LookaheadConfig(window=3, ngram=3, guesses=3, prompt_lookup=10, prompt_lookup_drafts=1)
    return LookaheadConfig(window=15, ngram=5, guesses=15)


def resolve_profile(model: torch.nn.Module, *, workload: str | None = None) -> tuple[LookaheadConfig, str]:
    param = next(model.parameters())
    return builtin_default(param.dtype, param.device.type), "default"
