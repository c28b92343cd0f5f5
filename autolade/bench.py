"""Side-by-side benchmark: HF greedy vs HF prompt lookup vs autolade, in one process.

For every prompt, every method runs once, in an order that rotates from prompt to prompt
(so that drift of the machine, e.g. another process starting, spreads over all methods).
Each method is timed around its whole call (prefill included) with ``perf_counter``. The
first prompt is run ``warmup`` times by every method first, untimed.

Exactness: every output is compared token for token with HF greedy's. At the first
divergence the report keeps the index, both tokens, and the REFERENCE's logits there:
the top-2 gap (``gap_top2``) and how far the diverging token was below the reference
token (``gap_chosen``), from HF greedy's own scores (``output_logits=True``, recomputed
in an untimed call only for prompts where something diverged).

Speedups are throughput ratios: (method tokens / method time) / (greedy tokens / greedy
time), per prompt set (``speedup``, from the sums) and the median of the per-prompt ratios
(``median_speedup``). When the outputs are exact they have the same length, and the set
ratio is exactly sum(greedy time) / sum(method time) (also kept, as ``time_ratio``); a
diverged output can stop at another length, which a bare time ratio would reward.

    report = run_benchmark(model=model, tokenizer=tok, prompts={"chat": load_workload("chat", limit=10)},
                           configs=default_configs())
    print(format_table(report)); write_report(report, "out/bench")   # out/bench.json, out/bench.png
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config import LookaheadConfig
from .errors import ConfigError, InputError, WorkloadError
from .policies import NO_CURVE, make_policy, needs_cost
from .prompts import Prompt, encode_prompt, load_workload, split_workload

HF_GREEDY = "hf-greedy"
HF_PLD = "hf-pld"
BASELINES = {"greedy": HF_GREEDY, "pld": HF_PLD}
PLD_TOKENS = 10  # prompt_lookup_num_tokens, as in the paper's and transformers' examples
COPY_SET = "copy"
COPY_INSTRUCTIONS = (
    "Repeat the following text exactly:\n\n",
    "Fix the typo in this code and print the whole code again:\n\n",
)


# --- what runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One thing to time: an HF baseline or an autolade config (with an optional policy factory)."""

    name: str
    kind: str  # "hf-greedy", "hf-pld" or "autolade"
    config: LookaheadConfig | None = None
    # A policy name / preset / dict (autolade.policies.make_policy builds a fresh one per run), or a
    # factory called once per run: factory(config) or factory() -> Policy. None = static.
    policy: str | dict | Callable[..., Any] | None = None

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == HF_PLD:
            out["prompt_lookup_num_tokens"] = PLD_TOKENS
        if self.config is not None:
            out["config"] = self.config.to_dict()
        if isinstance(self.policy, (str, dict)):
            out["policy"] = self.policy
        elif self.policy is not None:
            out["policy"] = getattr(self.policy, "__name__", type(self.policy).__name__)
        return out

    def make_policy(self, cost: Callable[[float], float] | None = None):
        """A fresh policy for one run; ``cost`` (this machine's c(k)) for the cost-aware policy, looked
        up once per benchmark so that the store lookup stays out of the timed runs."""
        if isinstance(self.policy, (str, dict)) and cost is not None and needs_cost(self.policy):
            return make_policy(self.policy, self.config, cost=cost)
        if self.policy is None or isinstance(self.policy, (str, dict)):
            return self.policy  # generate() builds a fresh policy from a name or dict
        try:
            return self.policy(self.config)
        except TypeError:
            return self.policy()


@dataclass(frozen=True)
class BenchPrompt:
    """A prompt already as token ids (the tokenizer-free path)."""

    id: str
    input_ids: tuple[int, ...]
    kind: str = "chat"
    text: str | None = None


def config_label(config: LookaheadConfig, policy: Any = None) -> str:
    """Short table name: ``al greedy``, ``al lookup10``, ``al W4N4G4+L10``, ``... adaptive``; a lookup
    length reads ``16x3s`` for 3 drafts (when not the default 2) scaled by match length."""
    if config.greedy_only:
        return "al greedy"
    lookup = ""
    if config.prompt_lookup:
        lookup = str(config.prompt_lookup)
        lookup += f"x{config.prompt_lookup_drafts}" if config.prompt_lookup_drafts != 2 else ""
        lookup += "s" if config.prompt_lookup_scaled else ""
    if not config.lookahead:
        label = f"al lookup{lookup}"
    else:
        label = f"al W{config.window}N{config.ngram}G{config.guesses}"
        label += f"+L{lookup}" if lookup else ""
    if isinstance(policy, str) and policy != "static":
        label += f" {Path(policy).stem}"
    elif isinstance(policy, dict):
        label += f" {policy.get('name', 'policy')}"
    return label


