"""The decode loop, as a chain of small functions: prefill -> (plan, pack, forward, verify, commit)*.

The engine knows nothing about tokenization: token ids in, token ids out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from autolade.config import LookaheadConfig

from .attention import AttentionPlan, AttentionSwitch
from .batch_cache import BatchKVCache
from .cache import KVCache
from .clock import DeviceClock
from .drafter import Drafter
from .layout import Layout, PackedStep, additive_mask
from .memory import AnswerMemory
from .prompt_lookup import PromptLookupSource
from .recycle import NextTokenTable
from .sources import Candidates
from .steps import Policy, StaticPolicy, StepOutcome, StepPlan
from .verify import GreedyVerifier

PROMPT_OBSERVED = 256  # with token recycling: the prompt's last positions whose next-token logits the prefill keeps


@dataclass
class StepRecord:
    window: int
    guesses: int
    packed: int
    accepted: int
    new_tokens: int
    step_ms: float
    forward_ms: float
    accepted_from: str = "none"  # the draft source of the accepted path (StepOutcome.accepted_from)

    @classmethod
    def of(cls, outcome: StepOutcome, *, new_tokens: int, windowed: bool) -> StepRecord:
        """The log's line for one step (``windowed``: the decode has a lookahead window at all)."""
        plan = outcome.plan
        return cls(window=plan.window if windowed else 0, guesses=plan.guesses, packed=outcome.packed,
                   accepted=outcome.accepted, new_tokens=new_tokens, step_ms=outcome.step_s * 1e3,
                   forward_ms=outcome.forward_s * 1e3, accepted_from=outcome.accepted_from)


@dataclass
class DecodeLog:
    """Per-step history plus totals; ``api`` turns it into ``res.stats``."""

    steps: list[StepRecord] = field(default_factory=list)
    prefill_ms: float = 0.0
    policy_ms: float = 0.0  # in policy.plan() and policy.update(), all steps
    stop_reason: str = ""


class ModelRunner:
    """One model's forward with an explicit cache, mask and positions; detects the kwarg names once."""

    def __init__(self, model: torch.nn.Module, *, attention: AttentionPlan | None = None) -> None:
        self.model = model
        cfg = getattr(model.config, "get_text_config", lambda: model.config)()
        self.num_layers = int(cfg.num_hidden_layers)
        self.vocab = int(cfg.vocab_size)
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        layer_types = list(getattr(cfg, "layer_types", None) or [])
        self.sliding_window: int | None = getattr(cfg, "sliding_window", None) if "sliding_attention" in layer_types else None
        self.mask_types = sorted(set(layer_types)) if self.sliding_window else None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # per step kind: flash-attn for the causal forwards of a flash model, sdpa for packed ones
        self.attention = AttentionSwitch.for_model(model, plan=attention)
        self.loaded_attention = self.attention.current  # restored when the decode ends

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(num_layers=self.num_layers, capacity=capacity)

    def new_batch_cache(self, capacity: int) -> BatchKVCache:
        """The cache a ``BatchDecoder`` on this runner keeps its rows in."""
        return BatchKVCache(num_layers=self.num_layers, capacity=capacity, device=self.device)

    def step_tokens(self, rows: int, width: int) -> int:
        """Tokens a batched step of ``rows`` x ``width`` computes (what the step budget prices): all of them."""
        return rows * width

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, *, mask=None, keep: torch.Tensor | int = 1,
        kind: str = "packed",
    ) -> torch.Tensor:
        """Logits [m, V] for the kept positions (``keep``: an index tensor, or the last n). ``kind``
        ("prefill", "single", "packed") picks the attention implementation (``attention.py``)."""
        return self.rows_forward(ids, positions, cache, mask=mask, keep=keep, kind=kind)[0]

    def rows_forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, *, mask=None,
                     keep: torch.Tensor | int = 1, kind: str = "packed") -> torch.Tensor:
        """Logits [B, m, V] of a batch: ``ids``/``positions`` [B, k], ``cache`` a ``KVCache`` or ``BatchKVCache``."""
        self.attention.use(kind)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=keep,
            **{self.cache_kw: cache.hf},
        )
        return out.logits

    def packed_mask(self, step: PackedStep, prefix_len: int):
        full = additive_mask(step, prefix_len=prefix_len, dtype=self.dtype, device=self.device)
        if self.sliding_window is None:
            return full
        sliding = additive_mask(
            step, prefix_len=prefix_len, dtype=self.dtype, device=self.device, sliding_window=self.sliding_window
        )
        return self.per_layer_type(full, sliding)

    def per_layer_type(self, full: torch.Tensor, sliding: torch.Tensor) -> dict[str, torch.Tensor]:
        """The mask argument of a model with sliding-window layers: one mask per layer type."""
        return {"full_attention": full, "sliding_attention": sliding} | {
            t: sliding if "sliding" in t else full for t in self.mask_types if t not in ("full_attention", "sliding_attention")
        }


