"""Side-by-side benchmark: HF greedy vs HF prompt lookup vs autolade (``autolade bench``).

``run`` times the methods (through ``autolade.tuning.harness``), ``report`` holds the data and its JSON,
``render`` draws the tables, the BENCHMARKS.md section and the chart, ``command`` is what the CLI calls.

    report = run_benchmark(model=model, tokenizer=tok, prompts={"chat": load_workload("chat", limit=10)},
                           configs=default_configs())
    print(format_table(report)); write_report(report, "out/bench")   # out/bench.json, out/bench.png
"""

from autolade.bench.command import bench_main
from autolade.bench.render import (
    divergences,
    format_table,
    markdown_report,
    markdown_table,
    table_rows,
    write_chart,
    write_report,
)
from autolade.bench.report import (
    BASELINES,
    HF_GREEDY,
    HF_PLD,
    BenchReport,
    Method,
    Run,
    Summary,
    load_report,
    summarise,
    write_json,
)
from autolade.bench.run import BenchPrompt, config_label, default_configs, load_sets, run_benchmark

__all__ = [
    "BASELINES",
    "HF_GREEDY",
    "HF_PLD",
    "BenchPrompt",
    "BenchReport",
    "Method",
    "Run",
    "Summary",
    "bench_main",
    "config_label",
    "default_configs",
    "divergences",
    "format_table",
    "load_report",
    "load_sets",
    "markdown_report",
    "markdown_table",
    "run_benchmark",
    "summarise",
    "table_rows",
    "write_chart",
    "write_json",
    "write_report",
]
