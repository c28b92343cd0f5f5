"""Distribution-preserving lookahead sampling: the warpers, and a tree verifier after SpecInfer.

``warp`` reproduces what ``model.generate(do_sample=True)`` does to the logits, in transformers'
order (``GenerationMixin._get_logits_processor``): the repetition penalty (a logits processor, so
greedy decoding applies it too), then the sampling warpers temperature, top-k, top-p, min-p. Every
step uses float32 logits, as ``generate`` does.

Why the verifier is exact
-------------------------
Write q for the warped target distribution at a tree node (the model's distribution after the
context plus the path to that node, warped with *that* context: the repetition penalty sees the
tokens accepted along the path). The node's children x_1..x_k are distinct tokens (a prefix tree)
and deterministic drafts: the draft distribution is a point mass, so the speculative-sampling
acceptance probability min(1, q(x)/1) is q(x). The node emits one token:

    r <- q
    for j = 1..k:  accept x_j with probability r(x_j)          (r is normalised)
                   else r(x_j) <- 0 and renormalise r
    if none was accepted: emit a sample from r (the residual)

Claim: the emitted token y has distribution q, whatever the children are. Induction on k. k = 0:
y ~ q. k >= 1: P(y = x_1) = q(x_1). Given x_1 was rejected, the rest of the procedure is the same
procedure with target q' = q without x_1, renormalised (q'(y) = q(y) / (1 - q(x_1)), y != x_1) and
children x_2..x_k, so by induction it emits y with probability q'(y); unconditionally
P(y) = (1 - q(x_1)) q'(y) = q(y). (If q(x_1) = 1 the rejection branch has probability 0.)

If y is a child, the walk moves to it and repeats with the model's row for that node, which is
the model's distribution after context + path + y (the packed forward is exact); otherwise y is the
step's last token and the next step starts from a fresh forward. So every emitted token, given
*everything* that happened before it (earlier tokens, earlier random draws, which drafts were
tried, the policy's choices), has distribution q(. | the tokens before it). By the tower
property the generated sequence has exactly the law of plain autoregressive sampling from the
warped model. The only requirement on the drafts is that they are fixed before this step's random
draws: pool n-grams, prompt-lookup drafts, the Jacobi window (argmax-driven, with its own RNG) and
any runtime policy all qualify, for any W/N/G. Stopping at EOS or ``max_new_tokens`` keeps a prefix
of that sequence, as plain sampling does. "Exactly" is up to floating point: the packed forward's
logits differ from a one-token forward by ~1e-6 in fp32, as in greedy mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from autolade.errors import ConfigError

from .layout import DraftTree

# transformers' defaults for unset generation settings (``GenerationConfig._get_default_generation_params``):
# ``model.generate(do_sample=True)`` samples with top_k=50 unless told otherwise.
HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0}

SUPPORTED = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")


@dataclass(frozen=True)
class SamplingConfig:
    """What the sampler does to the logits; the fields mean what they mean in ``model.generate``.

    The dataclass defaults are "no warping" (plain softmax sampling). ``resolve_sampling`` fills
    unset values the way ``generate`` does: the model's ``generation_config``, then transformers'
    defaults (notably top_k=50).
    """

    temperature: float = 1.0  # > 0; logits are divided by it
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # nucleus: smallest set with probability >= top_p; 1.0 = off
    min_p: float | None = None  # drop tokens below min_p * p(most likely); None/0 = off
    repetition_penalty: float = 1.0  # > 0; 1.0 = off; divides positive / multiplies negative logits of seen tokens
    seed: int | None = None  # None: drawn from torch's global RNG (so torch.manual_seed makes runs repeatable)

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ConfigError(
                f"temperature must be a number > 0, got {t!r}; for greedy decoding use do_sample=False instead of temperature=0"
            )
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 turns it off), got {k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ConfigError(f"top_p must be a number in [0, 1] (1.0 turns it off), got {p!r}")
        m = self.min_p
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0):
            raise ConfigError(f"min_p must be a number in [0, 1] or None (off), got {m!r}")
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0:
            raise ConfigError(f"repetition_penalty must be a number > 0 (1.0 turns it off), got {r!r}")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63):
            raise ConfigError(f"seed must be an integer in 0..2**63-1 or None, got {s!r}")

    @property
    def penalised(self) -> bool:
        return float(self.repetition_penalty) != 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the warpers ------------------------------------------------------------------------------


def apply_repetition_penalty(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' ``RepetitionPenaltyLogitsProcessor``: ``seen`` [..., V] bool marks the context's tokens."""
    penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalised, scores)