def prefill(runner: ModelRunner, cache: KVCache, prompt: torch.Tensor, *, keep: int = 1) -> torch.Tensor:
    """Run the prompt; returns the logits [keep, V] of its last ``keep`` positions (the last row: the
    first new token's). ``prompt``: [1, T]."""
    t = prompt.shape[1]
    positions = torch.arange(t, device=runner.device).unsqueeze(0)  # [1, T]
    return runner.forward(prompt, positions, cache, keep=keep, kind="prefill")  # [keep, V]


def decode_one_token(runner: ModelRunner, cache: KVCache, last: int) -> torch.Tensor:
    """Plain step, the same forward HF generate runs (no custom mask); returns logits [V]."""
    t = cache.length
    ids = torch.tensor([[last]], device=runner.device)
    positions = torch.tensor([[t]], device=runner.device)
    return runner.forward(ids, positions, cache, keep=1, kind="single")[-1]


def lookahead_step(
    runner: ModelRunner, cache: KVCache, layout: Layout, drafter: Drafter, plan: StepPlan, verifier,
    clock: DeviceClock | None = None,
) -> tuple[list[int], StepOutcome]:
    """One packed forward: verify the draft tree, advance the window, keep the accepted KV rows.
    ``clock`` (default: the runner's device) times the step and its forward as finished work."""
    clock = clock or DeviceClock(runner.device)
    t0 = clock.now()
    base = cache.length  # = position of the last accepted token, which is not in the cache yet
    drafted = drafter.tree(plan)
    tree = drafted.tree
    lookup = drafted.found.get(PromptLookupSource.name, Candidates())
    rows = drafter.window_rows(plan)
    if len(tree) == 1 and rows is None:
        tf = clock.now()
        logits = decode_one_token(runner, cache, tree.tokens[0])
        forward_s = clock.since(tf)
        tok = verifier.first(logits, drafter.tokens)
        drafter.observe(tree, logits[None])
        return [tok], StepOutcome(plan=plan, packed=1, window_tokens=0, accepted=0, accepted_from="none", step_s=clock.since(t0), forward_s=forward_s,
                                  match_len=lookup.match_len, shadow=lookup.shadow, emitted=(tok,))
    step = layout.build(tree, rows, t=base)
    mask = runner.packed_mask(step, base)
    tf = clock.now()
    logits = runner.forward(step.input_ids, step.position_ids, cache, mask=mask, keep=step.keep)  # [m, V]
    forward_s = clock.since(tf)  # the clock waits for the device: the forward alone
    path, new = verifier.verify(tree, logits[: step.n_tree], drafter.tokens)
    drafter.observe(tree, logits[: step.n_tree])
    if rows is not None:
        drafter.advance_window(logits[step.n_tree :].argmax(-1).tolist())
    cache.keep(base, [0] + path)
    outcome = StepOutcome(
        plan=plan,
        packed=step.size,
        nodes={name: drafted.nodes(name) for name in drafted.ends},
        window_tokens=step.size - len(tree),
        accepted=len(path),
        accepted_from=drafted.accepted_from(path),
        step_s=clock.since(t0),
        forward_s=forward_s,
        longest_draft=max((len(d) for d in lookup.drafts), default=0),
        match_len=lookup.match_len,
        shadow=lookup.shadow,
        emitted=tuple(new),
    )
    return new, outcome


def commit_tokens(
    tokens: list[int], *, out: list[int], drafter: Drafter, log: DecodeLog, eos: set[int], max_new_tokens: int,
    stop: Callable[[list[int]], bool] | None, on_tokens: Callable[[list[int]], None] | None,
) -> bool:
    """Append ``tokens`` to ``out`` up to a stop (an eos token, kept; ``max_new_tokens``; ``stop(out)``),
    tell the drafter and ``on_tokens``; True when decoding is over (``log.stop_reason`` says why)."""
    done = False
    for i, tok in enumerate(tokens):
        if tok in eos:
            tokens, done, log.stop_reason = tokens[: i + 1], True, "eos"
            break
    room = max_new_tokens - len(out)
    if len(tokens) >= room:
        if len(tokens) > room or not done:
            log.stop_reason = "max_new_tokens"
        tokens, done = tokens[:room], True
    out.extend(tokens)
    drafter.commit(tokens)
    if on_tokens is not None and tokens:
        on_tokens(tokens)
    if not done and stop is not None and stop(out):
        done, log.stop_reason = True, "stop"
    return done


