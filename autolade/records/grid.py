"""The candidates an acceptance table counts: ``Setting`` (a config, its policy, a price) and the grids.

Only settings whose plan depends on acceptance alone are tabulated: static settings (the
``static`` policy) and the ``lookup`` policy (its draft length follows accepted drafts).
``adaptive`` and ``cost-aware`` read step times or the machine's c(k) to plan, so what they
accept is itself hardware-dependent: they are refused here (``Setting`` raises ProfileError).

``default_grid()`` is what ``autolade accept`` measures, ``compact_grid()`` a quick subset of it and
``lookup_grid()`` what replay alone can count. The tables themselves: ``autolade.records.acceptance``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autolade.config import GREEDY, SCALED_LOOKUP, LookaheadConfig
from autolade.errors import ProfileError
from autolade.records.profile import is_number

TABULATED_POLICIES = ("static", "lookup")  # policies whose plan reads acceptance only, never time or cost


# --- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One candidate: a LookaheadConfig plus the runtime policy that drives it, and for a recycling setting
    the price its recycled drafts were cut at."""

    label: str  # short human name, unique within a table, e.g. "W4 N4 G4" or "lookup 16x3 scaled"
    config: LookaheadConfig  # the decoding settings
    policy: str = "static"  # "static" or "lookup" (TABULATED_POLICIES)
    # one packed token's cost relative to a step that recycled drafts were priced at (``generate(price_drafts=)``):
    # a machine with that step curve packs what this row counted; None = not priced (the full ``recycle`` budget)
    token_cost: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label.strip() or len(self.label) > 80:
            raise ProfileError(f"setting label must be a non-empty string of at most 80 characters, got {self.label!r}")
        if not isinstance(self.config, LookaheadConfig):
            raise ProfileError(f"setting {self.label!r}: config must be a LookaheadConfig, got {type(self.config).__name__}")
        if self.policy not in TABULATED_POLICIES:
            raise ProfileError(
                f"setting {self.label!r}: policy {self.policy!r} cannot be tabulated; only "
                f"{', '.join(TABULATED_POLICIES)} plan from acceptance alone (adaptive and cost-aware read "
                "step times or c(k), so what they accept depends on the hardware)"
            )
        if self.token_cost is not None:
            if not is_number(self.token_cost) or not 0.0 <= self.token_cost <= 1.0:
                raise ProfileError(f"setting {self.label!r}: token_cost must be a number in [0, 1] or absent, "
                                   f"got {self.token_cost!r}")
            if not self.config.recycle:
                raise ProfileError(f"setting {self.label!r}: token_cost prices recycled drafts, and this setting "
                                   "recycles none (recycle = 0): drop token_cost")

    @property
    def greedy(self) -> bool:
        return self.config.greedy_only

    @property
    def price(self) -> float:
        """The price the row was counted at: 0 when not priced (a zero price cuts nothing)."""
        return self.token_cost or 0.0

    @property
    def unpriced(self) -> Setting:
        """What runs: the same config and policy, labelled without the price."""
        return self if self.token_cost is None else Setting.of(self.config, policy=self.policy)

    @classmethod
    def of(cls, config: LookaheadConfig, *, policy: str = "static", token_cost: float | None = None) -> Setting:
        """A Setting labelled from its config, e.g. "W4 N4 G4 + lookup 10x2", "W2 N3 G2 + recycle 16",
        "recycle 16, priced 0.025" or "policy lookup: lookup 10x2"."""
        parts = []
        if config.lookahead:
            parts.append(f"W{config.window} N{config.ngram} G{config.guesses}")
        if config.prompt_lookup:
            scaled = " scaled" if config.prompt_lookup_scaled else ""
            parts.append(f"lookup {config.prompt_lookup}x{config.prompt_lookup_drafts}{scaled}")
        if config.recycle:
            parts.append(f"recycle {config.recycle}")
        label = " + ".join(parts) or "greedy"
        label = label if policy == "static" else f"policy {policy}: {label}"
        if token_cost is not None:
            label += f", priced {token_cost:g}"
        return cls(label=label, config=config, policy=policy, token_cost=token_cost)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "settings": self.config.to_dict(), "policy": self.policy} | (
            {"token_cost": self.token_cost} if self.token_cost is not None else {})


GREEDY_SETTING = Setting(label="greedy", config=GREEDY)