def warp(
    logits: torch.Tensor, config: SamplingConfig, seen: torch.Tensor | None = None, *, sample: bool = True
) -> torch.Tensor:
    """Processed scores [..., V] (float32, -inf = removed), exactly as ``generate`` computes them.

    ``seen`` [..., V] bool: the tokens of the context (prompt + generated), for the repetition
    penalty. ``sample=False``: processors only (what greedy ``generate`` applies).
    """
    scores = logits.to(torch.float32)
    if config.penalised:
        if seen is None:
            raise ValueError("repetition_penalty needs the context's tokens (seen=)")
        scores = apply_repetition_penalty(scores, seen, float(config.repetition_penalty))
    if not sample:
        return scores
    if float(config.temperature) != 1.0:
        scores = scores / float(config.temperature)
    if config.top_k:
        k = min(config.top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -math.inf)
    if float(config.top_p) < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - float(config.top_p))
        remove_sorted[..., -1:] = False  # min_tokens_to_keep = 1
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, -math.inf)
    if config.min_p is not None:
        probs = torch.softmax(scores, dim=-1)
        remove = probs < float(config.min_p) * probs.amax(dim=-1, keepdim=True)
        remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
        scores = scores.masked_fill(remove, -math.inf)
    return scores


class _SeenTokens:
    """A [V] bool mask of the tokens in an append-only context, updated incrementally."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self._n = 0
        self._last: int | None = None

    def of(self, context: Sequence[int], vocab: int, device: torch.device) -> torch.Tensor:
        n = len(context)
        stale = (
            self.mask is None
            or self.mask.shape[0] != vocab
            or self.mask.device != device
            or n < self._n
            or (self._n and context[self._n - 1] != self._last)
        )
        if stale:
            self.mask = torch.zeros(vocab, dtype=torch.bool, device=device)
            self._n = 0
        if n > self._n:
            self.mask[_ids(context[self._n :], vocab, device)] = True
            self._n = n
            self._last = context[n - 1]
        return self.mask

    def with_path(self, context: Sequence[int], path_tokens: Sequence[int], vocab: int, device) -> torch.Tensor:
        base = self.of(context, vocab, device)
        if not path_tokens:
            return base
        mask = base.clone()
        mask[_ids(path_tokens, vocab, device)] = True
        return mask


def _ids(tokens: Sequence[int], vocab: int, device) -> torch.Tensor:
    ids = torch.tensor([t for t in tokens if 0 <= t < vocab], dtype=torch.long)  # ids past the lm head: no logit
    return ids.to(device)


# --- verifiers --------------------------------------------------------------------------------


class SamplingVerifier:
    """Multi-candidate speculative sampling over the draft tree (see the module docstring).

    ``generator``: the RNG for every draw; None makes one on the logits' device on first use,
    seeded from ``config.seed`` (or from torch's global RNG when the seed is None). A verifier
    serves one generation: make a new one (or reseed) per call for reproducible runs.
    """

    name = "sampling"

    def __init__(self, config: SamplingConfig, generator: torch.Generator | None = None) -> None:
        if not isinstance(config, SamplingConfig):
            raise ConfigError("SamplingVerifier needs an autolade SamplingConfig")
        self.config = config
        self.generator = generator
        self._seen = _SeenTokens()
        self.drafts_tried = 0  # children tested, over the generation
        self.drafts_accepted = 0

    # the RNG ---------------------------------------------------------------------------------
    def _gen(self, device: torch.device) -> torch.Generator:
        if self.generator is None:
            seed = self.config.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,)))
            self.generator = torch.Generator(device=device).manual_seed(seed)
        return self.generator

    def _draw(self, probs: torch.Tensor) -> int:
        g = self._gen(probs.device)
        return int(torch.multinomial(probs.to(g.device), 1, generator=g))

    # the distribution ------------------------------------------------------------------------
    def _probs(self, logits: torch.Tensor, context: Sequence[int], path_tokens: Sequence[int]) -> torch.Tensor:
        seen = None
        if self.config.penalised:
            seen = self._seen.with_path(context, path_tokens, logits.shape[-1], logits.device)
        return torch.softmax(warp(logits, self.config, seen), dim=-1)

    # the verifier protocol -------------------------------------------------------------------
    def first(self, logits: torch.Tensor, context: list[int]) -> int:
        """A plain sample from the warped distribution, as ``generate`` draws it."""
        return self._draw(self._probs(logits, context, ()))

    def verify(self, tree: DraftTree, logits: torch.Tensor, context: list[int]) -> tuple[list[int], list[int]]:
        node, path, out = 0, [], []
        while True:
            probs = self._probs(logits[node], context, out)
            kids = tree.children[node]
            if not kids:
                out.append(self._draw(probs))
                return path, out
            tok, accepted = self._speculate(probs, list(kids))
            out.append(tok)
            if not accepted:
                return path, out
            node = kids[tok]
            path.append(node)

    def _speculate(self, probs: torch.Tensor, candidates: list[int]) -> tuple[int, bool]:
        """Try the candidates in order (accept x w.p. r(x), else drop it from r); else sample the residual."""
        g = self._gen(probs.device)
        k = len(candidates)
        idx = torch.tensor(candidates, dtype=torch.long, device=probs.device)
        u = torch.rand(k, generator=g, device=g.device).to(probs.device)
        vals = torch.cat([probs[idx], probs.sum().reshape(1), u]).tolist()  # one device sync per node
        q, mass, us = vals[:k], vals[k], vals[k + 1 :]
        for tok, qx, ux in zip(candidates, q, us):
            self.drafts_tried += 1
            if qx > 0.0 and ux * mass < qx:  # accept with probability qx / (mass left)
                self.drafts_accepted += 1
                return tok, True
            mass -= qx
        residual = probs.index_fill(0, idx, 0.0)
        if not bool(residual.sum() > 0):  # every token with mass was a candidate: only float error gets here
            best = max(range(k), key=lambda j: q[j])
            self.drafts_accepted += 1
            return candidates[best], True
        return self._draw(residual), False


class GreedyPenaltyVerifier:
    """Greedy decoding with a repetition penalty: the argmax of the penalised logits at each node,
    which is what ``generate(do_sample=False, repetition_penalty=...)`` picks."""

    name = "greedy+penalty"

    def __init__(self, repetition_penalty: float) -> None:
        self.config = SamplingConfig(repetition_penalty=repetition_penalty)
        self._seen = _SeenTokens()

    def _argmax(self, logits: torch.Tensor, context: Sequence[int], path_tokens: Sequence[int]) -> int:
        seen = self._seen.with_path(context, path_tokens, logits.shape[-1], logits.device)
        return int(warp(logits, self.config, seen, sample=False).argmax())

    def first(self, logits: torch.Tensor, context: list[int]) -> int:
        return self._argmax(logits, context, ())

    def verify(self, tree: DraftTree, logits: torch.Tensor, context: list[int]) -> tuple[list[int], list[int]]:
        node, path, out = 0, [], []
        while True:
            tok = self._argmax(logits[node], context, out)
            out.append(tok)
            child = tree.children[node].get(tok)
            if child is None:
                return path, out
            path.append(child)
            node = child


# --- building the verifier for generate() ----------------------------------------------------

# generate() keywords of model.generate that change the distribution and that autolade does not implement
_UNSUPPORTED_GENERATION = {
    "no_repeat_ngram_size": lambda v: bool(v),
    "encoder_no_repeat_ngram_size": lambda v: bool(v),
    "bad_words_ids": lambda v: v is not None,
    "sequence_bias": lambda v: v is not None,
    "suppress_tokens": lambda v: v is not None,
    "begin_suppress_tokens": lambda v: v is not None,
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "top_h": lambda v: v is not None,
    "exponential_decay_length_penalty": lambda v: v is not None,
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "guidance_scale": lambda v: v is not None and v != 1,
    "watermarking_config": lambda v: v is not None,
    "min_length": lambda v: bool(v),
    "min_new_tokens": lambda v: bool(v),
    "num_beams": lambda v: v is not None and v > 1,
    "num_return_sequences": lambda v: v is not None and v > 1,
}

_SUPPORTED_TEXT = "do_sample, temperature, top_k, top_p, min_p, repetition_penalty, seed"


def reject_unsupported(unsupported: Mapping[str, Any]) -> None:
    """ConfigError for keyword arguments ``generate`` does not take (logits processors, typos)."""
    if not unsupported:
        return
    names = sorted(unsupported)
    processors = [n for n in names if n in _UNSUPPORTED_GENERATION or n in ("logits_processor", "prefix_allowed_tokens_fn")]
    if processors:
        raise ConfigError(
            f"autolade does not support {', '.join(processors)}: the output distribution must stay exactly the "
            f"model's, and only these settings are implemented: {_SUPPORTED_TEXT} "
            "(use model.generate for anything else)"
        )
    raise ConfigError(f"unknown argument(s) {', '.join(names)} to generate; the sampling settings are: {_SUPPORTED_TEXT}")


def _model_generation_config(model: Any) -> Any:
    return getattr(model, "generation_config", None)


def check_generation_config(model: Any) -> None:
    """ConfigError if the model's ``generation_config`` turns on a processor autolade does not implement
    (``model.generate`` would apply it, so ignoring it would change the output)."""
    gc = _model_generation_config(model)
    if gc is None:
        return
    active = []
    for name, is_on in _UNSUPPORTED_GENERATION.items():
        value = getattr(gc, name, None)
        try:
            on = is_on(value)
        except TypeError:
            on = value is not None
        if on:
            active.append(f"{name}={value!r}")
    if active:
        raise ConfigError(
            f"the model's generation_config sets {', '.join(active)}, which autolade does not implement; "
            "clear it (e.g. model.generation_config.no_repeat_ngram_size = 0) or use model.generate"
        )


def resolve_sampling(
    model: Any,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
) -> SamplingConfig:
    """The SamplingConfig ``model.generate(do_sample=True, ...)`` would use: explicit values, else the
    model's ``generation_config``, else transformers' defaults (temperature 1, top_k 50, top_p 1)."""
    gc = _model_generation_config(model)
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
             "repetition_penalty": repetition_penalty}  # fmt: skip
    values: dict[str, Any] = {}
    for name, value in given.items():
        if value is None and gc is not None:
            value = getattr(gc, name, None)
        if value is None:
            value = HF_DEFAULTS[name]
        values[name] = value
    if values["top_k"] is None:
        values["top_k"] = 0
    return SamplingConfig(**values, seed=seed)


def make_verifier(
    model: Any,
    *,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
):
    """The verifier for ``generate``'s sampling keywords; None = the engine's plain greedy verifier.

    Greedy (``do_sample=False``) takes only ``repetition_penalty`` (the argmax of the penalised
    logits, as in ``generate``); the sampling-only settings raise a ConfigError there instead of
    being silently ignored.
    """
    if not isinstance(do_sample, bool):
        raise ConfigError(f"do_sample must be true or false, got {do_sample!r}")
    check_generation_config(model)
    if do_sample:
        return SamplingVerifier(
            resolve_sampling(
                model, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                repetition_penalty=repetition_penalty, seed=seed,
            ),  # fmt: skip
            generator,
        )
    sample_only = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": seed}
    given = sorted(n for n, v in sample_only.items() if v is not None)
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ConfigError(
            f"{', '.join(given)} only {verb} when sampling: pass do_sample=True (--sample on the command line), "
            "or drop it for greedy decoding"
        )
    penalty = repetition_penalty
    if penalty is None:
        gc = _model_generation_config(model)
        penalty = getattr(gc, "repetition_penalty", None) if gc is not None else None
    if penalty is None or float(penalty) == 1.0:
        SamplingConfig(repetition_penalty=1.0 if penalty is None else penalty)  # validate
        return None
    return GreedyPenaltyVerifier(penalty)
