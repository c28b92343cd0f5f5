"""``autolade bench`` / ``tools/bench.py``: load the model and the prompt sets, run, print, write."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from autolade.bench.render import divergences, fmt, format_table, out_path, write_report
from autolade.bench.report import BenchReport, Run, write_json
from autolade.bench.run import config_label, default_configs, load_sets, run_benchmark
from autolade.config import parse_flag, parse_method
from autolade.errors import ConfigError


def split_carry(spec: str) -> tuple[str, bool]:
    """(the method spec without its ``carry=`` item, whether it carries its token recycling table)."""
    rest, flags = _split_flags(spec, ("carry",))
    return rest, bool(flags.get("carry", False))


def split_pad(spec: str) -> tuple[str, bool | None]:
    """(the method spec without its ``pad=`` item, ``generate(pad_single=)``: True / False, None when not given)."""
    rest, flags = _split_flags(spec, ("pad",))
    return rest, flags.get("pad")


def split_compile(spec: str) -> tuple[str, bool | None]:
    """(the method spec without its ``compile=`` item, ``generate(compile=)``: True / False, None when not given)."""
    rest, flags = _split_flags(spec, ("compile",))
    return rest, flags.get("compile")


def split_pairs(spec: str) -> tuple[str, bool]:
    """(the method spec without its ``pairs=`` item, whether recycling keeps rows per (previous, token) pair)."""
    rest, flags = _split_flags(spec, ("pairs",))
    return rest, bool(flags.get("pairs", True))


def _split_flags(spec: str, names: Sequence[str]) -> tuple[str, dict[str, bool]]:
    kept, flags = [], {}
    for item in str(spec).split(","):
        key, eq, value = item.partition("=")
        if eq and key.strip() in names:
            flags[key.strip()] = parse_flag(spec, key.strip(), value)
        else:
            kept.append(item)
    return ",".join(kept), flags


def named_methods(configs: Sequence[str], *, defaults: bool) -> dict[str, Any]:
    """``--config`` specs as ``run_benchmark``'s ``{label: config | (config, policy) | {...}}``, each labelled by its
    setting and flags (``#2``... for repeats); ``defaults``: the built-in set when no spec was given."""
    parsed = []
    for spec in configs:
        spec, carry = split_carry(spec)
        spec, pad = split_pad(spec)
        spec, pairs = split_pairs(spec)
        spec, compiled = split_compile(spec)
        parsed.append((*parse_method(spec, also=("carry", "pad", "pairs", "compile")), carry, pad, pairs, compiled))
    if defaults:
        parsed = [(c, None, False, None, True, None) for c in default_configs().values()]
    named: dict[str, Any] = {}
    for c, pol, carry, pad, pairs, compiled in parsed:
        base = (config_label(c, pol) + (" carried" if carry else "") + {None: "", True: " padded", False: " unpadded"}[pad]
                + ("" if pairs else " unpaired") + {None: "", True: " compiled", False: " eager"}[compiled])
        label, n = base, 2
        while label in named:
            label, n = f"{base}#{n}", n + 1
        named[label] = ({"config": c, "policy": pol, "carry": carry, "pad": pad, "pairs": pairs, "compile": compiled}
                        if carry or pad is not None or not pairs or compiled is not None else c if pol is None else (c, pol))
    return named


def assisted_draft(model: str, draft: str | None) -> str:
    """The draft model of the ``assisted`` baseline: ``draft``, else the registry's sibling of ``model``."""
    from autolade.machine.registry import MODELS

    if draft:
        return draft
    spec = MODELS.get(model)
    if spec is None or spec.draft is None:
        with_draft = ", ".join(n for n, s in MODELS.items() if s.draft) or "none"
        raise ConfigError(f"the 'assisted' baseline needs a draft model for {model!r}: pass --draft MODEL (a smaller "
                          f"model with the same tokenizer); registry models with one by default: {with_draft}")
    return spec.draft


def load_draft(model: Any, tokenizer: Any, draft: str, *, dtype: str, device: str | None) -> Any:
    """Load ``draft`` for assisted generation; refuse one whose tokenizer is not the model's (HF would
    need its universal assisted path, a different baseline)."""
    from autolade.machine.models import load
    from autolade.records.vocab import model_tokenizer_fingerprint

    lm, tok = load(draft, dtype=dtype, device=device)
    if model_tokenizer_fingerprint(lm, tok) != model_tokenizer_fingerprint(model, tokenizer):
        raise ConfigError(f"draft model {draft!r} has another tokenizer than the benchmarked model; assisted "
                          f"generation needs the same vocabulary: pick a smaller model of the same family")
    return lm


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
    draft: str | None = None,
    out: str | None = "out/bench",
    echo: Callable[[str], None] = print,
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Load, run, print the table, write ``out.json`` and ``out.png``; what the CLI calls.
    ``profiles``: workloads whose stored profile (this machine, model, dtype) is timed too. ``draft``: the
    draft model of the ``assisted`` baseline (None: the registry's same-tokenizer sibling of ``model``)."""
    from autolade.machine.models import load
    from autolade.runtime.settings import stored_profile

    if threads is not None:
        if threads < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    named = named_methods(configs, defaults=not configs and not profiles)
    prompt_sets = load_sets(sets.split(","), limit=prompts, heldout=heldout)
    wanted = [b.strip() for b in baselines.split(",") if b.strip()]
    draft = assisted_draft(model, draft) if "assisted" in wanted else None
    lm, tok = load(model, dtype=dtype, device=device)
    assistant = load_draft(lm, tok, draft, dtype=dtype, device=device) if draft else None
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
        mark = "" if run.exact in (None, True) else f"  DIVERGED at {run.diverged_at} (gap {fmt(run.gap_top2, '.3g')})"
        say(f"    {run.method:<18} {run.new_tokens:4d} tok {run.time_s:7.2f} s  x{fmt(run.speedup_vs_greedy)}{mark}")

    report = run_benchmark(
        model=lm,
        tokenizer=tok,
        prompts=prompt_sets,
        configs=named,
        max_new_tokens=max_new_tokens,
        baselines=wanted,
        assistant=assistant,
        assistant_name=draft,
        warmup=warmup,
        repeats=repeats,
        max_seconds=max_seconds,
        on_result=on_result,
        on_prompt=(lambda partial: write_json(partial, out_path(out, ".json"))) if out else None,
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
                f"  {r.set} {r.prompt} {r.method}: at {r.diverged_at}, gap {fmt(r.gap_top2, '.4g')}, "
                f"chosen {fmt(r.gap_chosen, '.4g')}  {r.context or ''}"
            )
    if out:
        js, png = write_report(report, out)
        echo(f"\nwrote {js} and {png}")
    return report
