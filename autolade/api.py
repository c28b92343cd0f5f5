"""Public entry points: ``load`` and ``generate``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.clock import DeviceClock
from autolade.engine.decode import DecodeLog, lookahead_decode
from autolade.engine.memory import AnswerMemory
from autolade.engine.recycle import NextTokenTable
from autolade.engine.sampling import SamplingVerifier, make_verifier, reject_unsupported
from autolade.errors import ConfigError, InputError, StoreError
from autolade.machine.models import eos_ids
from autolade.runtime.policies import Policy, make_policy, needs_cost
from autolade.runtime.settings import resolve_settings, stored_cost, stored_pads_single, stored_token_cost
from autolade.store.memory import open_memory

MEMORY_DEFAULT: bool | str = True  # generate(memory=None): see BENCHMARKS.md "N-gram memory" for the measurements behind it


@dataclass(frozen=True)
class GenerateStats:
    """What a generation did; ``res.stats``."""

    steps: int  # forward passes after the prefill
    new_tokens: int
    tokens_per_step: float  # compression: new tokens / steps
    accepted_per_step: float  # draft tokens accepted per step (bonus token not counted)
    wall_s: float  # prefill included
    tokens_per_s: float
    prefill_ms: float
    forward_ms: float  # model forwards of the decode steps
    overhead_ms: float  # autolade's own work per decode step (drafting, masks, verify, cache, policy)
    policy_ms: float  # of that, the runtime policy's plan() and update() calls
    stop_reason: str  # "eos", "max_new_tokens" or "stop"
    settings: dict[str, Any]  # the LookaheadConfig used
    settings_source: str  # "explicit", "default", or the profile it came from
    policy: str
    per_step: dict[str, list] = field(repr=False, default_factory=dict)  # window, guesses, packed, accepted, source, step_ms
    accepted_by: dict[str, int] = field(default_factory=dict)  # draft tokens accepted per source: lookup, memory, pool
    memory: str = "off"  # the n-gram memory: "off", or what it held ("N answers (T tokens, workload)")
    draft_price: float | None = None  # one packed memory/recycled token's cost relative to a step, as priced; None: not priced
    padded: bool = False  # steps with nothing to draft packed a filler draft (generate(pad_single=))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.steps} steps ({self.tokens_per_step:.2f} tokens/step), "
            f"{self.tokens_per_s:.1f} tok/s, {self.wall_s:.2f} s; forward {self.forward_ms:.0f} ms, "
            f"autolade overhead {self.overhead_ms:.0f} ms, policy {self.policy_ms:.1f} ms; settings W={self.settings['window']} "
            f"N={self.settings['ngram']} G={self.settings['guesses']} "
            f"lookup={self.settings['prompt_lookup']} ({self.settings_source}), policy {self.policy}; "
            f"memory: {self.memory}" + (f" ({self.accepted_by.get('memory', 0)} draft tokens accepted from it)"
                                         if self.memory != "off" else "")
            + ("; lone steps padded with a filler draft (a two-token step costs less than one here)" if self.padded else "")
        )


@dataclass(frozen=True)
class GenerateResult:
    sequences: torch.Tensor  # [1, prompt + new], as model.generate returns
    stats: GenerateStats


def load(name_or_path: str = "smollm2-135m", *, dtype: str = "float32", trust_remote_code: bool = False):
    """(model, tokenizer) for a registry name, a local HF dir, a cached hub id or a .gguf file."""
    from autolade.machine.models import load as _load

    return _load(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code)


def known_workloads(model: torch.nn.Module) -> list[str]:
    """The workload tags ``model`` has met, sorted: the ones settings resolution always tries (general,
    chat, code), those the n-gram memory holds answers or a recycling table under, and those a stored
    profile of it was tuned for. Reads only the stores that exist; creates none."""
    from autolade.machine.models import model_fingerprint
    from autolade.paths import user_dir
    from autolade.records.profile import model_key
    from autolade.store.db import DB_NAME, ProfileStore
    from autolade.store.memory import memory_path, open_memory_store, recycling_summary, summary
    from autolade.workloads import FALLBACK_ORDER

    key = model_key(model_fingerprint(model))
    known = set(FALLBACK_ORDER)
    try:
        if memory_path().is_file():
            with open_memory_store() as store:
                known.update(row["workload"] for row in summary(store) + recycling_summary(store) if row["model"] == key)
        if (user_dir() / DB_NAME).is_file():
            with ProfileStore() as store:
                known.update(p.workload for p in store.list(model=key))
    except StoreError:  # an unreadable store knows nothing: generate() says what it makes of it
        pass
    return sorted(known)


def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 256,
    window: int | None = None,
    ngram: int | None = None,
    guesses: int | None = None,
    config: LookaheadConfig | None = None,
    policy: Policy | str | dict | None = None,
    workload: str | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    stop_strings: Sequence[str] | None = None,
    tokenizer: Any = None,
    on_tokens: Callable[[list[int]], None] | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    memory: bool | str | AnswerMemory | None = None,
    price_drafts: bool | float = True,
    recycled: NextTokenTable | None = None,
    pad_single: bool | None = None,
    **unsupported: Any,
) -> GenerateResult:
    """Exact greedy lookahead decoding: the same tokens as ``model.generate(do_sample=False)``.

    ``do_sample=True``: exact lookahead sampling, with the distribution of
    ``model.generate(do_sample=True, temperature=, top_k=, top_p=, min_p=, repetition_penalty=)``;
    unset values come from the model's generation_config, then transformers' defaults (top_k=50).
    ``seed`` makes a run reproducible (None: drawn from torch's global RNG). Other logits
    processors raise a ConfigError.

    W/N/G come from ``config``, or from ``window``/``ngram``/``guesses`` (the rest from the
    defaults), or, with none of them given, from the best stored profile for this hardware,
    model and ``workload``, else from built-in defaults. ``policy`` is a Policy object, a name
    ("static", "adaptive", "lookup"), a preset in ``policies/`` or a dict; it decides each step's
    W/G/draft length within the config and never changes the output.

    ``memory=True``: earlier answers of this model and workload (the store's n-gram memory, see
    ``autolade.store.memory``) are one more draft source, and this answer is remembered; ``"read"``: drafts
    from the memory, remembers nothing; an ``AnswerMemory`` object: drafts from that one, remembers
    nothing (the tuner's way); ``False``: neither; None: ``MEMORY_DEFAULT`` when greedy, off
    when sampling (a sample's random draws follow the drafts, so a seed would not repeat a sample once
    the memory grew). Greedy output is the same either way; sampled output keeps its distribution.
    With the memory on, a config with ``recycle`` > 0 also carries its token recycling table (the model's
    top-8 next tokens after each token, see ``autolade.engine.recycle``) from one call to the next, per
    model and workload, saved beside the memory so that the next process starts from it (``"read"``: a
    copy, neither changed nor saved); otherwise each call starts a fresh one. ``recycled``: the caller's
    own ``NextTokenTable``, drafted from and taught by this call.

    ``price_drafts``: memory and recycled drafts are packed only where this machine's stored step curve
    says they pay (``StepCurve.token_cost``); False: recycled drafts fill the config's ``recycle`` budget
    whatever the machine; a number in [0, 1]: that cost of one packed token relative to a step, instead of
    the stored curve's (what ``autolade accept`` counts a recycling setting at, once per price, so that a
    table travels to machines of any price). ``res.stats.draft_price`` says which price was used.

    ``pad_single``: a step with nothing to draft packs one filler draft (what followed the last token
    before, else the context's most frequent token), because a two-token step costs less than a
    one-token one on this machine; None (the default): where this machine's stored step curve says so
    (``StepCurve.pads_single``: c(2) < c(1), measured for the 1.5B Qwen in bf16 on a 2-core EPYC) and
    the call drafts at all (a plain greedy config without a memory keeps HF's one-token steps);
    True / False: always / never. The output is the same either way; ``res.stats.padded`` says which.
    """
    reject_unsupported(unsupported)
    ids = check_input(model, input_ids, max_new_tokens)
    verifier = make_verifier(
        model, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    eos = eos_ids(model, eos_token_id=eos_token_id)
    stop = _stop_fn(stop_token_ids, stop_strings, tokenizer)
    return run_engine(
        model, ids, max_new_tokens=max_new_tokens, window=window, ngram=ngram, guesses=guesses, config=config,
        policy=policy, workload=workload, tokenizer=tokenizer, eos=eos, stop=stop, on_tokens=on_tokens, verifier=verifier,
        memory=memory, price_drafts=price_drafts, recycled=recycled, pad_single=pad_single,
    )  # fmt: skip


def run_engine(
    model: torch.nn.Module,
    ids: torch.Tensor,
    *,
    max_new_tokens: int,
    window: int | None,
    ngram: int | None,
    guesses: int | None,
    config: LookaheadConfig | None,
    policy: Policy | str | dict | None,
    workload: str | None,
    tokenizer: Any,
    eos: Sequence[int],
    stop: Callable[[list[int]], bool] | None,
    on_tokens: Callable[[list[int]], None] | None,
    verifier: Any,
    memory: bool | str | AnswerMemory | None = None,
    price_drafts: bool | float = True,
    recycled: NextTokenTable | None = None,
    pad_single: bool | None = None,
) -> GenerateResult:
    """The one engine entry point behind ``generate`` and ``autolade.hf.lookahead``: settings
    resolution (explicit W/N/G or config, else the stored/predicted/built-in settings), the
    runtime policy, the decode and its stats. ``ids`` [1, T] are already checked (``check_input``)."""
    config, source, profile_policy = _resolve_config(model, config, window, ngram, guesses, workload, tokenizer)
    if policy is None:
        policy = profile_policy
    if policy is None or isinstance(policy, (str, dict)):
        policy = make_policy(policy, config, cost=stored_cost(model) if needs_cost(policy) else None)
    if memory is None:  # sampled: off, so that a seed gives the same sample whatever the memory holds
        memory = False if isinstance(verifier, SamplingVerifier) else MEMORY_DEFAULT
    if recycled is not None and not isinstance(recycled, NextTokenTable):
        raise ConfigError(f"recycled must be an autolade.engine.recycle.NextTokenTable or None, got {type(recycled).__name__}")
    if pad_single is not None and not isinstance(pad_single, bool):
        raise ConfigError(f"pad_single must be True, False or None (this machine's step curve decides), got {pad_single!r}")
    opened = open_memory(model, memory, workload, recycle=config.recycle > 0 and recycled is None)
    answers, memory_note, remember, carried = opened.answers, opened.note, opened.remember, opened.table
    recycled = recycled if recycled is not None else carried
    if carried is not None:
        known = f"{carried.known} tokens known" + (f", {opened.table_note}" if opened.table_note else "")
        memory_note += f"; token recycling table carried over ({known})"
    # memory and recycled drafts priced by this machine's step curve, or at the caller's price (an empty memory drafts nothing)
    token_cost = _draft_price(model, price_drafts, drafts=bool(answers or config.recycle))
    if pad_single is None:  # plain greedy stays HF's own one-token steps unless asked
        pad_single = not (config.greedy_only and not answers) and stored_pads_single(model)
    if answers:
        memory_note += (f"; drafts priced by the step curve (a packed token costs {token_cost:.3f} of a step)"
                        if token_cost is not None else
                        f"; drafts cut below a {answers.config.min_alive:.0%} chance (no step curve stored)")
    clock = DeviceClock(ids.device)  # CUDA: synchronised, so wall_s covers finished work
    t0 = clock.now()
    new, log = lookahead_decode(
        model, ids, config=config, max_new_tokens=max_new_tokens, eos_ids=eos, stop=stop, policy=policy, on_tokens=on_tokens,
        verifier=verifier, memory=answers, token_cost=token_cost, recycled=recycled, pad_single=pad_single,
    )
    wall = clock.since(t0)
    if remember is not None:
        memory_note += "" if (why := remember(new)) is None else f"; {why}"
    seq = torch.cat([ids, torch.tensor([new], dtype=ids.dtype, device=ids.device)], dim=1)
    stats = _stats(log, len(new), wall, config, source, policy)
    return GenerateResult(sequences=seq, stats=replace(stats, memory=memory_note, draft_price=token_cost,
                                                       padded=pad_single))


def _draft_price(model: torch.nn.Module, price_drafts: bool | float, *, drafts: bool) -> float | None:
    """One packed draft token's cost relative to a step: the stored curve's (True), none (False), or the given
    number; None when nothing is priced (``drafts``: the memory or recycling drafts this call)."""
    if isinstance(price_drafts, bool):
        return stored_token_cost(model) if price_drafts and drafts else None
    if not isinstance(price_drafts, (int, float)) or not 0.0 <= price_drafts <= 1.0:
        raise ConfigError(f"price_drafts must be True (this machine's step curve), False (no price) or a number in "
                          f"[0, 1] (one packed token's cost relative to a step), got {price_drafts!r}")
    return float(price_drafts) if drafts else None


def check_input(model: torch.nn.Module, input_ids: Any, max_new_tokens: int) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise InputError("input_ids must be a torch.LongTensor of shape [1, T] (use tokenizer(..., return_tensors='pt'))")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise InputError(f"input_ids must have shape [1, T] (one sequence); got {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise InputError("the prompt is empty: give at least one token")
    _check_max_new_tokens(max_new_tokens)
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    if vocab and (int(input_ids.max()) >= vocab or int(input_ids.min()) < 0):
        raise InputError(f"input_ids hold ids outside the model's vocabulary 0..{vocab - 1}: wrong tokenizer?")
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit and input_ids.shape[1] + max_new_tokens > limit:
        raise InputError(
            f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {limit} tokens: shorten the prompt or lower max_new_tokens"
        )
    device = next(model.parameters()).device
    return input_ids.to(device=device, dtype=torch.long)


def check_arguments(
    *,
    max_new_tokens: int = 256,
    window: int | None = None,
    ngram: int | None = None,
    guesses: int | None = None,
    config: LookaheadConfig | None = None,
    policy: Policy | str | dict | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
) -> None:
    """A ConfigError for what ``generate`` refuses whatever the model: ``max_new_tokens``, W/N/G (or
    ``config``), the runtime policy and the sampling settings, each checked as ``generate`` checks it.
    The CLI calls it before it loads the model, so that a typo fails in a second, not after the load."""
    _check_max_new_tokens(max_new_tokens)
    explicit = _explicit_config(config, window, ngram, guesses)
    if (policy is None or isinstance(policy, (str, dict))) and not needs_cost(policy):  # cost-aware: needs the model's curve
        make_policy(policy, explicit or LookaheadConfig())
    make_verifier(None, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, seed=seed)  # no model: its generation_config is not consulted


def _check_max_new_tokens(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def _explicit_config(config, window, ngram, guesses) -> LookaheadConfig | None:
    """The settings the caller gave (``config``, with W/N/G over it), validated; None: none given."""
    overrides = {k: v for k, v in (("window", window), ("ngram", ngram), ("guesses", guesses)) if v is not None}
    if config is not None:
        if not isinstance(config, LookaheadConfig):
            raise ConfigError("config must be an autolade.LookaheadConfig")
        return config.with_(**overrides) if overrides else config
    return LookaheadConfig(**overrides) if overrides else None


def _resolve_config(model, config, window, ngram, guesses, workload, tokenizer=None) -> tuple[LookaheadConfig, str, dict | None]:
    """(config, where it came from, the profile's policy spec or None)."""
    explicit = _explicit_config(config, window, ngram, guesses)
    if explicit is not None:
        return explicit, "explicit", None
    return resolve_settings(model, workload=workload, tokenizer=tokenizer)


def _stop_fn(stop_token_ids, stop_strings, tokenizer) -> Callable[[list[int]], bool] | None:
    ids = set(int(i) for i in stop_token_ids or ())
    strings = [s for s in stop_strings or () if s]
    if stop_strings and not strings:
        raise ConfigError("stop_strings must be non-empty strings")
    if strings and tokenizer is None:
        raise ConfigError("stop_strings need tokenizer= to decode the output")
    if not ids and not strings:
        return None
    tail = max((len(s) for s in strings), default=0) + 16

    def stop(tokens: list[int]) -> bool:
        if ids and any(t in ids for t in tokens[-64:]):
            return True
        if strings:
            text = tokenizer.decode(tokens[-tail:], skip_special_tokens=False)
            return any(s in text for s in strings)
        return False

    return stop


def _accepted_by(log: DecodeLog) -> dict[str, int]:
    by: dict[str, int] = {}
    for s in log.steps:
        if s.accepted:
            by[s.accepted_from] = by.get(s.accepted_from, 0) + s.accepted
    return by


def _stats(log: DecodeLog, n_new: int, wall: float, config: LookaheadConfig, source: str, policy) -> GenerateStats:
    steps = len(log.steps)
    forward = sum(s.forward_ms for s in log.steps)
    step_total = sum(s.step_ms for s in log.steps)
    accepted = sum(s.accepted for s in log.steps)
    decode_tokens = max(n_new - 1, 0)  # the first token comes from the prefill
    return GenerateStats(
        steps=steps,
        new_tokens=n_new,
        tokens_per_step=decode_tokens / steps if steps else float(n_new),
        accepted_per_step=accepted / steps if steps else 0.0,
        wall_s=wall,
        tokens_per_s=n_new / wall if wall > 0 else 0.0,
        prefill_ms=log.prefill_ms,
        forward_ms=forward,
        overhead_ms=step_total - forward + log.policy_ms,
        policy_ms=log.policy_ms,
        stop_reason=log.stop_reason,
        settings=config.to_dict(),
        settings_source=source,
        accepted_by=_accepted_by(log),
        policy=getattr(policy, "name", type(policy).__name__),
        per_step={
            "window": [s.window for s in log.steps],
            "guesses": [s.guesses for s in log.steps],
            "packed": [s.packed for s in log.steps],
            "accepted": [s.accepted for s in log.steps],
            "source": [s.accepted_from for s in log.steps],
            "step_ms": [round(s.step_ms, 3) for s in log.steps],
        },
    )
