"""Which attention implementation each kind of forward runs, switched through transformers' own API.

Three kinds of forward reach the model: the **prefill** and the **single**-token step are causal
(no mask is passed: the model builds its causal one, as ``model.generate`` does); a **packed**
lookahead step carries an arbitrary tree/window 4-D mask. FlashAttention-2's kernels take only
causal (and sliding-window) masks, so a model loaded with ``flash_attention_2`` runs its packed
steps through SDPA and everything else through flash-attn.

``plan_attention`` is pure (device type, dtype, flash-attn installed, the implementation the
model was loaded with -> plan), so it is tested on a CPU. ``AttentionSwitch`` applies a plan to
one model, calling ``model.set_attn_implementation`` the first time each implementation is used
(transformers validates it and loads the kernel then) and the config's ``_attn_implementation``
setter afterwards, and only when the implementation changes. On a CPU, and on CUDA without
flash-attn, every kind runs the implementation the model was loaded with: nothing ever switches.

flash-attn is found at run time (``importlib.util.find_spec``), never imported here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

FLASH = "flash_attention_2"  # transformers' name for the flash-attn 2 package's kernels
PACKED_FALLBACK = "sdpa"  # what a packed step runs when the loaded implementation cannot take its mask
STEP_KINDS = ("prefill", "single", "packed")
FLASH_DTYPES = (torch.float16, torch.bfloat16)  # flash-attn has no fp32 kernels
FLASH_MIN_CC = (8, 0)  # FlashAttention-2 needs Ampere (sm80) or newer


def flash_attn_installed(find_spec: Callable[[str], Any] = importlib.util.find_spec) -> bool:
    """Whether the ``flash_attn`` package is importable here (without importing it)."""
    try:
        return find_spec("flash_attn") is not None
    except (ImportError, ValueError):
        return False


def is_flash(implementation: str | None) -> bool:
    """Whether an implementation name is one of flash-attn's (no arbitrary masks)."""
    return bool(implementation) and "flash" in str(implementation)


def flash_usable(
    *, device_type: str, dtype: torch.dtype, flash_installed: bool, compute_capability: tuple[int, int] | None = None
) -> tuple[bool, str]:
    """(whether flash-attn can run this model, why or why not)."""
    if device_type != "cuda":
        return False, f"flash-attn runs only on CUDA (device {device_type})"
    if dtype not in FLASH_DTYPES:
        return False, f"flash-attn has no {str(dtype).removeprefix('torch.')} kernels (float16 / bfloat16 only)"
    if not flash_installed:
        return False, 'flash-attn is not installed (pip install -e ".[gpu]")'
    if compute_capability is not None and tuple(compute_capability) < FLASH_MIN_CC:
        return False, f"flash-attn 2 needs compute capability >= 8.0, this GPU has {compute_capability[0]}.{compute_capability[1]}"
    return True, "flash-attn on CUDA in half precision"


def load_implementation(
    *, device_type: str, dtype: torch.dtype, flash_installed: bool, compute_capability: tuple[int, int] | None = None
) -> str | None:
    """What ``autolade.load`` asks transformers for when the caller names no implementation:
    flash-attn where it can run, else None (transformers' default: sdpa, the CPU's unchanged path)."""
    ok, _ = flash_usable(
        device_type=device_type, dtype=dtype, flash_installed=flash_installed, compute_capability=compute_capability
    )
    return FLASH if ok else None


@dataclass(frozen=True, kw_only=True)
class AttentionPlan:
    """The implementation each kind of forward runs (None: whatever the model has, untouched)."""

    prefill: str | None  # causal, no mask passed
    single: str | None  # one-token step, causal, no mask passed
    packed: str | None  # tree/window 4-D mask
    reason: str = ""  # one line for reports

    def for_step(self, kind: str) -> str | None:
        if kind not in STEP_KINDS:
            raise ValueError(f"step kind must be one of {', '.join(STEP_KINDS)}, got {kind!r}")
        return getattr(self, kind)

    @property
    def switches(self) -> bool:
        """Whether running this plan changes the model's implementation between steps."""
        return len({self.prefill, self.single, self.packed}) > 1

    def to_dict(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "single": self.single, "packed": self.packed, "reason": self.reason}


def plan_attention(
    *,
    device_type: str,
    dtype: torch.dtype,
    flash_installed: bool,
    loaded: str | None,
    compute_capability: tuple[int, int] | None = None,
) -> AttentionPlan:
    """The per-step plan for a model loaded with ``loaded`` (its ``config._attn_implementation``).

    A flash-attn model keeps flash for the causal forwards and runs packed steps through SDPA;
    any other model runs its own implementation for every kind (the CPU path, unchanged). A model
    not loaded with flash is not upgraded behind the caller's back: its ``model.generate`` would
    then run a different kernel than autolade, and exactness is promised against that generate.
    """
    if is_flash(loaded):
        return AttentionPlan(
            prefill=loaded, single=loaded, packed=PACKED_FALLBACK,
            reason=f"{loaded} for the causal prefill and one-token steps; packed steps need a tree mask: {PACKED_FALLBACK}",
        )  # fmt: skip
    ok, why = flash_usable(
        device_type=device_type, dtype=dtype, flash_installed=flash_installed, compute_capability=compute_capability
    )
    hint = f" (load with attn_implementation={FLASH!r} to use it for causal steps)" if ok else f" ({why})"
    return AttentionPlan(prefill=loaded, single=loaded, packed=loaded, reason=f"{loaded} for every step{hint}")


def model_plan(model: torch.nn.Module, *, flash_installed: bool | None = None) -> AttentionPlan:
    """``plan_attention`` for a live model (its device, dtype and loaded implementation)."""
    param = next(model.parameters())
    cuda = param.device.type == "cuda"
    cc = torch.cuda.get_device_capability(param.device) if cuda else None
    if flash_installed is None:
        flash_installed = cuda and flash_attn_installed()  # off CUDA it changes nothing: skip the lookup
    return plan_attention(
        device_type=param.device.type,
        dtype=param.dtype,
        flash_installed=flash_installed,
        loaded=getattr(model.config, "_attn_implementation", None),
        compute_capability=cc,
    )


@dataclass
class AttentionSwitch:
    """Applies a plan to one model: switches only when a step's implementation differs from the current."""

    model: torch.nn.Module
    plan: AttentionPlan
    current: str | None = None  # the implementation the model runs now
    switched: int = 0  # how many times this switch changed it
    _validated: set[str] = field(default_factory=set)  # implementations set once through set_attn_implementation

    def __post_init__(self) -> None:
        self.current = getattr(self.model.config, "_attn_implementation", None)
        self._validated.add(self.current)

    @classmethod
    def for_model(cls, model: torch.nn.Module, *, plan: AttentionPlan | None = None) -> AttentionSwitch:
        return cls(model=model, plan=plan or model_plan(model))

    def use(self, kind: str) -> None:
        """Make the model run the plan's implementation for a ``kind`` step."""
        self.set(self.plan.for_step(kind))

    def set(self, implementation: str | None) -> None:
        if implementation is None or implementation == self.current:
            return
        if implementation in self._validated:
            self.model.config._attn_implementation = implementation  # transformers' setter (sub-configs too)
        else:
            self.model.set_attn_implementation(implementation)  # validates; loads a kernel on first use
            self._validated.add(implementation)
        self.current = implementation
        self.switched += 1