def lookahead_decode(
    model: torch.nn.Module,
    prompt: torch.Tensor,
    *,
    config: LookaheadConfig,
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
    stop: Callable[[list[int]], bool] | None = None,
    policy: Policy | None = None,
    verifier=None,
    on_tokens: Callable[[list[int]], None] | None = None,
    memory: AnswerMemory | None = None,
    token_cost: float | None = None,
    recycled: NextTokenTable | None = None,
    clock: DeviceClock | None = None,
    attention: AttentionPlan | None = None,
    pad_single: bool = False,
    runner: ModelRunner | None = None,
) -> tuple[list[int], DecodeLog]:
    """Greedy lookahead decoding of ``prompt`` [1, T]; returns the new tokens and the step log.

    Stops after ``max_new_tokens``, at the first of ``eos_ids`` (kept, as generate does) or when
    ``stop(new_tokens)`` is true. ``memory``: earlier answers as one more draft source (read only
    here; the caller decides what to remember); ``token_cost``: one more packed token's cost relative to
    a step on this machine, what memory and recycled drafts must earn to be packed (None: the memory's
    fixed floor, recycled drafts up to ``config.recycle``). ``recycled``: the next-token
    table token recycling drafts from and learns into (default: a fresh one when ``config.recycle``), so
    a caller can carry it from one generation to the next. ``clock``: what times the steps (default: the model's device,
    CUDA-synchronised). ``attention``: which implementation each step kind runs (default:
    ``attention.model_plan``); the model's own implementation is restored on the way out.
    ``pad_single``: a step that would pack one token packs a filler draft too (what followed the last
    token before, else the context's most frequent token), for machines whose curve has c(2) < c(1).
    ``runner``: the model's forward (default: a new eager ``ModelRunner``); a ``compiled.CompiledRunner``
    runs the steps compiled on its static cache.
    """
    runner = runner or ModelRunner(model, attention=attention)
    clock = clock or DeviceClock(runner.device)
    policy = policy or StaticPolicy(config)
    verifier = verifier or GreedyVerifier()
    prompt_list = prompt[0].tolist()
    capacity = len(prompt_list) + max_new_tokens + config.packed_size() + 8
    cache = runner.new_cache(capacity)
    layout = Layout(device=runner.device)
    drafter = Drafter(config=config, prompt=prompt_list, memory=memory, token_cost=token_cost,
                      recycled=recycled, pad_single=pad_single)
    eos = set(int(e) for e in eos_ids)
    log = DecodeLog()
    out: list[int] = []

    def commit(tokens: list[int]) -> bool:
        return commit_tokens(tokens, out=out, drafter=drafter, log=log, eos=eos, max_new_tokens=max_new_tokens,
                             stop=stop, on_tokens=on_tokens)

    try:
        with torch.inference_mode():
            t0 = clock.now()
            seen = min(len(prompt_list), PROMPT_OBSERVED) if drafter.recycler is not None else 1
            logits = prefill(runner, cache, prompt.to(runner.device), keep=seen)  # [seen, V]
            first = verifier.first(logits[-1], prompt_list)
            drafter.observe_prompt(prompt_list, logits)  # token recycling starts from the prompt's predictions
            log.prefill_ms = clock.since(t0) * 1e3
            if max_new_tokens <= 0:
                log.stop_reason = "max_new_tokens"
                return out, log
            done = commit([first])
            while not done:
                tp = clock.now()
                plan = policy.plan()
                tp = clock.since(tp)
                new, outcome = lookahead_step(runner, cache, layout, drafter, plan, verifier, clock)
                tu = clock.now()
                policy.update(outcome)
                log.policy_ms += (tp + clock.since(tu)) * 1e3
                log.steps.append(StepRecord.of(outcome, new_tokens=len(new), windowed=drafter.window is not None))
                done = commit(new)
    finally:
        runner.attention.set(runner.loaded_attention)  # a flash model ends as it began
    return out, log