_SPEC_ALIASES = {
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


def parse_method(spec: str) -> tuple[LookaheadConfig, str | None]:
    """Like ``parse_config``, plus an optional ``policy=NAME`` item (a name or a preset in
    ``policies/``, e.g. ``4,4,4,10,policy=adaptive``): (config, policy name or None)."""
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
        if key == "policy":
            if not value:
                raise ConfigError(f"--config {spec!r}: policy= needs a name")
            policy = value
            continue
        if key in ("seed_pool_from_prompt", "prompt_lookup_scaled"):
            if value.lower() not in ("0", "1", "true", "false"):
                raise ConfigError(f"--config {spec!r}: {key} must be true or false")
            kwargs[key] = value.lower() in ("1", "true")
            continue
        try:
            kwargs[key] = None if value.lower() == "none" else int(value)
        except ValueError:
            raise ConfigError(f"--config {spec!r}: {key} must be an integer") from None
    try:
        return LookaheadConfig(**kwargs), policy
    except TypeError as exc:
        raise ConfigError(f"--config {spec!r}: {exc}") from None


DEFAULT_CONFIG_SPECS = ("0,0,0,0", "0,4,0,10", "2,3,2,10", "4,4,4,10")


def default_configs() -> dict[str, LookaheadConfig]:
    """Plain greedy through autolade's loop, prompt lookup only, and two small lookahead settings."""
    configs = [parse_config(s) for s in DEFAULT_CONFIG_SPECS]
    return {config_label(c): c for c in configs}


def _methods(configs: Mapping[str, Any], baselines: Sequence[str]) -> list[Method]:
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ConfigError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    if "greedy" not in baselines:
        raise ConfigError("baselines must include 'greedy': it is the reference every ratio and exactness check uses")
    methods = [Method(BASELINES[b], BASELINES[b]) for b in dict.fromkeys(baselines)]
    for name, value in configs.items():
        if isinstance(value, Method):
            method = Method(str(name), "autolade", value.config, value.policy)
        elif isinstance(value, LookaheadConfig):
            method = Method(str(name), "autolade", value)
        elif isinstance(value, Mapping) and isinstance(value.get("config"), LookaheadConfig):
            method = Method(str(name), "autolade", value["config"], value.get("policy"))
        elif isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], LookaheadConfig):  # (config, policy)
            method = Method(str(name), "autolade", value[0], value[1])
        else:
            raise ConfigError(
                f"config {name!r}: expected a LookaheadConfig, (config, policy_factory) or "
                f"{{'config': ..., 'policy': ...}}, got {type(value).__name__}"
            )
        if method.policy is not None and not isinstance(method.policy, (str, dict)) and not callable(method.policy):
            raise ConfigError(
                f"config {name!r}: policy must be a name, a dict or a factory (callable), so each run starts fresh"
            )
        if isinstance(method.policy, (str, dict)):
            # fail now, not after minutes of benchmarking (a stand-in c(k): the curve is checked at run time)
            make_policy(method.policy, method.config, cost=lambda k: 1.0)
        methods.append(method)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ConfigError(f"method names must be unique, got {names}")
    return methods


# --- prompt sets -------------------------------------------------------------------------------


def copy_workload(*, limit: int | None = None) -> list[Prompt]:
    """Copy-heavy chat prompts built from HumanEval: "repeat exactly" and "fix the typo and
    print the whole code again" (a one-letter swap is put in), alternating."""
    prompts = []
    for i, p in enumerate(load_workload("code", limit=limit)):
        body = p.text if i % 2 == 0 else _typo(p.text)
        prompts.append(Prompt(f"copy/{p.id}", COPY_INSTRUCTIONS[i % 2] + body, "humaneval-copy", "chat"))
    return prompts


