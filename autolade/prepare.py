"""What a ``generate`` call settles before the engine runs and reports after it: the input checks,
the settings (explicit, else stored, predicted or built in), the draft price, the stop rule and the
stats. Shared by one sequence (``api``) and a batch (``batched``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from autolade.config import LookaheadConfig
from autolade.engine.decode import DecodeLog
from autolade.engine.memory import AnswerMemory
from autolade.engine.recycle import NextTokenTable
from autolade.errors import ConfigError, InputError
from autolade.runtime.policies import Policy, make_policy, needs_cost
from autolade.runtime.settings import resolve_settings, stored_compile, stored_cost, stored_pads_single, stored_token_cost
from autolade.store.memory import open_memory


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
    compiled: dict[str, Any] | None = None  # the compiled step's buckets, graphs and this call's warm-up; None: eager

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
            + (f"; compiled steps ({'one graph of dynamic width, padded to ' if self.compiled.get('dynamic') else ''}"
               f"buckets {self.compiled['buckets']}, warm-up {self.compiled['warmup_s']:.1f} s this call)"
               if self.compiled else "")
        )


@dataclass(frozen=True)
class GenerateResult:
    sequences: torch.Tensor  # [1, prompt + new], as model.generate returns
    stats: GenerateStats


def check_input(model: torch.nn.Module, input_ids: Any, max_new_tokens: int) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise InputError("input_ids must be a torch.LongTensor of shape [1, T] (use tokenizer(..., return_tensors='pt'))")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise InputError(f"input_ids must have shape [1, T] (one sequence) or [B, T] with attention_mask (a batch); got {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise InputError("the prompt is empty: give at least one token")
    check_max_new_tokens(max_new_tokens)
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


def check_max_new_tokens(max_new_tokens: Any) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def explicit_config(config, window, ngram, guesses) -> LookaheadConfig | None:
    """The settings the caller gave (``config``, with W/N/G over it), validated; None: none given."""
    overrides = {k: v for k, v in (("window", window), ("ngram", ngram), ("guesses", guesses)) if v is not None}
    if config is not None:
        if not isinstance(config, LookaheadConfig):
            raise ConfigError("config must be an autolade.LookaheadConfig")
        return config.with_(**overrides) if overrides else config
    return LookaheadConfig(**overrides) if overrides else None


def resolve_config(model, config, window, ngram, guesses, workload, tokenizer=None, *,
                   compiled: bool | None = False) -> tuple[LookaheadConfig, str, dict | None]:
    """(config, where it came from, the profile's policy spec or None); ``compiled``: the steps that run (None:
    compiled where the stored curves say it pays)."""
    explicit = explicit_config(config, window, ngram, guesses)
    if explicit is not None:
        return explicit, "explicit", None
    return resolve_settings(model, workload=workload, tokenizer=tokenizer, compiled=compiled)


def draft_price(model: torch.nn.Module, price_drafts: bool | float, *, drafts: bool, compiled: bool = False) -> float | None:
    """One packed draft token's cost relative to a step: the stored curve's (True; the compiled steps' where
    ``compiled``), none (False), or the given number; None when nothing is priced (``drafts``: the memory or
    recycling drafts this call)."""
    if isinstance(price_drafts, bool):
        return stored_token_cost(model, compiled=compiled) if price_drafts and drafts else None
    if not isinstance(price_drafts, (int, float)) or not 0.0 <= price_drafts <= 1.0:
        raise ConfigError(f"price_drafts must be True (this machine's step curve), False (no price) or a number in "
                          f"[0, 1] (one packed token's cost relative to a step), got {price_drafts!r}")
    return float(price_drafts) if drafts else None


def stop_fn(stop_token_ids, stop_strings, tokenizer) -> Callable[[list[int]], bool] | None:
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


def accepted_by(log: DecodeLog) -> dict[str, int]:
    by: dict[str, int] = {}
    for s in log.steps:
        if s.accepted:
            by[s.accepted_from] = by.get(s.accepted_from, 0) + s.accepted
    return by


def stats_of(log: DecodeLog, n_new: int, wall: float, config: LookaheadConfig, source: str, policy) -> GenerateStats:
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
        accepted_by=accepted_by(log),
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


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """What ``setup_run`` settled for one call (one sequence or a batch)."""

    config: LookaheadConfig
    source: str  # "explicit", "default", or the profile the settings came from
    policy: Policy  # the runtime policy object (a batch makes one per row with ``new_policy``)
    policy_spec: str | dict | None  # what ``policy`` was made from (None: the config's default policy)
    own_policy: bool  # made here from ``policy_spec`` (False: the caller's Policy object)
    cost: Any  # the stored step curve a cost-aware policy needs, else None
    answers: AnswerMemory | None  # the n-gram memory to draft from
    remember: Callable[[list[int]], str | None] | None  # remembers an answer; returns a note or None
    recycled: NextTokenTable | None  # the token recycling table (carried, the caller's, or None: fresh)
    token_cost: float | None  # a packed memory/recycled token's price relative to a step
    pad_single: bool
    memory_note: str
    compiled: bool = False  # steps run compiled (``engine.compiled``), priced on the compiled curve

    def new_policy(self) -> Policy:
        """A fresh policy of the same kind (policies keep per-sequence state)."""
        if not self.own_policy:
            raise ConfigError("a batch needs policy= as a name, a preset or a dict, so that each row gets its own: "
                              f"got a {type(self.policy).__name__} object")
        return make_policy(self.policy_spec, self.config, cost=self.cost)


def setup_run(
    model: torch.nn.Module, *, window: int | None, ngram: int | None, guesses: int | None,
    config: LookaheadConfig | None, policy: Policy | str | dict | None, workload: str | None, sampled: bool,
    memory: bool | str | AnswerMemory | None, pad_single: bool | None, memory_default: bool | str, tokenizer: Any = None,
    price_drafts: bool | float = True, recycled: NextTokenTable | None = None, compile: bool | None = False,
) -> RunSetup:
    """Settings resolution (explicit W/N/G or config, else the stored/predicted/built-in settings), whether steps
    run compiled (``compile``; None: as the stored curves say), the runtime policy, the n-gram memory and
    recycling table, the draft price and lone-step padding, all priced on the curve of the steps that will run."""
    config, source, profile_policy = resolve_config(model, config, window, ngram, guesses, workload, tokenizer,
                                                    compiled=compile)  # None: as the stored curves say, read there once
    compiled = compile if compile is not None else stored_compile(model)
    if policy is None:
        policy = profile_policy
    spec, cost, own = None, None, False
    if policy is None or isinstance(policy, (str, dict)):
        spec, cost = policy, (stored_cost(model, compiled=compiled) if needs_cost(policy) else None)
        policy, own = make_policy(spec, config, cost=cost), True
    if memory is None:  # sampled: off, so that a seed gives the same sample whatever the memory holds
        memory = False if sampled else memory_default
    if recycled is not None and not isinstance(recycled, NextTokenTable):
        raise ConfigError(f"recycled must be an autolade.engine.recycle.NextTokenTable or None, got {type(recycled).__name__}")
    if pad_single is not None and not isinstance(pad_single, bool):
        raise ConfigError(f"pad_single must be True, False or None (this machine's step curve decides), got {pad_single!r}")
    opened = open_memory(model, memory, workload, recycle=config.recycle > 0 and recycled is None)
    answers, memory_note, carried = opened.answers, opened.note, opened.table
    if carried is not None:
        known = f"{carried.known} tokens known" + (f", {opened.table_note}" if opened.table_note else "")
        memory_note += f"; token recycling table carried over ({known})"
    # memory and recycled drafts priced by this machine's step curve, or at the caller's price (an empty memory drafts nothing)
    token_cost = draft_price(model, price_drafts, drafts=bool(answers or config.recycle), compiled=compiled)
    if pad_single is None:  # plain greedy stays HF's own one-token steps unless asked
        pad_single = not (config.greedy_only and not answers) and stored_pads_single(model, compiled=compiled)
    if answers:
        memory_note += (f"; drafts priced by the step curve (a packed token costs {token_cost:.3f} of a step)"
                        if token_cost is not None else
                        f"; drafts cut below a {answers.config.min_alive:.0%} chance (no step curve stored)")
    return RunSetup(config=config, source=source, policy=policy, policy_spec=spec, own_policy=own, cost=cost, answers=answers,
                    remember=opened.remember, recycled=recycled if recycled is not None else carried,
                    token_cost=token_cost, pad_single=pad_single, memory_note=memory_note, compiled=compiled)
