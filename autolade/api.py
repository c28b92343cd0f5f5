"""Public entry points: ``load`` and ``generate``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from autolade.batched import BatchResult, run_batch, split_rows
from autolade.compiling import check_compile, compile_summary, default_runners
from autolade.config import LookaheadConfig
from autolade.engine.clock import DeviceClock
from autolade.engine.decode import lookahead_decode
from autolade.engine.memory import AnswerMemory
from autolade.engine.recycle import NextTokenTable
from autolade.engine.sampling import SamplingVerifier, make_verifier, reject_unsupported
from autolade.errors import StoreError
from autolade.machine.models import eos_ids
from autolade.prepare import GenerateResult, check_input, check_max_new_tokens, explicit_config, setup_run, stats_of, stop_fn
from autolade.runtime.policies import Policy, make_policy, needs_cost
from autolade.runtime.settings import stored_buckets, stored_cost

MEMORY_DEFAULT: bool | str = True  # generate(memory=None): see BENCHMARKS.md "N-gram memory" for the measurements behind it


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
    attention_mask: torch.Tensor | None = None,
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
    pad_token_id: int | None = None,
    compile: bool | None = None,
    **unsupported: Any,
) -> GenerateResult | BatchResult:
    """Exact greedy lookahead decoding: the same tokens as ``model.generate(do_sample=False)``.

    ``input_ids`` [1, T] (or [T]) is one sequence and returns a ``GenerateResult``. A batch, [B, T]
    with B > 1 and ``attention_mask`` [B, T] padded on the left (``tokenizer(prompts, padding=True,
    return_tensors="pt")`` with ``padding_side="left"``), is decoded together, one forward per step
    for all rows (``autolade.batched``), and returns a ``BatchResult``: ``sequences`` laid out as
    ``model.generate`` lays out the batch (new tokens after the input, ``pad_token_id``, default the
    first eos id, after a row that ended early), ``stats`` per row and ``batch`` for the whole. Each
    row's tokens are those of ``generate`` on that row alone. In a batch, ``on_tokens(row, tokens)``
    gets the row's index, a sampled row b draws from ``seed + b`` and ``policy`` must be a name,
    preset or dict (each row gets its own policy object).

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

    ``price_drafts``: memory and recycled drafts are packed only where the stored step curve says they pay
    (``StepCurve.token_cost``); False: recycled drafts fill the ``recycle`` budget whatever the machine; a number
    in [0, 1]: that cost of a packed token relative to a step (``autolade accept``'s way); see ``stats.draft_price``.

    ``pad_single``: a step with nothing to draft packs one filler draft (what followed the last token before,
    else the context's most frequent token) where a two-token step costs less than a one-token one; None: where
    the stored step curve says so (``StepCurve.pads_single``) and the call drafts at all. Same output either way.

    ``compile=True``: steps run compiled (``torch.compile``, CUDA graphs on a GPU) at a few fixed widths on a
    static KV cache (``autolade.engine.compiled``), warm-up (``res.stats.compiled``) paid once per model and
    width; None: where the stored curves say it pays (``autolade profile --compile``). Same output. A batch runs
    compiled as one graph of dynamic rows, width and length (``autolade.engine.batch_compiled``).
    """
    reject_unsupported(unsupported)
    batched = isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1
    check_compile(compile)
    sampling = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty)
    eos = eos_ids(model, eos_token_id=eos_token_id)
    stop = stop_fn(stop_token_ids, stop_strings, tokenizer)
    settings = dict(window=window, ngram=ngram, guesses=guesses, config=config, policy=policy, workload=workload,
                    tokenizer=tokenizer, memory=memory, price_drafts=price_drafts, recycled=recycled)
    if batched:
        return run_batch_engine(model, input_ids, attention_mask, max_new_tokens=max_new_tokens, eos=eos, stop=stop,
                                on_tokens=on_tokens, pad_token_id=pad_token_id, compile=compile, **settings,
                                verifier_for=lambda b: make_verifier(model, **sampling, seed=None if seed is None else seed + b))
    if attention_mask is not None and isinstance(input_ids, torch.Tensor):  # one row: its left padding, if any, is dropped
        input_ids = split_rows(model, input_ids.reshape(1, -1), _as_row(attention_mask), max_new_tokens)[0]
    ids = check_input(model, input_ids, max_new_tokens)
    verifier = make_verifier(model, **sampling, seed=seed)
    return run_engine(model, ids, max_new_tokens=max_new_tokens, eos=eos, stop=stop, on_tokens=on_tokens,
                      verifier=verifier, pad_single=pad_single, compile=compile, **settings)


def _as_row(mask: Any) -> Any:
    return mask.reshape(1, -1) if isinstance(mask, torch.Tensor) and mask.dim() == 1 else mask


def run_batch_engine(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, *, max_new_tokens: int,
    verifier_for: Callable[[int], Any], eos: Sequence[int], stop: Callable[[list[int]], bool] | None,
    on_tokens: Callable[[int, list[int]], None] | None, pad_token_id: int | None, compile: bool | None = None,
    **settings: Any,
) -> BatchResult:
    """``generate`` for a left-padded batch [B, T] (also behind ``autolade.hf.lookahead``): rows checked and
    unpadded, settings resolved once, ``verifier_for(b)`` row b's verifier (None: greedy), one batched decode,
    compiled where ``compile`` (None: the stored curves) says (``engine.batch_compiled``)."""
    rows = split_rows(model, input_ids, attention_mask, max_new_tokens)
    verifiers = [verifier_for(b) for b in range(len(rows))]
    run = setup_run(model, **settings, sampled=isinstance(verifiers[0], SamplingVerifier), pad_single=False,
                    memory_default=MEMORY_DEFAULT, compile=compile)
    # the width follows the curve of the steps that will run
    step_cost = stored_cost(model, compiled=run.compiled) if settings.get("price_drafts", True) is True else None
    runner = default_runners().batch(model) if run.compiled else None
    warm_before = runner.log.warmup_total_s if runner is not None else 0.0
    res = run_batch(model, input_ids, attention_mask, rows=rows, run=run, max_new_tokens=max_new_tokens, eos=eos,
                    stop=stop, verifiers=verifiers, on_tokens=on_tokens, pad_token_id=pad_token_id, step_cost=step_cost,
                    runner=runner)
    if runner is None:
        return res
    summary = compile_summary(runner, warm_before)
    return replace(res, stats=[replace(s, compiled=summary) for s in res.stats])


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
    compile: bool | None = None,
) -> GenerateResult:
    """The one engine entry point behind ``generate`` and ``autolade.hf.lookahead``: settings
    resolution (explicit W/N/G or config, else the stored/predicted/built-in settings), the
    runtime policy, the decode and its stats. ``ids`` [1, T] are already checked (``check_input``)."""
    run = setup_run(model, window=window, ngram=ngram, guesses=guesses, config=config, policy=policy, workload=workload,
                    tokenizer=tokenizer, sampled=isinstance(verifier, SamplingVerifier), memory=memory,
                    price_drafts=price_drafts, recycled=recycled, pad_single=pad_single, memory_default=MEMORY_DEFAULT,
                    compile=compile)
    config, policy, memory_note = run.config, run.policy, run.memory_note
    runner = default_runners().get(model, tokens=ids.shape[1] + max_new_tokens, config=config,
                                   buckets=stored_buckets(model)) if run.compiled else None
    warm_before = runner.log.warmup_total_s if runner is not None else 0.0
    clock = DeviceClock(ids.device)  # CUDA: synchronised, so wall_s covers finished work
    t0 = clock.now()
    new, log = lookahead_decode(
        model, ids, config=config, max_new_tokens=max_new_tokens, eos_ids=eos, stop=stop, policy=policy, on_tokens=on_tokens,
        verifier=verifier, memory=run.answers, token_cost=run.token_cost, recycled=run.recycled, pad_single=run.pad_single,
        runner=runner,
    )
    wall = clock.since(t0)
    if run.remember is not None:
        memory_note += "" if (why := run.remember(new)) is None else f"; {why}"
    seq = torch.cat([ids, torch.tensor([new], dtype=ids.dtype, device=ids.device)], dim=1)
    stats = stats_of(log, len(new), wall, config, run.source, policy)
    summary = compile_summary(runner, warm_before) if runner is not None else None
    return GenerateResult(sequences=seq, stats=replace(stats, memory=memory_note, draft_price=run.token_cost,
                                                       padded=run.pad_single, compiled=summary))


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
    check_max_new_tokens(max_new_tokens)
    explicit = explicit_config(config, window, ngram, guesses)
    if (policy is None or isinstance(policy, (str, dict))) and not needs_cost(policy):  # cost-aware: needs the model's curve
        make_policy(policy, explicit or LookaheadConfig())
    make_verifier(None, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, seed=seed)  # no model: its generation_config is not consulted