def _typo(text: str) -> str:
    """Swap two letters in one word of 6+ letters (the middle such word): deterministic."""
    words = list(re.finditer(r"\b[a-z]{6,}\b", text))
    if not words:
        return text
    m = words[len(words) // 2]
    w = m.group()
    return text[: m.start()] + w[0] + w[2] + w[1] + w[3:] + text[m.end() :]


def load_sets(names: Sequence[str], *, limit: int | None = None, heldout: bool = False) -> dict[str, list[Prompt]]:
    """Named prompt sets: ``chat``, ``code``, ``copy`` or workload files (see autolade.prompts).
    ``heldout``: only the prompts ``autolade tune`` holds out (its default seed), never tuned on."""
    sets: dict[str, list[Prompt]] = {}
    for name in names:
        name = name.strip()
        if not name:
            continue
        prompts = copy_workload() if name == COPY_SET else load_workload(name)
        if heldout:
            prompts = split_workload(prompts)[1]
        sets[name] = prompts[:limit] if limit is not None else prompts
    if not sets:
        raise WorkloadError("no prompt sets given; e.g. --sets chat,code")
    return sets


def _as_prompts(prompts: Any) -> dict[str, list[Any]]:
    if isinstance(prompts, Mapping):
        return {str(k): list(v) for k, v in prompts.items()}
    grouped: dict[str, list[Any]] = {}
    for p in prompts:
        grouped.setdefault(getattr(p, "source", None) or "prompts", []).append(p)
    return grouped


def _encode(item: Any, tokenizer: Any, index: int) -> tuple[str, torch.Tensor, str | None]:
    """(id, ids [1, T], text) for a Prompt, BenchPrompt, LongTensor or list of ints."""
    if isinstance(item, Prompt):
        if tokenizer is None:
            raise InputError("text prompts need a tokenizer; pass token ids (BenchPrompt) to run without one")
        return item.id, encode_prompt(tokenizer, item.text, kind=item.kind), item.text
    if isinstance(item, BenchPrompt):
        return item.id, torch.tensor([list(item.input_ids)], dtype=torch.long), item.text
    if isinstance(item, torch.Tensor):
        ids = item if item.dim() == 2 else item.unsqueeze(0)
        return f"p{index}", ids.to(torch.long), None
    if isinstance(item, (list, tuple)) and all(isinstance(t, int) for t in item):
        return f"p{index}", torch.tensor([list(item)], dtype=torch.long), None
    raise InputError(f"cannot benchmark a prompt of type {type(item).__name__}")


# --- results -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One (prompt, method) measurement."""

    set: str
    prompt: str
    method: str
    order: int  # position in this prompt's rotation (0 = ran first)
    prompt_tokens: int
    new_tokens: int
    time_s: float
    tokens_per_s: float
    speedup_vs_greedy: float | None = None  # throughput ratio to HF greedy on the same prompt
    speedup_vs_pld: float | None = None
    exact: bool | None = None  # same tokens as HF greedy (None for HF greedy itself)
    diverged_at: int | None = None  # index in the new tokens of the first difference
    ref_token: int | None = None
    got_token: int | None = None  # None: the output ended there (or went on where the reference ended)
    gap_top2: float | None = None  # reference logits at the divergence: top-1 minus top-2
    gap_chosen: float | None = None  # reference logits: logit(ref token) - logit(got token)
    context: str | None = None  # decoded text before the divergence, and the two tokens
    steps: int | None = None  # forwards after the prefill (HF methods: counted by a forward hook)
    tokens_per_step: float | None = None  # (new tokens - 1) / steps: the first token comes from the prefill
    packed_per_step: float | None = None  # tokens fed to a step's forward, mean
    prefill_ms: float | None = None  # this and the next two: autolade only (its own timers)
    forward_ms: float | None = None
    overhead_ms: float | None = None
    policy_ms: float | None = None  # the part of overhead_ms spent in the runtime policy
    stop_reason: str | None = None
    tokens: list[int] | None = None  # kept for HF greedy and for diverged outputs
    times_s: list[float] | None = None  # every timed repeat (time_s is the fastest)
    cpu_share: float | None = None  # CPU time / (wall x threads) of the kept run; low = other processes took CPU
    per_step: dict[str, list] | None = None


@dataclass
class Summary:
    """One (set, method) row of the table."""

    set: str
    method: str
    prompts: int
    tokens: int
    time_s: float
    tokens_per_s: float
    speedup: float | None  # (sum tokens / sum time) vs HF greedy's; = time_ratio when exact
    time_ratio: float | None  # sum(greedy time) / sum(method time)
    median_speedup: float | None
    speedup_vs_pld: float | None
    median_speedup_vs_pld: float | None
    exact: int | None
    diverged: int | None
    max_gap: float | None  # the largest top-2 gap at a first divergence (None: no divergence)
    tokens_per_step: float | None = None
    packed_per_step: float | None = None
    steps: int | None = None
    prefill_ms: float | None = None
    forward_ms: float | None = None
    overhead_ms: float | None = None
    policy_ms: float | None = None
    other_ms: float | None = None  # wall - prefill - step forwards - step overhead (API, commits, stops)
    cpu_share: float | None = None  # time-weighted CPU share of this method's runs (1.0 = had the cores)

    @property
    def forward_ms_per_step(self) -> float | None:
        return self.forward_ms / self.steps if self.steps and self.forward_ms is not None else None

    @property
    def overhead_ms_per_step(self) -> float | None:
        return self.overhead_ms / self.steps if self.steps and self.overhead_ms is not None else None

    @property
    def overhead_share(self) -> float | None:
        if not self.steps or self.forward_ms is None or not self.forward_ms + (self.overhead_ms or 0):
            return None
        return self.overhead_ms / (self.forward_ms + self.overhead_ms)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            forward_ms_per_step=self.forward_ms_per_step,
            overhead_ms_per_step=self.overhead_ms_per_step,
            overhead_share=self.overhead_share,
        )
        return out


@dataclass
class BenchReport:
    methods: list[Method]
    sets: dict[str, list[str]]  # set -> prompt ids, in run order
    runs: list[Run]
    summaries: list[Summary]
    environment: dict[str, Any]
    settings: dict[str, Any]
    warmup_runs: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, set_name: str, method: str) -> Summary:
        for s in self.summaries:
            if s.set == set_name and s.method == method:
                return s
        raise KeyError((set_name, method))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "BenchReport":
        """Back from ``to_dict()`` / the JSON file (to redraw the chart or the tables)."""
        if not isinstance(data, dict) or data.get("format") != "autolade-bench/1":
            raise WorkloadError("not an autolade benchmark JSON (format autolade-bench/1)")
        methods = [
            Method(m["name"], m["kind"], LookaheadConfig.from_dict(m["config"]) if m.get("config") else None, m.get("policy"))
            for m in data["methods"]
        ]
        summary_fields = {f for f in Summary.__dataclass_fields__}
        summaries = [Summary(**{k: v for k, v in s.items() if k in summary_fields}) for s in data["summaries"]]
        run_fields = set(Run.__dataclass_fields__)
        runs = [Run(**{k: v for k, v in r.items() if k in run_fields}) for r in data["runs"]]
        return cls(methods, data["sets"], runs, summaries, data["environment"], data["settings"], data.get("warmup_runs", []))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "autolade-bench/1",
            "environment": self.environment,
            "settings": self.settings,
            "methods": [m.spec() for m in self.methods],
            "sets": self.sets,
            "summaries": [s.to_dict() for s in self.summaries],
            "runs": [asdict(r) for r in self.runs],
            "warmup_runs": self.warmup_runs,
        }


