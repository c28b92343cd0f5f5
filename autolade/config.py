"""Decoding settings: validated, frozen, serialisable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from autolade.errors import ConfigError

# Hard bounds: far beyond anything that pays on any hardware; past them a setting is a typo.
MAX_WINDOW = 64
MAX_NGRAM = 16
MAX_GUESSES = 64
MAX_PROMPT_LOOKUP = 64
MAX_RECYCLE = 128


@dataclass(frozen=True)
class LookaheadConfig:
    """W/N/G and the verification branch's sources. ``window=0`` turns the Jacobi window off (N is then unused);
    a window needs ``ngram >= 2``."""

    window: int = 4  # W: Jacobi window columns; small on CPU (a packed step costs ~c(k)), 15 on an A100
    ngram: int = 4  # N: n-gram size; the window holds N-1 levels, pool entries are N-1 tokens after a key
    guesses: int = 4  # G: at most this many pool n-grams verified per step
    prompt_lookup: int = 10  # longest draft taken by suffix-matching the context (what HF PLD drafts); 0 = off
    prompt_lookup_ngram: int = 3  # longest suffix (tokens) matched for prompt lookup; shorter ones tried after
    prompt_lookup_drafts: int = 2  # distinct earlier occurrences drafted per step (they share a prefix tree)
    # draft 2**m tokens after a suffix match of m tokens (capped by prompt_lookup): a longer context match
    # earns a longer draft; off = every match drafts prompt_lookup tokens (what HF prompt lookup does)
    prompt_lookup_scaled: bool = False
    pool_per_key: int | None = None  # pool cap per key token; None = max(guesses, 4), so G can grow at run time
    seed_pool_from_prompt: bool = True  # put the prompt's own n-grams in the pool before decoding
    # token recycling: draft-tree nodes grown from the model's own top-k predictions after each token
    # (engine/recycle.py); 0 = off, so every setting measured before it means what it meant
    recycle: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("seed_pool_from_prompt", "prompt_lookup_scaled"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{f.name} must be true or false, got {value!r}")
                continue
            if value is None and f.name == "pool_per_key":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
            if value < 0:
                symbol = {"window": " (W)", "ngram": " (N)", "guesses": " (G)"}.get(f.name, "")
                raise ConfigError(f"{f.name}{symbol} must be >= 0, got {value}: {_MEANING[f.name]}")
        _bound("window", self.window, MAX_WINDOW)
        _bound("ngram", self.ngram, MAX_NGRAM)
        _bound("guesses", self.guesses, MAX_GUESSES)
        _bound("prompt_lookup", self.prompt_lookup, MAX_PROMPT_LOOKUP)
        _bound("recycle", self.recycle, MAX_RECYCLE)
        _bound("prompt_lookup_ngram", self.prompt_lookup_ngram, 8)
        _bound("prompt_lookup_drafts", self.prompt_lookup_drafts, 8)
        if self.pool_per_key is not None:
            _bound("pool_per_key", self.pool_per_key, 4 * MAX_GUESSES)
        if self.window > 0 and self.ngram < 2:
            raise ConfigError(f"ngram={self.ngram} with window={self.window}: lookahead needs N >= 2 (the window holds "
                              "N-1 levels and the pool n-grams of N tokens); use ngram >= 2, or window=0 to turn the "
                              "Jacobi window off")
        if self.prompt_lookup > 0 and self.prompt_lookup_ngram < 1:
            raise ConfigError("prompt_lookup_ngram must be >= 1 when prompt_lookup > 0 (or set prompt_lookup=0)")

    @property
    def lookahead(self) -> bool:
        """Whether the Jacobi window runs at all."""
        return self.window > 0 and self.ngram >= 2

    @property
    def greedy_only(self) -> bool:
        """No drafting of any kind: every step is one token (plain greedy through autolade's loop)."""
        return not self.lookahead and self.prompt_lookup == 0 and self.recycle == 0

    @property
    def levels(self) -> int:
        """N-1: the window's depth and the length of a pool n-gram after its key."""
        return max(self.ngram - 1, 0)

    @property
    def pool_cap(self) -> int:
        return self.pool_per_key if self.pool_per_key is not None else max(self.guesses, 4)

    def packed_size(self) -> int:
        """Upper bound on tokens in one packed step: 1 + (N-1)W + G(N-1) + PLD drafts + recycled nodes."""
        if self.greedy_only:
            return 1
        window = self.levels * self.window if self.lookahead else 0
        pool = self.guesses * self.levels if self.lookahead else 0
        return 1 + window + pool + self.prompt_lookup * self.prompt_lookup_drafts + self.recycle

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LookaheadConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"decoding settings must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown decoding setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def with_(self, **changes: Any) -> LookaheadConfig:
        return replace(self, **changes)



_MEANING = {  # what each integer setting is, for the message that refuses a negative one
    "window": "W is the Jacobi window's columns; window=0 turns the window off (plain greedy without other drafts)",
    "ngram": "N is the n-gram size; lookahead needs N >= 2 (or window=0)",
    "guesses": "G is how many pool n-grams are verified per step; guesses=0 verifies none",
    "prompt_lookup": "the longest prompt-lookup draft, in tokens; prompt_lookup=0 turns prompt lookup off",
    "prompt_lookup_ngram": "the longest context suffix matched for prompt lookup, in tokens",
    "prompt_lookup_drafts": "how many earlier occurrences prompt lookup drafts per step",
    "pool_per_key": "the pool's n-grams kept per key token; None sizes it from guesses",
    "recycle": "the draft-tree nodes grown by token recycling; recycle=0 turns it off",
}


def _bound(name: str, value: int, upper: int) -> None:
    if value > upper:
        raise ConfigError(f"{name}={value} is beyond the supported maximum {upper}; pick a value in 0..{upper}")


GREEDY = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)  # plain greedy through the same loop
# three prompt-lookup drafts of at most 2**m tokens after an m-token suffix match (m <= 4), no window
SCALED_LOOKUP = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=3, prompt_lookup_scaled=True,
                                prompt_lookup_ngram=4)


