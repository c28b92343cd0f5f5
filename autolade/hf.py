"""A drop-in for ``model.generate``: lookahead decoding as a transformers ``custom_generate`` method.

    out = model.generate(**inputs, custom_generate=autolade.hf.lookahead, max_new_tokens=128)

transformers runs its usual preparation (``generation_config`` merged with the call's arguments,
logits processors, stopping criteria, ``max_length``) and then calls ``lookahead`` the way it
calls its own ``_sample`` loop. ``lookahead`` runs autolade's engine (``api.run_engine``, the
same entry point as ``autolade.generate``) with the settings autolade.generate would choose, and
honours what transformers prepared:

- ``max_new_tokens`` / ``max_length`` (the ``MaxLengthCriteria``), EOS (the ``EosTokenCriteria``:
  the generation config's ``eos_token_id``), any other stopping criteria (``StopStringCriteria``,
  ``MaxTimeCriteria``, your own), evaluated after every token as ``_sample`` does (with
  ``scores=None``: a lookahead step accepts several tokens from one forward), cutting the output
  at the token where one fires;
- greedy (``do_sample=False``) and sampling (``do_sample=True``) with the processors transformers
  built from ``temperature``, ``top_k``, ``top_p``, ``min_p`` and ``repetition_penalty``: greedy is
  token-for-token ``model.generate``'s, sampling has its distribution (not its random stream);
- a streamer: ``put()`` of the prompt, then of the new tokens as they are accepted, ``end()``;
- ``return_dict_in_generate=True``: a ``GenerateDecoderOnlyOutput`` with ``sequences`` only.

Anything else raises an ``autolade.ConfigError`` / ``InputError`` naming the argument: beam search,
batches or padding, other logits processors, ``output_scores`` and the other ``output_*`` flags
(the scores of drafted tokens would not be the ones ``_sample`` reports), a non-empty cache.

autolade's own knobs are keyword arguments of ``lookahead``; transformers hands a callable every
keyword of its signature that its ``_sample`` does not have, taken out of ``generate``'s kwargs
before they are validated (``GenerationMixin._extract_generation_mode_kwargs``), so they pass
straight through ``model.generate(...)`` and ``pipeline(...)(...)``: ``window``, ``ngram``,
``guesses``, ``config``, ``policy``, ``workload``, ``seed``, ``stop_strings``,
``lookahead_tokenizer``, ``lookahead_streamer``, ``lookahead_on_stats``. A keyword that neither
transformers nor ``lookahead`` knows is refused by transformers itself ("The following
`model_kwargs` are not used by the model"), before ``lookahead`` runs.

Two gaps in transformers 5.x's callable path, and what this module does about them:
``_extract_generation_mode_kwargs`` replaces (rather than extends) its dict with the callable's
own keys, so a callable never receives ``tokenizer=`` nor ``streamer=``. For the streamer,
``generate`` has already ``put()`` the prompt into it; ``lookahead`` reads it from its caller's
frame when that caller is ``GenerationMixin.generate`` (read only; nothing in transformers is
changed), so ``streamer=`` works as usual. The tokenizer cannot be recovered, so ``stop_strings``
with a callable need ``lookahead_tokenizer=tok`` (``stop_strings`` itself is one of our keys, so
transformers does not reject it first; a ``generation_config`` carrying ``stop_strings`` is
rejected by transformers for want of a tokenizer before ``lookahead`` runs: use the keyword). The folder form has neither gap:
``model.generate(..., custom_generate=autolade.hf.folder(), trust_remote_code=True)`` loads
``custom_generate/generate.py``, which receives all of ``generate``'s arguments and calls
``autolade.hf.generate`` below.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.stopping_criteria import (
    ConfidenceCriteria,
    EosTokenCriteria,
    MaxLengthCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from autolade.api import run_batch_engine, run_engine
from autolade.config import LookaheadConfig
from autolade.engine.sampling import GreedyPenaltyVerifier, SamplingConfig, SamplingVerifier
from autolade.errors import ConfigError, InputError
from autolade.paths import shipped_dir
from autolade.prepare import GenerateStats, check_input
from autolade.runtime.policies import Policy

# the processors autolade's verifiers implement, in transformers' order, and the field each sets
_PROCESSORS = (
    (RepetitionPenaltyLogitsProcessor, "repetition_penalty", "penalty"),
    (TemperatureLogitsWarper, "temperature", "temperature"),
    (TopKLogitsWarper, "top_k", "top_k"),
    (TopPLogitsWarper, "top_p", "top_p"),
    (MinPLogitsWarper, "min_p", "min_p"),
)
# generation_config fields that select something lookahead does not do: (field, is it on, why)
_UNSUPPORTED_FIELDS = (
    ("num_beams", lambda v: v is not None and v > 1, "beam search: lookahead decodes one sequence (use num_beams=1)"),
    ("num_return_sequences", lambda v: v is not None and v > 1, "several sequences per prompt: call generate once per sample"),
    ("prompt_lookup_num_tokens", lambda v: v is not None, "transformers' prompt lookup: autolade drafts its own; drop it"),
    ("assistant_early_exit", lambda v: v is not None, "self-speculative decoding: drop it"),
    ("dola_layers", lambda v: v is not None, "DoLa decoding: drop it"),
    ("penalty_alpha", lambda v: v is not None and v > 0, "contrastive search: drop it"),
    ("output_scores", bool, "scores of drafted tokens are not the ones _sample reports: drop it"),
    ("output_logits", bool, "logits of drafted tokens are not the ones _sample reports: drop it"),
    ("output_attentions", bool, "a packed lookahead step's attentions are not _sample's: drop it"),
    ("output_hidden_states", bool, "a packed lookahead step's hidden states are not _sample's: drop it"),
)
# model_kwargs that generate's preparation adds and lookahead can ignore (it runs its own cache)
_PREPARED = {"attention_mask", "position_ids", "logits_to_keep", "cache", "past_key_values", "use_cache", "cache_position"}


def lookahead(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    logits_processor: Sequence | None = None,
    stopping_criteria: Sequence | None = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    *,
    window: int | None = None,
    ngram: int | None = None,
    guesses: int | None = None,
    config: LookaheadConfig | None = None,
    policy: Policy | str | dict | None = None,
    workload: str | None = None,
    seed: int | None = None,
    memory: bool | None = None,
    stop_strings: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    lookahead_tokenizer: Any = None,
    lookahead_streamer: Any = None,
    lookahead_on_stats: Callable[[GenerateStats], None] | None = None,
    **model_kwargs: Any,
) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """Lookahead decoding as ``model.generate(..., custom_generate=autolade.hf.lookahead)`` calls it.

    Returns what ``generate`` returns: the sequences ``[1, prompt + new]``, or a
    ``GenerateDecoderOnlyOutput`` holding them with ``return_dict_in_generate=True``.

    autolade's keywords (pass them to ``generate``): ``window``/``ngram``/``guesses``/``config``
    and ``policy``, as in ``autolade.generate`` (none given: the tuned or predicted profile for this
    model and machine, then the built-in default, for ``workload``); ``seed`` for sampling (None:
    torch's global RNG); ``stop_strings`` with ``lookahead_tokenizer`` (the tokenizer also lets
    settings resolution find this model's acceptance table); ``lookahead_streamer``, a streamer
    transformers does not touch (``streamer=`` works too, see the module docstring);
    ``lookahead_on_stats``, called with the run's ``autolade.GenerateStats``.
    """
    if generation_config is None:
        raise ConfigError("autolade.hf.lookahead runs inside transformers: call model.generate(..., custom_generate=autolade.hf.lookahead)")
    prompt_put = streamer is not None  # a streamer generate handed us: it put() the prompt already
    if streamer is None:
        streamer = _streamer_from_caller(sys._getframe(1))
        prompt_put = streamer is not None
    if streamer is None:
        streamer = lookahead_streamer
    try:  # end() the streamer whatever happens: a TextIteratorStreamer's reader would wait forever
        seq, stats = _decode(
            model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, model_kwargs,
            streamer=streamer, prompt_put=prompt_put, stop_strings=stop_strings,
            tokenizer=tokenizer if tokenizer is not None else lookahead_tokenizer, seed=seed,
            settings=dict(window=window, ngram=ngram, guesses=guesses, config=config, policy=policy, workload=workload,
                          memory=memory),
        )  # fmt: skip
    finally:
        if streamer is not None:
            streamer.end()
    if lookahead_on_stats is not None:
        lookahead_on_stats(stats)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=seq)
    return seq


def _decode(model, input_ids, logits_processor, stopping_criteria, gc, synced_gpus, model_kwargs, *, streamer, prompt_put,
            stop_strings, tokenizer, seed, settings) -> tuple[torch.Tensor, GenerateStats]:  # fmt: skip
    """Checks what generate prepared, then runs the engine: (sequences [1, prompt + new], stats)."""
    _reject_unsupported(gc, input_ids, model_kwargs, synced_gpus)
    criteria = list(stopping_criteria or ())
    max_length = min((c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)), default=gc.max_length)
    eos = sorted({int(e) for c in criteria if isinstance(c, EosTokenCriteria) for e in c.eos_token_id.flatten().tolist()})
    others = [c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
    if any(isinstance(c, ConfidenceCriteria) for c in others):
        raise ConfigError("ConfidenceCriteria reads each token's score, which a lookahead step does not produce: drop it")
    if stop_strings:
        if tokenizer is None:
            raise ConfigError(
                "stop_strings need the tokenizer, and transformers does not hand tokenizer= to a callable custom_generate: "
                "pass lookahead_tokenizer=tok (or use custom_generate=autolade.hf.folder(), trust_remote_code=True)"
            )
        others.append(StopStringCriteria(tokenizer, [stop_strings] if isinstance(stop_strings, str) else list(stop_strings)))
    room = max(max_length - input_ids.shape[-1], 0)
    mask = model_kwargs.get("attention_mask")
    if input_ids.shape[0] > 1 or (mask is not None and not bool((mask == 1).all())):
        return _decode_batch(model, input_ids, mask, gc, logits_processor, seed, room=room, eos=eos, others=others,
                             streamer=streamer, settings=settings, tokenizer=tokenizer)
    verifier = _verifier(gc, logits_processor or (), seed)
    ids = check_input(model, input_ids, room)
    tracker = _Tracker(ids, room, StoppingCriteriaList(others), streamer)
    if streamer is not None and not prompt_put:
        streamer.put(ids.cpu())
    res = run_engine(
        model, ids, max_new_tokens=room, **settings, tokenizer=tokenizer, eos=eos, verifier=verifier,
        stop=tracker.stop if tracker.active else None, on_tokens=tracker.on_tokens if tracker.active else None,
    )  # fmt: skip
    return (res.sequences[:, : ids.shape[1] + tracker.kept] if tracker.cut else res.sequences), res.stats


def _decode_batch(model, input_ids, mask, gc, logits_processor, seed, *, room, eos, others, streamer, settings, tokenizer):
    """A left-padded batch (or one padded row): all rows in one forward per step (``autolade.batched``);
    (sequences [B, T + new] as ``_sample`` lays them out, the per-row stats)."""
    if streamer is not None:
        raise ConfigError("a streamer takes one sequence: drop streamer= for a batch, or generate one prompt at a time")
    if others:
        names = ", ".join(sorted({type(c).__name__ for c in others}))
        raise ConfigError(f"with a batch, rows stop at max_new_tokens/max_length and the eos ids only: drop {names}")
    processors = logits_processor or ()
    _verifier(gc, processors, seed)  # refuses what it cannot apply before any row is prefilled
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else None)
    res = run_batch_engine(model, input_ids, mask, max_new_tokens=room, eos=eos, stop=None, on_tokens=None, pad_token_id=pad,
                           tokenizer=tokenizer, verifier_for=lambda b: _verifier(gc, processors, None if seed is None else seed + b), **settings)
    return res.sequences, res.stats


def generate(model: torch.nn.Module, inputs: torch.Tensor | None = None, **generate_arguments: Any):
    """``model.generate(inputs, **generate_arguments)`` decoded by ``lookahead``, with
    ``streamer=`` and ``tokenizer=`` (and so ``stop_strings=``) passed through; what
    ``custom_generate/generate.py`` calls with every argument ``generate`` got."""
    args = dict(generate_arguments)
    streamer = args.pop("streamer", None)
    tokenizer = args.pop("tokenizer", None)
    if args.get("assistant_model") is not None:
        raise ConfigError("assistant_model selects assisted generation: autolade drafts its own; drop it")
    args.pop("assistant_model", None)
    stop_strings = args.pop("stop_strings", None)
    gc = args.get("generation_config")
    if gc is not None and getattr(gc, "stop_strings", None):
        gc = gc.__class__.from_dict(gc.to_dict())
        stop_strings, gc.stop_strings = stop_strings or gc.stop_strings, None
        args["generation_config"] = gc
    if streamer is not None:
        args["lookahead_streamer"] = streamer
    if tokenizer is not None:
        args["lookahead_tokenizer"] = tokenizer
    if stop_strings:
        args["stop_strings"] = stop_strings
    # the class's generate: a model loaded with trust_remote_code may have a custom one bound on the instance
    return type(model).generate(model, inputs, custom_generate=lookahead, **args)


def folder() -> str:
    """The folder to pass as ``custom_generate=`` (with ``trust_remote_code=True``): it holds
    ``custom_generate/generate.py`` (the top of a checkout, or ``autolade/_shipped`` in a wheel)."""
    return str(Path(shipped_dir("custom_generate")).parent)


# --- checks ------------------------------------------------------------------------------------


def _reject_unsupported(gc: Any, input_ids: torch.Tensor, model_kwargs: dict[str, Any], synced_gpus: bool) -> None:
    for name, is_on, why in _UNSUPPORTED_FIELDS:
        value = getattr(gc, name, None)
        if is_on(value):
            raise ConfigError(f"autolade.hf.lookahead does not support {name}={value!r} ({why})")
    if synced_gpus:
        raise ConfigError("autolade.hf.lookahead does not support synced_gpus=True (DeepSpeed ZeRO-3 / FSDP): run on one device")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise InputError(f"autolade.hf.lookahead needs input_ids of shape [1, T] (inputs_embeds are not supported); got {shape}")
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and (not hasattr(cache, "get_seq_length") or int(cache.get_seq_length()) > 0):
        raise ConfigError("autolade.hf.lookahead runs its own KV cache: drop past_key_values/cache (a filled cache is not supported)")
    extra = sorted(k for k, v in model_kwargs.items() if k not in _PREPARED and v is not None)
    if extra:
        raise ConfigError(f"autolade.hf.lookahead does not support the model input(s) {', '.join(extra)}: text-only input_ids")


def _verifier(gc: Any, processors: Sequence, seed: int | None):
    """The verifier applying exactly ``processors`` (what generate built): None for plain greedy."""
    values: dict[str, Any] = {}
    last = -1
    for proc in processors:
        rank = next((i for i, (cls, _, _) in enumerate(_PROCESSORS) if type(proc) is cls), None)
        if rank is None:
            raise ConfigError(
                f"autolade.hf.lookahead does not support the logits processor {type(proc).__name__}: only repetition_penalty, "
                "temperature, top_k, top_p and min_p are implemented exactly (use model.generate without custom_generate)"
            )
        if rank <= last or (rank > 0 and not gc.do_sample):
            raise ConfigError(f"autolade.hf.lookahead does not support {type(proc).__name__} here: a repeated or reordered "
                              "processor, or a sampling warper while do_sample=False")  # fmt: skip
        if getattr(proc, "min_tokens_to_keep", 1) != 1 or getattr(proc, "filter_value", -float("inf")) != -float("inf"):
            raise ConfigError(f"autolade.hf.lookahead supports {type(proc).__name__} only with min_tokens_to_keep=1 and filter_value=-inf")
        if getattr(proc, "prompt_ignore_length", None) is not None:
            raise ConfigError("autolade.hf.lookahead does not support a repetition penalty that ignores a padded prompt")
        _, field, attr = _PROCESSORS[rank]
        last, values[field] = rank, getattr(proc, attr)
    if not gc.do_sample:
        if seed is not None:
            raise ConfigError("seed only applies when sampling: pass do_sample=True, or drop seed")
        penalty = values.get("repetition_penalty")
        return None if penalty is None else GreedyPenaltyVerifier(float(penalty))
    return SamplingVerifier(SamplingConfig(**values, seed=seed))


def _streamer_from_caller(frame: Any) -> Any:
    """The ``streamer`` of ``GenerationMixin.generate`` when it is the frame that called ``lookahead``:
    transformers 5.x put()s the prompt into it and then drops it from a callable's arguments."""
    code = getattr(inspect.unwrap(GenerationMixin.generate), "__code__", None)
    if frame is None or frame.f_code is not code:
        return None
    return frame.f_locals.get("streamer")


class _Tracker:
    """Evaluates the stopping criteria after each accepted token, as ``_sample`` does, feeds the
    streamer the tokens before the cut, and tells the engine to stop."""

    def __init__(self, ids: torch.Tensor, room: int, criteria: StoppingCriteriaList, streamer: Any) -> None:
        self.room = room
        self.criteria = criteria
        self.streamer = streamer
        self.active = bool(criteria) or streamer is not None
        self.kept = 0  # new tokens that stay in the output
        self.cut = False  # a criterion fired
        self._n = ids.shape[1]
        self._buf = torch.empty((1, self._n + room), dtype=torch.long) if criteria else None
        if self._buf is not None:
            self._buf[:, : self._n] = ids.cpu()

    def on_tokens(self, tokens: list[int]) -> None:
        if self.cut:
            return
        keep = len(tokens)
        if self._buf is not None:
            for i, tok in enumerate(tokens):
                self._buf[0, self._n] = tok
                self._n += 1
                if bool(self.criteria(self._buf[:, : self._n], None).any()):
                    keep, self.cut = i + 1, True
                    break
        self.kept += keep
        if self.streamer is not None and keep:
            self.streamer.put(torch.tensor(tokens[:keep], dtype=torch.long))

    def stop(self, _tokens: list[int]) -> bool:
        return self.cut