# --- running -----------------------------------------------------------------------------------


def run_benchmark(
    *,
    model: torch.nn.Module,
    tokenizer: Any = None,
    prompts: Mapping[str, Sequence[Any]] | Sequence[Any],
    configs: Mapping[str, Any] | None = None,
    max_new_tokens: int = 128,
    baselines: Sequence[str] = ("greedy", "pld"),
    warmup: int = 1,
    on_result: Callable[[Run], None] | None = None,
    command: str | None = None,
    keep_per_step: bool = True,
    repeats: int = 1,
    max_seconds: float | None = None,
    on_prompt: Callable[["BenchReport"], None] | None = None,
) -> BenchReport:
    """Time HF greedy, HF prompt lookup and each autolade config on every prompt; see the module doc.

    ``prompts``: ``{set name: [Prompt | BenchPrompt | LongTensor | list[int]]}``, or a flat list
    (grouped by ``Prompt.source``). ``configs``: ``{name: LookaheadConfig | (config, policy_factory)
    | {"config", "policy"}}``; defaults to ``default_configs()``. ``repeats`` > 1 runs every
    method that many times per prompt (each round in its own rotated order) and keeps the
    fastest time: robust to a machine that other processes disturb now and then.
    ``max_seconds``: start no new prompt once this much wall time has passed (the report says
    so in ``settings["stopped_early"]``). ``on_prompt(report so far)`` after every prompt, e.g.
    to checkpoint the JSON so that a killed run still leaves its results.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be an integer >= 0, got {warmup!r}")
    methods = _methods(default_configs() if configs is None else configs, baselines)
    grouped = _as_prompts(prompts)
    if not any(grouped.values()):
        raise WorkloadError("no prompts to benchmark")
    model.eval()
    device = next(model.parameters()).device
    cost = None
    if any(isinstance(m.policy, (str, dict)) and needs_cost(m.policy) for m in methods):
        from .settings import stored_cost

        cost = stored_cost(model)
        if cost is None:
            raise ConfigError(NO_CURVE)
    env = environment(model, command=command)
    loads: list[float] = []
    runs: list[Run] = []
    warm: list[dict[str, Any]] = []
    sets: dict[str, list[str]] = {}
    index = 0
    started = time.perf_counter()
    stopped_early: str | None = None
    settings = {
        "max_new_tokens": max_new_tokens,
        "baselines": list(dict.fromkeys(baselines)),
        "warmup": warmup,
        "repeats": repeats,
        "max_seconds": max_seconds,
        "stopped_early": None,
        "timing": "perf_counter around the whole call (prefill included); with repeats, the fastest",
        "cpu_share": "process CPU time / (wall time x torch threads) of a run: below ~0.9, other processes took CPU",
        "pld_tokens": PLD_TOKENS,
        "order": "rotating per prompt: prompt i starts at method i mod M",
        "speedup": "throughput ratio (sum tokens / sum time) vs HF greedy; median over prompts too",
    }

    def build() -> BenchReport:
        done_sets = {k: v for k, v in sets.items() if v}
        env["load_avg_1m"] = {
            "start": loads[0] if loads else None,
            "end": loads[-1] if loads else None,
            "max": max((x for x in loads if x is not None), default=None),
            "samples": loads,
        }
        summaries = [_summarise(set_name, m, runs) for set_name in done_sets for m in methods]
        return BenchReport(methods, done_sets, runs, summaries, env, dict(settings), warm)

    with torch.inference_mode():
        for set_name, items in grouped.items():
            if stopped_early:
                break
            sets[set_name] = []
            for item in items:
                if max_seconds is not None and index > 0 and time.perf_counter() - started > max_seconds:
                    stopped_early = f"time budget of {max_seconds:.0f} s reached after {index} prompt(s)"
                    settings["stopped_early"] = stopped_early
                    break
                pid, ids, _text = _encode(item, tokenizer, index)
                ids = ids.to(device)
                sets[set_name].append(pid)
                if index == 0:
                    for _ in range(warmup):
                        for m in methods:
                            tokens, secs, _ = _run_method(model, m, ids, max_new_tokens, cost)
                            warm.append({"method": m.name, "prompt": pid, "time_s": secs, "new_tokens": len(tokens)})
                loads.append(_load_avg())
                k = index % len(methods)
                order = methods[k:] + methods[:k]
                outputs: dict[str, tuple[list[int], float, Any]] = {}
                times: dict[str, list[float]] = {m.name: [] for m in methods}
                shares: dict[str, float | None] = {}
                threads = max(torch.get_num_threads(), 1)
                for rnd in range(repeats):
                    j = rnd % len(order)
                    for m in order[j:] + order[:j]:
                        cpu0 = time.process_time()
                        result = _run_method(model, m, ids, max_new_tokens, cost)
                        cpu = time.process_time() - cpu0
                        times[m.name].append(result[1])
                        if m.name not in outputs or result[1] < outputs[m.name][1]:
                            outputs[m.name] = result
                            shares[m.name] = round(cpu / (result[1] * threads), 3) if device.type == "cpu" else None
                prompt_runs = _score_prompt(
                    model, tokenizer, set_name, pid, ids, methods, order, outputs, max_new_tokens, keep_per_step
                )
                for r in prompt_runs:
                    r.times_s = times[r.method]
                    r.cpu_share = shares[r.method]
                    runs.append(r)
                    if on_result is not None:
                        on_result(r)
                index += 1
                if on_prompt is not None:
                    on_prompt(build())
    loads.append(_load_avg())
    return build()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hf_kwargs(model: torch.nn.Module, ids: torch.Tensor, max_new_tokens: int) -> dict[str, Any]:
    gen = getattr(model, "generation_config", None)
    pad = getattr(gen, "pad_token_id", None)
    if pad is None:
        eos = getattr(gen, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    kwargs: dict[str, Any] = {
        "attention_mask": torch.ones_like(ids),
        "do_sample": False,
        "max_new_tokens": max_new_tokens,
    }
    if pad is not None:
        kwargs["pad_token_id"] = pad
    return kwargs


@dataclass(frozen=True)
class HFSteps:
    """What an HF generate did, counted by a forward pre-hook: the tokens fed to each forward."""

    packed: list[int]  # first entry: the prefill

    @property
    def steps(self) -> int:
        return max(len(self.packed) - 1, 0)


def _count_forwards(model) -> tuple[list[int], Any]:
    lengths: list[int] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        lengths.append(int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else 0)

    return lengths, model.register_forward_pre_hook(hook, with_kwargs=True)


def _run_method(model, method: Method, ids: torch.Tensor, max_new_tokens: int,
                cost: Callable[[float], float] | None = None) -> tuple[list[int], float, Any]:
    """(new tokens, seconds, autolade GenerateStats or HFSteps)."""
    device = ids.device
    if method.kind == "autolade":
        from .api import generate

        policy = method.make_policy(cost)
        _sync(device)
        t0 = time.perf_counter()
        res = generate(model, ids, max_new_tokens=max_new_tokens, config=method.config, policy=policy)
        _sync(device)
        secs = time.perf_counter() - t0
        return res.sequences[0, ids.shape[1] :].tolist(), secs, res.stats
    kwargs = _hf_kwargs(model, ids, max_new_tokens)
    if method.kind == HF_PLD:
        kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
    lengths, handle = _count_forwards(model)  # one Python call per forward: noise next to a model forward
    try:
        _sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, **kwargs)
        _sync(device)
        secs = time.perf_counter() - t0
    finally:
        handle.remove()
    return out[0, ids.shape[1] :].tolist(), secs, HFSteps(lengths)


def _reference_logits(model, ids: torch.Tensor, max_new_tokens: int, reference: list[int]) -> torch.Tensor | None:
    """HF greedy's own logits [new, V] (untimed rerun with output_logits); None if the rerun differs."""
    kwargs = _hf_kwargs(model, ids, max_new_tokens)
    out = model.generate(ids, output_logits=True, return_dict_in_generate=True, **kwargs)
    again = out.sequences[0, ids.shape[1] :].tolist()
    if again != reference:
        return None
    return torch.cat([x.float() for x in out.logits], dim=0)  # [new, V]