# --- setting specs (``--config W,N,G[,LOOKUP][,key=value...]``) ---------------------------------

_SPEC_ALIASES = {  # short keys accepted in a spec -> LookaheadConfig field
    "drafts": "prompt_lookup_drafts",
    "lookup_ngram": "prompt_lookup_ngram",
    "lookup": "prompt_lookup",
    "pool": "pool_per_key",
    "seed": "seed_pool_from_prompt",
    "scaled": "prompt_lookup_scaled",
}


def parse_config(spec: str) -> LookaheadConfig:
    """``"W,N,G[,LOOKUP][,key=value...]"`` -> LookaheadConfig, e.g. ``0,0,0,0`` (plain greedy
    through autolade's loop), ``0,4,0,10`` (prompt lookup only), ``4,4,4,10,drafts=1``."""
    config, policy = parse_method(spec)
    if policy is not None:
        raise ConfigError(f"--config {spec!r}: policy= is only accepted where a policy can run (parse_method)")
    return config


def parse_flag(spec: str, key: str, value: str) -> bool:
    """A ``key=value`` item of a method spec that is true or false (1/0 too); a ConfigError otherwise."""
    value = value.strip().lower()
    if value not in ("0", "1", "true", "false"):
        raise ConfigError(f"--config {spec!r}: {key} must be true or false")
    return value in ("1", "true")


def spec_keys(also: Sequence[str] = ()) -> list[str]:
    """The ``key=value`` keys a setting spec takes: every LookaheadConfig field, the short aliases,
    ``policy``, and ``also`` (keys a caller takes out of the spec before parsing it)."""
    return sorted({f.name for f in fields(LookaheadConfig)} | set(_SPEC_ALIASES) | {"policy", *also})


def parse_method(spec: str, *, also: Sequence[str] = ()) -> tuple[LookaheadConfig, str | None]:
    """Like ``parse_config``, plus an optional ``policy=NAME`` item (a name or a preset in
    ``policies/``, e.g. ``4,4,4,10,policy=adaptive``): (config, policy name or None). ``also``: keys
    the caller takes out of the spec first, named with the valid keys when a key is unknown."""
    known = {f.name for f in fields(LookaheadConfig)}
    policy = None
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    positional = [p for p in parts if "=" not in p]
    named = [p for p in parts if "=" in p]
    if not 3 <= len(positional) <= 4 or parts[: len(positional)] != positional:
        raise ConfigError(f"--config {spec!r}: expected W,N,G[,LOOKUP][,key=value...], e.g. 4,4,4,10 or 0,0,0,0")
    try:
        values = [int(p) for p in positional]
    except ValueError:
        raise ConfigError(f"--config {spec!r}: W, N, G and LOOKUP must be integers") from None
    kwargs: dict[str, Any] = dict(zip(("window", "ngram", "guesses", "prompt_lookup"), values))
    for item in named:
        key, _, value = item.partition("=")
        key = _SPEC_ALIASES.get(key.strip(), key.strip())
        value = value.strip()
        if key not in known and key != "policy":
            raise ConfigError(f"--config {spec!r}: unknown key {item.partition('=')[0].strip()!r}; "
                              f"valid keys: {', '.join(spec_keys(also))}")
        if key == "policy":
            if not value:
                raise ConfigError(f"--config {spec!r}: policy= needs a name")
            policy = value
            continue
        if key in ("seed_pool_from_prompt", "prompt_lookup_scaled"):
            kwargs[key] = parse_flag(spec, key, value)
            continue
        try:
            kwargs[key] = None if value.lower() == "none" else int(value)
        except ValueError:
            raise ConfigError(f"--config {spec!r}: {key} must be an integer") from None
    try:
        return LookaheadConfig(**kwargs), policy
    except TypeError as exc:
        raise ConfigError(f"--config {spec!r}: {exc}") from None
