"""Running the side-by-side benchmark: HF greedy vs HF prompt lookup vs autolade, in one process.

For every prompt, every method runs once, in an order that rotates from prompt to prompt
(so that drift of the machine, e.g. another process starting, spreads over all methods).
Each method is timed around its whole call (prefill included) by ``autolade.tuning.harness``
(``perf_counter``, CUDA-synchronised on a GPU). The first prompt is run ``warmup`` times by
every method first, untimed.

Exactness: every output is compared token for token with HF greedy's. At the first
divergence the report keeps the index, both tokens, and the REFERENCE's logits there:
the top-2 gap (``gap_top2``) and how far the diverging token was below the reference
token (``gap_chosen``), from HF greedy's own scores (``output_logits=True``, recomputed
in an untimed call only for prompts where something diverged).

    report = run_benchmark(model=model, tokenizer=tok, prompts={"chat": load_workload("chat", limit=10)},
                           configs=default_configs())
    print(format_table(report)); write_report(report, "out/bench")   # out/bench.json, out/bench.png
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autolade.bench.report import BASELINES, HF_ASSISTED, HF_GREEDY, HF_PLD, HF_STATIC, BenchReport, Method, Run, summarise
from autolade.config import LookaheadConfig, parse_config
from autolade.engine.recycle import NextTokenTable
from autolade.errors import ConfigError, InputError, WorkloadError
from autolade.machine.hardware import environment, load_average
from autolade.runtime.policies import NO_CURVE, make_policy, needs_cost
from autolade.tuning.harness import (
    PLD_TOKENS,
    HFSteps,
    Reference,
    Timed,
    divergence,
    greedy_reference,
    rotate,
    run_assisted,
    run_autolade,
    run_greedy,
    run_pld,
    run_static,
    setting_label,
)
from autolade.workloads import (
    COPY_SET,
    Prompt,
    copy_workload,
    encode_prompt,
    load_workload,
    split_workload,
)

# --- what runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    """A prompt already as token ids (the tokenizer-free path)."""

    id: str
    input_ids: tuple[int, ...]
    kind: str = "chat"
    text: str | None = None


def config_label(config: LookaheadConfig, policy: Any = None) -> str:
    """A method's table name: ``al `` and the setting's one label (``autolade.tuning.harness.setting_label``),
    e.g. ``al greedy``, ``al lookup10``, ``al W4N4G4+L10``, ``al lookup16x3s``, ``... adaptive``."""
    return f"al {setting_label(config, policy)}"


DEFAULT_CONFIG_SPECS = ("0,0,0,0", "0,4,0,10", "2,3,2,10", "4,4,4,10")


def default_configs() -> dict[str, LookaheadConfig]:
    """Plain greedy through autolade's loop, prompt lookup only, and two small lookahead settings."""
    configs = [parse_config(s) for s in DEFAULT_CONFIG_SPECS]
    return {config_label(c): c for c in configs}


def _methods(configs: Mapping[str, Any], baselines: Sequence[str], assistant: Any = None,
             assistant_name: str | None = None) -> list[Method]:
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ConfigError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    if "greedy" not in baselines:
        raise ConfigError("baselines must include 'greedy': it is the reference every ratio and exactness check uses")
    if "assisted" in baselines and assistant is None:
        raise ConfigError("the 'assisted' baseline needs a draft model: pass assistant= (`autolade bench --draft MODEL`; "
                          "a registry model with a same-tokenizer smaller sibling has one by default)")
    methods = [Method(BASELINES[b], BASELINES[b], assistant=assistant if b == "assisted" else None,
                      assistant_name=assistant_name if b == "assisted" else None) for b in dict.fromkeys(baselines)]
    for name, value in configs.items():
        if isinstance(value, Method):
            method = Method(str(name), "autolade", value.config, value.policy)
        elif isinstance(value, LookaheadConfig):
            method = Method(str(name), "autolade", value)
        elif isinstance(value, Mapping) and isinstance(value.get("config"), LookaheadConfig):
            pad, pairs, compiled = value.get("pad"), value.get("pairs", True), value.get("compile")
            for key, flag in (("pad", pad), ("compile", compiled)):
                if flag is not None and not isinstance(flag, bool):
                    raise ConfigError(f"config {name!r}: {key} must be True, False or None (the stored curves decide), "
                                      f"got {flag!r}")
            if not isinstance(pairs, bool):
                raise ConfigError(f"config {name!r}: pairs must be True or False, got {pairs!r}")
            method = Method(str(name), "autolade", value["config"], value.get("policy"), bool(value.get("carry", False)), pad,
                            pairs, compiled)
            if method.carry and not method.config.recycle:
                raise ConfigError(f"config {name!r}: carry keeps the token recycling table; it needs recycle > 0")
            if not method.pairs and not method.config.recycle:
                raise ConfigError(f"config {name!r}: pairs=0 shapes the token recycling table; it needs recycle > 0")
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


