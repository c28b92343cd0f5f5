"""Rendering of a benchmark report: plain-text tables, a BENCHMARKS.md section, the bar chart, and
``write_report`` (``out.json`` + ``out.png`` + ``out.md``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autolade.bench.report import HF_GREEDY, BenchReport, Run, write_json


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
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
                fmt(s.max_gap, ".3g"),
                fmt(s.speedup),
                fmt(s.median_speedup),
                fmt(s.speedup_vs_pld),
                fmt(s.median_speedup_vs_pld),
                fmt(s.tokens_per_s, ".1f"),
                fmt(s.tokens_per_step),
                fmt(s.packed_per_step, ".1f"),
                fmt(s.forward_ms_per_step, ".1f"),
                fmt(s.overhead_ms_per_step, ".2f"),
                fmt(None if s.overhead_share is None else 100 * s.overhead_share, ".1f"),
                fmt(s.cpu_share),
            ]
        )
    return rows


def _align(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt_row = lambda r: "  ".join(
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
                f"- {r.set} `{r.prompt}` {r.method}: at {r.diverged_at}, gap {fmt(r.gap_top2, '.4g')}, "
                f"chosen {fmt(r.gap_chosen, '.4g')}"
            )
    return "\n".join(lines) + "\n"


def write_chart(report: BenchReport, path: str | Path) -> Path:
    """Grouped bars: speedup vs HF greedy per method (colours) per prompt set (groups), 1.0 line.
    Drawn on its own ``Figure`` (Agg canvas): no pyplot, no global backend switch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sets = list(report.sets)
    methods = [m.name for m in report.methods if m.kind != HF_GREEDY]
    fig = Figure(figsize=(max(6.0, 1.2 + 0.5 * len(sets) * max(len(methods), 1)) + 2.2, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
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
    return path


def write_report(report: BenchReport, out: str | Path) -> tuple[Path, Path]:
    """``out.json`` and ``out.png``, plus ``out.md`` (a BENCHMARKS.md section); a ``.json`` /
    ``.png`` / ``.md`` suffix on ``out`` is dropped first. Returns the JSON and PNG paths."""
    js = write_json(report, out_path(out, ".json"))
    png = write_chart(report, out_path(out, ".png"))
    out_path(out, ".md").write_text(markdown_report(report), encoding="utf-8")
    return js, png


def out_path(out: str | Path, suffix: str) -> Path:
    out = Path(out)
    if out.suffix in (".json", ".png", ".md"):
        out = out.with_suffix("")
    return out.with_name(out.name + suffix)