def _first_divergence(ref: list[int], got: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def _score_prompt(model, tokenizer, set_name, pid, ids, methods, order, outputs, max_new_tokens, keep_per_step) -> list[Run]:
    ref, ref_s, _ = outputs[HF_GREEDY]
    ref_tps = len(ref) / ref_s if ref_s > 0 else 0.0
    pld = outputs.get(HF_PLD)
    pld_tps = len(pld[0]) / pld[1] if pld and pld[1] > 0 else None
    logits: list[torch.Tensor | None] = []  # lazily: [] = not computed yet
    rows = []
    for m in methods:
        tokens, secs, stats = outputs[m.name]
        tps = len(tokens) / secs if secs > 0 else 0.0
        run = Run(
            set=set_name,
            prompt=pid,
            method=m.name,
            order=order.index(m),
            prompt_tokens=int(ids.shape[1]),
            new_tokens=len(tokens),
            time_s=secs,
            tokens_per_s=tps,
            speedup_vs_greedy=tps / ref_tps if ref_tps else None,
            speedup_vs_pld=tps / pld_tps if pld_tps else None,
        )
        if m.kind == HF_GREEDY:
            run.tokens = tokens
        else:
            d = _first_divergence(ref, tokens)
            run.exact = d is None
            if d is not None:
                run.diverged_at = d
                run.ref_token = ref[d] if d < len(ref) else None
                run.got_token = tokens[d] if d < len(tokens) else None
                run.tokens = tokens
                if not logits:
                    logits.append(_reference_logits(model, ids, max_new_tokens, ref))
                ref_logits = logits[0]
                if ref_logits is not None and d < ref_logits.shape[0]:
                    row = ref_logits[d]
                    top = torch.topk(row, 2).values
                    run.gap_top2 = float(top[0] - top[1])
                    if run.got_token is not None and run.ref_token is not None:
                        run.gap_chosen = float(row[run.ref_token] - row[run.got_token])
                if tokenizer is not None:
                    run.context = _context(tokenizer, ref, d, run.got_token)
        if isinstance(stats, HFSteps):
            run.steps = stats.steps
            run.tokens_per_step = max(len(tokens) - 1, 0) / stats.steps if stats.steps else None
            run.packed_per_step = sum(stats.packed[1:]) / stats.steps if stats.steps else None
            if keep_per_step:
                run.per_step = {"packed": stats.packed[1:]}
        elif stats is not None:
            packed = stats.per_step.get("packed") or []
            run.steps = stats.steps
            run.tokens_per_step = stats.tokens_per_step
            run.packed_per_step = sum(packed) / len(packed) if packed else None
            run.prefill_ms = stats.prefill_ms
            run.forward_ms = stats.forward_ms
            run.overhead_ms = stats.overhead_ms
            run.policy_ms = stats.policy_ms
            run.stop_reason = stats.stop_reason
            if keep_per_step:
                run.per_step = stats.per_step
        rows.append(run)
    return rows


def _context(tokenizer, ref: list[int], d: int, got: int | None) -> str:
    def dec(toks):
        try:
            return tokenizer.decode(toks)
        except Exception:  # noqa: BLE001 - a debugging aid only
            return str(toks)

    before = dec(ref[max(0, d - 8) : d])
    want = dec(ref[d : d + 1]) if d < len(ref) else "<end>"
    have = dec([got]) if got is not None else "<end>"
    return f"{before!r} -> ref {want!r} / got {have!r}"


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _summarise(set_name: str, method: Method, runs: list[Run]) -> Summary:
    mine = [r for r in runs if r.set == set_name and r.method == method.name]
    greedy = {r.prompt: r for r in runs if r.set == set_name and r.method == HF_GREEDY}
    pld = {r.prompt: r for r in runs if r.set == set_name and r.method == HF_PLD}
    tokens = sum(r.new_tokens for r in mine)
    secs = sum(r.time_s for r in mine)
    tps = tokens / secs if secs > 0 else 0.0
    g_tokens = sum(greedy[r.prompt].new_tokens for r in mine if r.prompt in greedy)
    g_secs = sum(greedy[r.prompt].time_s for r in mine if r.prompt in greedy)
    g_tps = g_tokens / g_secs if g_secs > 0 else 0.0
    p_runs = [pld[r.prompt] for r in mine if r.prompt in pld]
    p_tps = (sum(r.new_tokens for r in p_runs) / sum(r.time_s for r in p_runs)) if p_runs else None
    per = [r.speedup_vs_greedy for r in mine if r.speedup_vs_greedy is not None]
    per_pld = [r.speedup_vs_pld for r in mine if r.speedup_vs_pld is not None]
    checked = [r for r in mine if r.exact is not None]
    gaps = [r.gap_top2 for r in checked if r.exact is False and r.gap_top2 is not None]
    summary = Summary(
        set=set_name,
        method=method.name,
        prompts=len(mine),
        tokens=tokens,
        time_s=secs,
        tokens_per_s=tps,
        speedup=_ratio(tps, g_tps),
        time_ratio=_ratio(g_secs, secs),
        median_speedup=statistics.median(per) if per else None,
        speedup_vs_pld=_ratio(tps, p_tps) if p_tps else None,
        median_speedup_vs_pld=statistics.median(per_pld) if per_pld else None,
        exact=sum(1 for r in checked if r.exact) if checked else None,
        diverged=sum(1 for r in checked if not r.exact) if checked else None,
        max_gap=max(gaps) if gaps else None,
    )
    shared = [r for r in mine if r.cpu_share is not None]
    if shared:
        summary.cpu_share = sum(r.cpu_share * r.time_s for r in shared) / sum(r.time_s for r in shared)
    counted = [r for r in mine if r.steps is not None]
    if counted:
        steps = sum(r.steps for r in counted)
        summary.steps = steps
        summary.tokens_per_step = sum(max(r.new_tokens - 1, 0) for r in counted) / steps if steps else None
        packed = [(r.packed_per_step or 0.0) * r.steps for r in counted]
        summary.packed_per_step = sum(packed) / steps if steps else None
    stepped = [r for r in mine if r.forward_ms is not None]
    if stepped:
        summary.prefill_ms = sum(r.prefill_ms or 0.0 for r in stepped)
        summary.forward_ms = sum(r.forward_ms or 0.0 for r in stepped)
        summary.overhead_ms = sum(r.overhead_ms or 0.0 for r in stepped)
        summary.policy_ms = sum(r.policy_ms or 0.0 for r in stepped)
        summary.other_ms = sum(r.time_s for r in stepped) * 1e3 - summary.prefill_ms - summary.forward_ms - summary.overhead_ms
    return summary


# --- environment -------------------------------------------------------------------------------


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line() -> str:
    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "autolade":
        argv[0] = "autolade"
    return shlex.join(argv)


def environment(model: torch.nn.Module, *, command: str | None = None) -> dict[str, Any]:
    import transformers

    param = next(model.parameters())
    env: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else command_line(),
        "cwd": os.getcwd(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(param.device),
        "dtype": str(param.dtype).replace("torch.", ""),
        "model": str(getattr(model.config, "_name_or_path", "") or getattr(model.config, "model_type", "")),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
    }
    if param.device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(param.device)
    try:
        from .models import model_fingerprint

        env["model_fingerprint"] = model_fingerprint(model)
    except Exception:  # noqa: BLE001 - informative only
        pass
    return env


# --- output ------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


TABLE_COLUMNS = (
    "method", "exact", "max gap", "x greedy", "x greedy med", "x PLD", "x PLD med",
    "tok/s", "tok/step", "packed", "fwd ms/step", "ovh ms/step", "ovh %", "cpu",
)  # fmt: skip


def table_rows(report: BenchReport, set_name: str) -> list[list[str]]:
    rows = []
    for s in report.summaries:
        if s.set != set_name:
            continue
        exact = f"{s.exact}/{s.exact + s.diverged}" if s.exact is not None else "ref"
        rows.append(
            [
                s.method,
                exact,
                _fmt(s.max_gap, ".3g"),
                _fmt(s.speedup),
                _fmt(s.median_speedup),
                _fmt(s.speedup_vs_pld),
                _fmt(s.median_speedup_vs_pld),
                _fmt(s.tokens_per_s, ".1f"),
                _fmt(s.tokens_per_step),
                _fmt(s.packed_per_step, ".1f"),
                _fmt(s.forward_ms_per_step, ".1f"),
                _fmt(s.overhead_ms_per_step, ".2f"),
                _fmt(None if s.overhead_share is None else 100 * s.overhead_share, ".1f"),
                _fmt(s.cpu_share),
            ]
        )
    return rows


def _align(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt_row = lambda r: "  ".join(  # noqa: E731
        (str(c).ljust(w) if i == 0 else str(c).rjust(w)) for i, (c, w) in enumerate(zip(r, widths))
    )
    return [fmt_row(header), "  ".join("-" * w for w in widths), *[fmt_row(r) for r in rows]]


def format_table(report: BenchReport) -> str:
    """Plain-text tables, one per prompt set, with a header line on the environment."""
    env = report.environment
    load = env.get("load_avg_1m") or {}
    lines = [
        f"model {env.get('model')} ({env.get('dtype')}), {env.get('device')}, {env.get('cpu_model')}, "
        f"{env.get('torch_threads')} threads, torch {env.get('torch')}, transformers {env.get('transformers')}",
        f"{report.settings['max_new_tokens']} new tokens, warmup {report.settings['warmup']}, "
        f"fastest of {report.settings.get('repeats', 1)} run(s), "
        f"1-min load average {load.get('start')} -> {load.get('end')} (max {load.get('max')})",
    ]
    for set_name, ids in report.sets.items():
        g = report.summary(set_name, HF_GREEDY)
        lines += ["", f"[{set_name}] {len(ids)} prompts, HF greedy {g.tokens_per_s:.1f} tok/s ({g.tokens} tokens, {g.time_s:.1f} s)"]
        lines += _align(TABLE_COLUMNS, table_rows(report, set_name))
    return "\n".join(lines)


def markdown_table(report: BenchReport, set_name: str) -> str:
    rows = table_rows(report, set_name)
    out = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(TABLE_COLUMNS) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def divergences(report: BenchReport) -> list[Run]:
    return [r for r in report.runs if r.exact is False]


def markdown_report(report: BenchReport, *, title: str | None = None) -> str:
    """A BENCHMARKS.md section: the command, the machine, one table per set, the divergences."""
    env = report.environment
    load = env.get("load_avg_1m") or {}
    lines = [
        f"### {title or Path(str(env.get('model'))).name + ' ' + str(env.get('dtype'))}",
        "",
        "```",
        str(env.get("command")),
        "```",
        "",
        f"{env.get('date')}; {env.get('cpu_model')}, {env.get('logical_cpus')} CPUs, {env.get('torch_threads')} torch "
        f"threads, {env.get('device')}, {env.get('dtype')}; torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}; {report.settings['max_new_tokens']} new tokens, warm-up {report.settings['warmup']}, "
        f"fastest of {report.settings.get('repeats', 1)} timed run(s) per prompt and method; "
        f"{'stopped early: ' + report.settings['stopped_early'] + '; ' if report.settings.get('stopped_early') else ''}"
        f"1-min load average {load.get('start')} at the start, {load.get('end')} at the end, max {load.get('max')}.",
    ]
    for set_name, ids in report.sets.items():
        g = report.summary(set_name, HF_GREEDY)
        lines += [
            "",
            f"**{set_name}** ({len(ids)} prompts; HF greedy {g.tokens_per_s:.1f} tok/s, {g.tokens} tokens in {g.time_s:.1f} s)",
            "",
            markdown_table(report, set_name),
        ]
    div = divergences(report)
    if div:
        lines += ["", "First divergences from HF greedy (new-token index; reference top-2 gap; ref minus got logit):", ""]
        for r in div:
            lines.append(
                f"- {r.set} `{r.prompt}` {r.method}: at {r.diverged_at}, gap {_fmt(r.gap_top2, '.4g')}, "
                f"chosen {_fmt(r.gap_chosen, '.4g')}"
            )
    return "\n".join(lines) + "\n"


def write_json(report: BenchReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return path


def write_chart(report: BenchReport, path: str | Path) -> Path:
    """Grouped bars: speedup vs HF greedy per method (colours) per prompt set (groups), 1.0 line."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sets = list(report.sets)
    methods = [m.name for m in report.methods if m.kind != HF_GREEDY]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.5 * len(sets) * max(len(methods), 1)) + 2.2, 4.2), dpi=110)
    width = 0.8 / max(len(methods), 1)
    for j, name in enumerate(methods):
        xs, ys, meds = [], [], []
        for i, s in enumerate(sets):
            summ = report.summary(s, name)
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(summ.speedup or 0.0)
            meds.append(summ.median_speedup)
        ax.bar(xs, ys, width * 0.92, label=name)
        for x, y in zip(xs, ys):  # the value inside the bar, clear of the median tick above it
            ax.text(x, y / 2, f"{y:.2f}", ha="center", va="center", fontsize=7, rotation=90, color="white")
        mx = [x for x, m in zip(xs, meds) if m is not None]
        my = [m for m in meds if m is not None]
        ax.plot(mx, my, "k_", markersize=max(4.0, 60 * width), mew=1.5, label="median of per-prompt ratios" if j == 0 else None)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels([f"{s} ({len(report.sets[s])})" for s in sets])
    ax.set_ylabel("speedup vs HF greedy (tokens/s ratio)")
    env = report.environment
    ax.set_title(
        f"{Path(str(env.get('model'))).name} {env.get('dtype')}, {env.get('device')}, "
        f"{env.get('torch_threads')} threads, {report.settings['max_new_tokens']} new tokens",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # outside: never over a bar
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(report: BenchReport, out: str | Path) -> tuple[Path, Path]:
    """``out.json`` and ``out.png``, plus ``out.md`` (a BENCHMARKS.md section); a ``.json`` /
    ``.png`` / ``.md`` suffix on ``out`` is dropped first. Returns the JSON and PNG paths."""
    js = write_json(report, _out_path(out, ".json"))
    png = write_chart(report, _out_path(out, ".png"))
    _out_path(out, ".md").write_text(markdown_report(report), encoding="utf-8")
    return js, png


def _out_path(out: str | Path, suffix: str) -> Path:
    out = Path(out)
    if out.suffix in (".json", ".png", ".md"):
        out = out.with_suffix("")
    return out.with_name(out.name + suffix)


def load_report(path: str | Path) -> BenchReport:
    """A report written by ``write_report`` / ``autolade bench``."""
    return BenchReport.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


# --- the command (``autolade bench`` and ``tools/bench.py``) -----------------------------------


def bench_main(
    *,
    model: str = "smollm2-135m",
    dtype: str = "bfloat16",
    sets: str = "chat,code",
    prompts: int | None = 10,
    max_new_tokens: int = 128,
    configs: Sequence[str] = (),
    profiles: Sequence[str] = (),
    heldout: bool = False,
    baselines: str = "greedy,pld",
    warmup: int = 1,
    repeats: int = 1,
    max_seconds: float | None = None,
    threads: int | None = None,
    device: str | None = None,
    out: str | None = "out/bench",
    echo: Callable[[str], None] = print,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Load, run, print the table, write ``out.json`` and ``out.png``; what the CLI calls.
    ``profiles``: workloads whose stored profile (this machine, model, dtype) is timed too."""
    from .models import load
    from .settings import stored_profile

    if threads is not None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    parsed = [parse_method(s) for s in configs] if configs or profiles else [(c, None) for c in default_configs().values()]
    named: dict[str, Any] = {}
    for c, pol in parsed:
        base = config_label(c, pol)
        label, n = base, 2
        while label in named:
            label, n = f"{base}#{n}", n + 1
        named[label] = c if pol is None else (c, pol)
    prompt_sets = load_sets(sets.split(","), limit=prompts, heldout=heldout)
    lm, tok = load(model, dtype=dtype, device=device)
    say = progress or (lambda _msg: None)
    for workload in profiles:
        prof, source = stored_profile(lm, workload)
        named[f"profile:{prof.workload}"] = (prof.settings, prof.policy)
        say(f"profile:{prof.workload} = {config_label(prof.settings, prof.policy)} from {source}")
    total = sum(len(v) for v in prompt_sets.values())
    seen: set[tuple[str, str]] = set()

    def on_result(run: Run) -> None:
        key = (run.set, run.prompt)
        if key not in seen:
            seen.add(key)
            say(f"[{len(seen)}/{total}] {run.set} {run.prompt}")
        mark = "" if run.exact in (None, True) else f"  DIVERGED at {run.diverged_at} (gap {_fmt(run.gap_top2, '.3g')})"
        say(f"    {run.method:<18} {run.new_tokens:4d} tok {run.time_s:7.2f} s  x{_fmt(run.speedup_vs_greedy)}{mark}")

    report = run_benchmark(
        model=lm,
        tokenizer=tok,
        prompts=prompt_sets,
        configs=named,
        max_new_tokens=max_new_tokens,
        baselines=[b.strip() for b in baselines.split(",") if b.strip()],
        warmup=warmup,
        repeats=repeats,
        max_seconds=max_seconds,
        on_result=on_result,
        on_prompt=(lambda partial: write_json(partial, _out_path(out, ".json"))) if out else None,
    )
    report.environment["model_arg"] = model
    echo(format_table(report))
    if report.settings.get("stopped_early"):
        echo(f"\nstopped early: {report.settings['stopped_early']}")
    div = divergences(report)
    if div:
        echo("")
        echo("first divergences from HF greedy (index in new tokens, reference top-2 gap, ref - got logit):")
        for r in div:
            echo(
                f"  {r.set} {r.prompt} {r.method}: at {r.diverged_at}, gap {_fmt(r.gap_top2, '.4g')}, "
                f"chosen {_fmt(r.gap_chosen, '.4g')}  {r.context or ''}"
            )
    if out:
        js, png = write_report(report, out)
        echo(f"\nwrote {js} and {png}")
    return report