# token recycling: alone, on the CPU's best chat window, on the paper's GPU setting, and on the CPU default (scaled
# lookup); each at its full budget (what a machine without a stored curve packs) and cut at each of PRICES
RECYCLE_CONFIGS = (
    LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16),
    LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=0, recycle=16),
    LookaheadConfig(window=15, ngram=5, guesses=15, recycle=32),
    SCALED_LOOKUP.with_(recycle=16),
)
# the packed-token prices recycling is counted at: a GPU's ~0.001 reads the unpriced row and 0.01; 2-core CPUs
# measured 0.027 (SmolLM2) to 0.035 (Qwen2.5 1.5B); prediction interpolates between the two nearest
PRICES = (0.01, 0.025, 0.05)
RECYCLE_SETTINGS = tuple(Setting.of(c, token_cost=p) for c in RECYCLE_CONFIGS for p in (None, *PRICES))


def default_grid() -> tuple[Setting, ...]:
    """The candidates ``autolade accept`` measures: 52 settings, ~10 prompts x 128 tokens each is
    minutes on a CPU for SmolLM2-135M. Greedy; the scaled prompt lookup (the CPU default);
    unscaled prompt lookup, 1-3 drafts of 4/8/10 tokens; the ``lookup`` policy; pure Jacobi windows
    W in {1,2,4,7,10,15}, N in {2..5}, G in {0..W} (a spread, not the full product); and three
    windows with prompt lookup: W4 N4 G4, W7 N2 G7 (one-token guesses: the cheapest window per
    guess, the best timed setting on Qwen2.5-Coder 1.5B on a 2-core CPU) and the paper's GPU setting; and
    ``RECYCLE_SETTINGS`` (four recycling settings, unpriced and at each of ``PRICES``)."""
    grid = [GREEDY_SETTING, Setting.of(SCALED_LOOKUP)]
    for drafts in (1, 2, 3):
        for length in (4, 8, 10):
            grid.append(Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=length, prompt_lookup_drafts=drafts)))
    grid.append(Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=2), policy="lookup"))
    windows = ((1, 3, 1), (1, 5, 1), (2, 3, 2), (2, 4, 2), (4, 2, 4), (4, 3, 4), (4, 4, 0), (4, 4, 2), (4, 4, 4),
               (4, 5, 4), (7, 2, 7), (7, 3, 7), (7, 4, 3), (7, 4, 7), (7, 5, 7), (10, 4, 10), (10, 5, 5), (10, 5, 10),
               (15, 4, 15), (15, 5, 7), (15, 5, 15))
    for w, n, g in windows:
        grid.append(Setting.of(LookaheadConfig(window=w, ngram=n, guesses=g, prompt_lookup=0)))
    grid.append(Setting.of(SCALED_LOOKUP.with_(window=4, ngram=4, guesses=4)))
    grid.append(Setting.of(SCALED_LOOKUP.with_(window=7, ngram=2, guesses=7)))
    grid.append(Setting.of(LookaheadConfig(window=15, ngram=5, guesses=15)))  # paper's W/N/G, default lookup 10x2
    grid += RECYCLE_SETTINGS
    return tuple(grid)


def replayable(setting: Setting) -> bool:
    """Prompt lookup without a window or recycled drafts (they need the model's logits), static or under the
    ``lookup`` policy: replay counts it exactly."""
    return setting.policy in ("static", "lookup") and not setting.config.lookahead and not setting.config.recycle


def compact_grid() -> tuple[Setting, ...]:
    """A 31-setting subset of ``default_grid()`` for a quick table (``autolade accept --grid compact``):
    greedy, the prompt-lookup family, one window per size class up to the paper's W=15 N=5 G=15,
    W7 N2 G7 alone and with scaled prompt lookup, and the four recycling settings at each price."""
    labels = {s.label: s for s in default_grid()}
    keep = [GREEDY_SETTING, Setting.of(SCALED_LOOKUP),
            Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=1)),
            Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=4, prompt_lookup_drafts=3)),
            Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=2), policy="lookup")]
    for w, n, g in ((2, 3, 2), (4, 3, 4), (4, 4, 4), (7, 4, 7), (10, 5, 10), (15, 5, 15), (7, 2, 7)):
        keep.append(Setting.of(LookaheadConfig(window=w, ngram=n, guesses=g, prompt_lookup=0)))
    keep += [Setting.of(SCALED_LOOKUP.with_(window=4, ngram=4, guesses=4)),
             Setting.of(LookaheadConfig(window=15, ngram=5, guesses=15)),
             Setting.of(SCALED_LOOKUP.with_(window=7, ngram=2, guesses=7)), *RECYCLE_SETTINGS]
    missing = [s.label for s in keep if s.label not in labels]
    assert not missing, missing  # every compact setting is one of the full grid's
    return tuple(keep)


def lookup_grid() -> tuple[Setting, ...]:
    """Greedy and the static prompt-lookup settings of ``default_grid()``: what replay alone can count
    (``autolade accept --grid lookup --replay-prompts M``: one greedy run per prompt, no engine run)."""
    return tuple(s for s in default_grid() if replayable(s))