def load_sets(names: Sequence[str], *, limit: int | None = None, heldout: bool = False) -> dict[str, list[Prompt]]:
    """Named prompt sets: ``chat``, ``code``, ``copy`` or workload files (see autolade.workloads).
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
    on_prompt: Callable[[BenchReport], None] | None = None,
    assistant: torch.nn.Module | None = None,
    assistant_name: str | None = None,
) -> BenchReport:
    """Time HF greedy, HF prompt lookup and each autolade config on every prompt; see the module doc.

    ``prompts``: ``{set name: [Prompt | BenchPrompt | LongTensor | list[int]]}``, or a flat list
    (grouped by ``Prompt.source``). ``configs``: ``{name: LookaheadConfig | (config, policy_factory)
    | {"config", "policy"}}``; defaults to ``default_configs()``. ``repeats`` > 1 runs every
    method that many times per prompt (each round in its own rotated order) and keeps the
    fastest time: robust to a machine that other processes disturb now and then.
    A method with ``carry`` (``{"config", "policy", "carry": True}``) keeps its token recycling table
    from prompt to prompt of a set; every timed run of a prompt starts from the same table (the one the
    earlier prompts left) and the warm-up runs from an empty one, so repeats do not learn their own prompt.
    ``max_seconds``: start no new prompt once this much wall time has passed (the report says
    so in ``settings["stopped_early"]``). ``on_prompt(report so far)`` after every prompt, e.g.
    to checkpoint the JSON so that a killed run still leaves its results. ``assistant``: the draft model
    of the ``assisted`` baseline (HF assisted generation), named ``assistant_name`` in the report.
    """
    _check_counts(repeats=repeats, max_new_tokens=max_new_tokens, warmup=warmup)
    methods = _methods(default_configs() if configs is None else configs, baselines, assistant, assistant_name)
    grouped = _as_prompts(prompts)
    if not any(grouped.values()):
        raise WorkloadError("no prompts to benchmark")
    model.eval()
    device = next(model.parameters()).device
    cost = _stored_cost(model, methods)
    env = environment(model, command=command)
    loads: list[float] = []
    runs: list[Run] = []
    warm: list[dict[str, Any]] = []
    sets: dict[str, list[str]] = {}
    carried: dict[tuple[str, str], NextTokenTable] = {}  # (method, set) -> its token recycling table
    index = 0
    started = time.perf_counter()
    stopped_early: str | None = None
    settings = _run_settings(max_new_tokens=max_new_tokens, baselines=baselines, warmup=warmup, repeats=repeats,
                             max_seconds=max_seconds)

    def build() -> BenchReport:
        done_sets = {k: v for k, v in sets.items() if v}
        env["load_avg_1m"] = {
            "start": loads[0] if loads else None,
            "end": loads[-1] if loads else None,
            "max": max((x for x in loads if x is not None), default=None),
            "samples": loads,
        }
        summaries = [summarise(set_name, m, runs) for set_name in done_sets for m in methods]
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
                    warm += _warm_up(model, methods, ids, pid, max_new_tokens=max_new_tokens, cost=cost, rounds=warmup)
                loads.append(load_average())
                order = rotate(methods, index)
                before = {m.name: carried.get((m.name, set_name)) or m.new_table() for m in methods if m.carry}
                outputs, times, shares, after = _time_prompt(model, order, ids, max_new_tokens=max_new_tokens, cost=cost,
                                                             repeats=repeats, before=before, on_cpu=device.type == "cpu")
                carried.update({(name, set_name): table for name, table in after.items()})  # the next prompt's start
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
    loads.append(load_average())
    return build()


def _check_counts(*, repeats: Any, max_new_tokens: Any, warmup: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be a positive integer, got {repeats!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup must be an integer >= 0, got {warmup!r}")


def _run_settings(*, max_new_tokens: int, baselines: Sequence[str], warmup: int, repeats: int,
                  max_seconds: float | None) -> dict[str, Any]:
    """The report's ``settings``: the run's parameters and how its numbers were taken."""
    return {
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


def _stored_cost(model: torch.nn.Module, methods: Sequence[Method]) -> Callable[[float], float] | None:
    """This machine's stored c(k) where a method's policy plans on it (cost-aware); else None."""
    if not any(isinstance(m.policy, (str, dict)) and needs_cost(m.policy) for m in methods):
        return None
    from autolade.runtime.settings import stored_cost

    cost = stored_cost(model)
    if cost is None:
        raise ConfigError(NO_CURVE)
    return cost


def _warm_up(model: torch.nn.Module, methods: Sequence[Method], ids: torch.Tensor, pid: str, *, max_new_tokens: int,
             cost: Callable[[float], float] | None, rounds: int) -> list[dict[str, Any]]:
    """Untimed runs of every method on the first prompt (carrying or not: from a fresh table); what each took."""
    warm = []
    for _ in range(rounds):
        for m in methods:
            done = _run_method(model, m, ids, max_new_tokens, cost, None if m.pairs else m.new_table())
            warm.append({"method": m.name, "prompt": pid, "time_s": done.seconds, "new_tokens": len(done.tokens)})
    return warm


def _time_prompt(model: torch.nn.Module, order: Sequence[Method], ids: torch.Tensor, *, max_new_tokens: int,
                 cost: Callable[[float], float] | None, repeats: int, before: dict[str, NextTokenTable], on_cpu: bool,
                 ) -> tuple[dict[str, Timed], dict[str, list[float]], dict[str, float | None], dict[str, NextTokenTable]]:
    """Every method on one prompt, ``repeats`` rounds in rotated order: (fastest run per method, all its
    times, its CPU share, the recycling table a carrying method's first round left for the next prompt).
    ``before``: each carrying method's table as the earlier prompts left it; every run starts from a copy."""
    outputs: dict[str, Timed] = {}
    times: dict[str, list[float]] = {m.name: [] for m in order}
    shares: dict[str, float | None] = {}
    after: dict[str, NextTokenTable] = {}
    threads = max(torch.get_num_threads(), 1)
    for rnd in range(repeats):
        for m in rotate(order, rnd):
            # built before the clock starts; a method without pairs gets its kind of fresh table
            table = before[m.name].copy() if m.carry else None if m.pairs else m.new_table()
            cpu0 = time.process_time()
            result = _run_method(model, m, ids, max_new_tokens, cost, table)
            cpu = time.process_time() - cpu0
            if m.carry and rnd == 0:
                after[m.name] = table
            times[m.name].append(result.seconds)
            if m.name not in outputs or result.seconds < outputs[m.name].seconds:
                outputs[m.name] = result
                shares[m.name] = round(cpu / (result.seconds * threads), 3) if on_cpu else None
    return outputs, times, shares, after


def _run_method(model: torch.nn.Module, method: Method, ids: torch.Tensor, max_new_tokens: int,
                cost: Callable[[float], float] | None = None, recycled: NextTokenTable | None = None) -> Timed:
    """One timed run; HF methods count their forwards (``Timed.stats``: HFSteps), autolade returns its stats.
    ``recycled``: the token recycling table a carrying method drafts from (and teaches)."""
    if method.kind == "autolade":
        return run_autolade(model, ids, max_new_tokens=max_new_tokens, config=method.config,
                            policy=method.make_policy(cost), recycled=recycled, pad_single=method.pad,
                            compile=method.compile)
    if method.kind == HF_ASSISTED:
        return run_assisted(model, ids, max_new_tokens=max_new_tokens, assistant=method.assistant, count_steps=True)
    run = {HF_PLD: run_pld, HF_STATIC: run_static}.get(method.kind, run_greedy)
    return run(model, ids, max_new_tokens=max_new_tokens, count_steps=True)


def _reference(model, ids: torch.Tensor, max_new_tokens: int, tokens: list[int]) -> Reference | None:
    """HF greedy's own logits (untimed rerun, kept); None if the rerun's tokens differ from ``tokens``."""
    ref = greedy_reference(model, ids, max_new_tokens=max_new_tokens, keep_logits=True)
    return ref if ref.tokens == tokens else None


def _score_prompt(model, tokenizer, set_name, pid, ids, methods, order, outputs, max_new_tokens, keep_per_step) -> list[Run]:
    greedy = outputs[HF_GREEDY]
    ref = greedy.tokens
    ref_tps = len(ref) / greedy.seconds if greedy.seconds > 0 else 0.0
    pld = outputs.get(HF_PLD)
    pld_tps = len(pld.tokens) / pld.seconds if pld and pld.seconds > 0 else None
    reference: list[Reference | None] = []  # lazily: [] = not rerun yet
    rows = []
    for m in methods:
        tokens, secs, stats = outputs[m.name].tokens, outputs[m.name].seconds, outputs[m.name].stats
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
            run.exact = ref == tokens
            if not run.exact:
                if not reference:
                    reference.append(_reference(model, ids, max_new_tokens, ref))
                div = divergence(ref, tokens, reference[0])
                run.diverged_at, run.ref_token, run.got_token = div.index, div.ref_token, div.got_token
                run.gap_top2, run.gap_chosen = div.gap_top2, div.gap_chosen
                run.tokens = tokens
                if tokenizer is not None:
                    run.context = _context(tokenizer, ref, div.index, div.got_token)
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
        except Exception:
            return str(toks)

    before = dec(ref[max(0, d - 8) : d])
    want = dec(ref[d : d + 1]) if d < len(ref) else "<end>"
    have = dec([got]) if got is not None else "<end>"
    return f"{before!r} -> ref {want!r} / got {have!r}"


