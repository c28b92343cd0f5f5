"""One measurement harness: run HF greedy, HF prompt lookup and autolade on one prompt, time each
call (CUDA-synchronised when the model is on CUDA), check exactness with the top-2 gap, label a setting.

``autolade bench``, ``autolade tune`` (its ``Runner``), ``tools/bench_sampling.py`` and the real-model
exactness tests all measure through these functions, so they share one pad-token rule, one
float-noise threshold, one prompt-lookup baseline and one name per setting.

    ref = greedy_reference(model, ids, max_new_tokens=64)
    ours = run_autolade(model, ids, max_new_tokens=64, config=config)
    div = divergence(ref.tokens, ours.tokens, ref)      # None: exact
    ok = div is None or div.within_noise(noise_gap(dtype))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.clock import DeviceClock, cuda_synchronize

# transformers' prompt lookup draft length (prompt_lookup_num_tokens) for the HF PLD baseline, as in
# the paper's and transformers' examples
PLD_TOKENS = 10
# Largest reference top-1 minus top-2 logit gap at which a flip between a packed and a one-token forward
# is float noise, per dtype (fp32: a packed forward differs from a one-token forward by ~1e-5)
NOISE_GAP = {torch.float32: 1e-4, torch.bfloat16: 1.0, torch.float16: 0.1}
# policies that never run the Jacobi window, whatever W the config allows
_NO_WINDOW_POLICIES = ("lookup", "cost-aware")


def noise_gap(dtype: torch.dtype) -> float:
    """The float-noise threshold for a model of this dtype (fp32's for unknown dtypes)."""
    return NOISE_GAP.get(dtype, NOISE_GAP[torch.float32])


# --- timing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timer:
    """Wall time of one call. On CUDA the device is synchronised before each clock reading, so queued
    kernels are neither charged to the next call nor missing from this one."""

    now: Callable[[], float] = time.perf_counter  # the clock, in seconds
    sync: Callable[[torch.device], None] = cuda_synchronize  # waits for the device; called only on CUDA

    def __call__(self, device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
        """(fn(), seconds it took), read on a ``DeviceClock`` of ``device``."""
        clock = DeviceClock(device, now_fn=self.now, sync=self.sync)
        t0 = clock.now()
        out = fn()
        return out, clock.since(t0)


TIMER = Timer()


@dataclass(frozen=True)
class HFSteps:
    """What an HF generate did, counted by a forward pre-hook: the tokens fed to each forward."""

    packed: list[int]  # first entry: the prefill

    @property
    def steps(self) -> int:
        return max(len(self.packed) - 1, 0)


@dataclass(frozen=True)
class Timed:
    """One timed call: the new tokens, the seconds, and what the method reports about its steps."""

    tokens: list[int]
    seconds: float
    stats: Any = None  # autolade: GenerateStats; HF: HFSteps when counted, else None


# --- the three methods --------------------------------------------------------------------------


def eos_ids(model: torch.nn.Module, eos: Sequence[int] | None = None) -> list[int]:
    """``eos`` as a list, or the model's own EOS ids (generation config, else model config)."""
    from autolade.machine.models import eos_ids

    return eos_ids(model) if eos is None else [int(e) for e in eos]


def hf_kwargs(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int,
              eos: Sequence[int] | None = None) -> dict[str, Any]:
    """``model.generate`` arguments for one unpadded prompt. The one pad-token rule: the generation
    config's pad token, else the first EOS id, else 0 (one sequence: it never pads a token anyway)."""
    ends = eos_ids(model, eos)
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if pad is None:
        pad = ends[0] if ends else 0
    return {
        "attention_mask": torch.ones_like(ids),
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
        "eos_token_id": ends or None,
        "pad_token_id": pad,
    }


def _count_forwards(model: torch.nn.Module) -> tuple[list[int], Any]:
    lengths: list[int] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        lengths.append(int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0)

    return lengths, model.register_forward_pre_hook(hook, with_kwargs=True)


def run_hf(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int, prompt_lookup: int | None = None,
           eos: Sequence[int] | None = None, count_steps: bool = False, timer: Timer = TIMER,
           **generate_kwargs: Any) -> Timed:
    """``model.generate`` on one prompt, timed around the whole call (prefill included): greedy, or HF
    prompt lookup with ``prompt_lookup`` draft tokens; ``generate_kwargs`` (e.g. ``do_sample=True,
    temperature=0.7``) override the greedy defaults. ``count_steps``: count the forwards with a hook
    (one Python call per forward: noise next to a model forward) into ``Timed.stats``."""
    kwargs = hf_kwargs(model, ids, max_new_tokens=max_new_tokens, eos=eos)
    if prompt_lookup is not None:
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup
    kwargs.update(generate_kwargs)
    lengths, handle = _count_forwards(model) if count_steps else (None, None)
    try:
        with torch.inference_mode():
            out, secs = timer(ids.device, lambda: model.generate(ids, **kwargs))
    finally:
        if handle is not None:
            handle.remove()
    return Timed(out[0, ids.shape[1] :].tolist(), secs, HFSteps(lengths) if count_steps else None)


def run_greedy(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int, **kwargs: Any) -> Timed:
    """HF greedy (``model.generate(do_sample=False)``): the reference every ratio is taken against."""
    return run_hf(model, ids, max_new_tokens=max_new_tokens, **kwargs)


def static_kwargs(model: torch.nn.Module, length: int) -> dict[str, Any]:
    """``generate`` arguments for HF greedy the way a GPU user compiles it: a fixed-size ``StaticCache``
    (``engine.compiled.static_capacity`` of ``length`` = prompt + new tokens: a power of two of at least
    ``MIN_CAPACITY``, so prompts of many lengths share one compiled graph) and ``generate``'s compiled forward
    (``CompileConfig``; on CPU too). A new batch size is a new graph; the first call of each compiles."""
    from transformers import CompileConfig, StaticCache

    from autolade.engine.compiled import static_capacity

    config = CompileConfig()
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    return {"cache": StaticCache(config=model.config, max_cache_len=static_capacity(length)), "compile_config": config}


def run_static(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int, **kwargs: Any) -> Timed:
    """HF greedy on a ``StaticCache`` with its compiled forward (``static_kwargs``). The first call per model
    compiles: a benchmark's warm-up run pays it."""
    return run_hf(model, ids, max_new_tokens=max_new_tokens, **static_kwargs(model, int(ids.shape[1]) + max_new_tokens),
                  **kwargs)


def run_assisted(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int, assistant: torch.nn.Module,
                 **kwargs: Any) -> Timed:
    """HF assisted generation, greedy: ``assistant`` (a smaller model with the same tokenizer) drafts, the
    model verifies; transformers' own draft-length schedule, as a user gets it. Steps count the model's
    forwards only (the draft's run on another module)."""
    return run_hf(model, ids, max_new_tokens=max_new_tokens, assistant_model=assistant, **kwargs)


def run_pld(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int, **kwargs: Any) -> Timed:
    """HF prompt lookup with the baseline's ``PLD_TOKENS`` draft tokens."""
    return run_hf(model, ids, max_new_tokens=max_new_tokens, prompt_lookup=PLD_TOKENS, **kwargs)


def run_autolade(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int,
                 config: LookaheadConfig | None = None, policy: Any = None, eos: Sequence[int] | None = None,
                 timer: Timer = TIMER, **generate_kwargs: Any) -> Timed:
    """``autolade.generate`` on one prompt, timed like ``run_hf``; ``policy`` is built before the clock
    starts by the caller (a fresh one per run). ``eos`` None: the model's own."""
    from autolade.api import generate

    generate_kwargs.setdefault("memory", False)  # a measurement is of the setting alone unless memory is asked for
    res, secs = timer(ids.device, lambda: generate(model, ids, max_new_tokens=max_new_tokens, config=config,
                                                   policy=policy, eos_token_id=eos, **generate_kwargs))
    return Timed(res.sequences[0, ids.shape[1] :].tolist(), secs, res.stats)


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` starting at index ``k`` (mod its length): the interleaving order of a prompt's methods,
    so that drift of a shared machine spreads over all of them."""
    k = k % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


# --- exactness ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """HF greedy's output on one prompt and its top-2 logit gap at every new token."""

    tokens: list[int]
    gaps: list[float]  # reference logits at each new token: top-1 minus top-2
    logits: torch.Tensor | None = None  # [new, V] float32, kept only when asked (for Divergence.gap_chosen)


def top2_gaps(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 of each row of ``logits`` [n, V]."""
    top = logits.float().topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).tolist()


def greedy_reference(model: torch.nn.Module, ids: torch.Tensor, *, max_new_tokens: int,
                     eos: Sequence[int] | None = None, keep_logits: bool = False) -> Reference:
    """HF greedy with its own (unprocessed) logits, untimed; ``keep_logits`` keeps the [new, V] matrix."""
    kwargs = hf_kwargs(model, ids, max_new_tokens=max_new_tokens, eos=eos)
    with torch.inference_mode():
        out = model.generate(ids, output_logits=True, return_dict_in_generate=True, **kwargs)
    logits = torch.cat([x.float() for x in out.logits], dim=0)  # [new, V]
    return Reference(out.sequences[0, ids.shape[1] :].tolist(), top2_gaps(logits), logits if keep_logits else None)


@dataclass(frozen=True)
class Divergence:
    """Where an output first left the reference, and how close the reference's choice was there."""

    index: int  # in the new tokens
    ref_token: int | None  # None: the reference ended there
    got_token: int | None  # None: the output ended there
    gap_top2: float | None  # reference logits there: top-1 minus top-2 (None: not known, or past its end)
    gap_chosen: float | None = None  # reference logits: logit(ref token) - logit(got token), with kept logits

    def within_noise(self, noise: float) -> bool:
        """Whether this is a flip within float noise: two different tokens where the reference's top-2 gap
        is below ``noise``. An output that only ends sooner or later than the reference never is."""
        flip = self.ref_token is not None and self.got_token is not None
        return flip and self.gap_top2 is not None and self.gap_top2 < noise


def first_divergence(ref: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first differing token; a shorter or longer output diverges where the shorter ends."""
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def divergence(ref: Sequence[int], got: Sequence[int], reference: Reference | None = None) -> Divergence | None:
    """None when ``got`` is ``ref`` token for token; else the first divergence, with the top-2 gap (and,
    with kept logits, the chosen-token gap) of ``reference`` — HF greedy's run that produced ``ref`` —
    at that position."""
    d = first_divergence(ref, got)
    if d is None:
        return None
    ref_token = ref[d] if d < len(ref) else None
    got_token = got[d] if d < len(got) else None
    gap_top2 = gap_chosen = None
    if reference is not None and d < len(reference.gaps):
        gap_top2 = reference.gaps[d]
        if reference.logits is not None and ref_token is not None and got_token is not None:
            row = reference.logits[d]
            gap_chosen = float(row[ref_token] - row[got_token])
    return Divergence(d, ref_token, got_token, gap_top2, gap_chosen)


# --- naming -------------------------------------------------------------------------------------


def policy_name(policy: Any) -> str | None:
    """A policy's short name: a preset file's stem, a dict's ``name``; None for static / none."""
    if isinstance(policy, str):
        name = Path(policy).stem
    elif isinstance(policy, dict):
        name = str(policy.get("name", "policy"))
    else:
        return None
    return None if name == "static" else name


def setting_label(config: LookaheadConfig, policy: Any = None) -> str:
    """The one short name of a setting: ``greedy``, ``lookup10``, ``W4N4G4+L10``, ``W2N3G2+R16`` (up to 16
    recycled nodes), ``recycle16``, ``... adaptive``. A lookup length reads ``16x3s`` for 3 drafts (when not
    the default 2) scaled by match length. Under a policy that runs no window (lookup, cost-aware) W/N/G
    are left out; under cost-aware (it sizes the drafts itself, and recycles none) the ``s`` and the R.
    Two settings that behave the same get the same label."""
    if config.greedy_only:
        return "greedy"
    name = policy_name(policy)
    lookup = ""
    if config.prompt_lookup:
        lookup = str(config.prompt_lookup)
        lookup += f"x{config.prompt_lookup_drafts}" if config.prompt_lookup_drafts != 2 else ""
        lookup += "s" if config.prompt_lookup_scaled and name != "cost-aware" else ""
    if not config.lookahead or name in _NO_WINDOW_POLICIES:
        label = f"lookup{lookup}"
    else:
        label = f"W{config.window}N{config.ngram}G{config.guesses}"
        label += f"+L{lookup}" if lookup else ""
    if config.recycle and name != "cost-aware":  # cost-aware plans no recycled drafts
        label = f"recycle{config.recycle}" if label == "lookup" else f"{label}+R{config.recycle}"
    return f"{label} {name}" if name else label
