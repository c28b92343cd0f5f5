"""``autolade batch``: a file of requests decoded together offline (argument handling only; the work is in
autolade/serve/jobs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autolade.cli.errors import clean_errors


@click.command("batch")
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON Lines written as requests finish (default: INPUT's name with .out.jsonl); an existing one is resumed")
@click.option("--overwrite", is_flag=True, help="start the output again instead of resuming it")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--max-batch", type=click.IntRange(1, 256), default=8, show_default=True,
              help="requests decoded together in one forward per step; the next line joins when one finishes")
@click.option("--temperature", type=click.FloatRange(0.0, 2.0), default=0.0, show_default=True,
              help="for lines that name none (0: exact greedy, model.generate(do_sample=False)'s tokens)")
@click.option("--max-tokens", type=click.IntRange(1), default=None, help="for lines that name none (default: 256, "
              "capped to the context)")
@click.option("--workload", default=None, help="default workload of lines that name none (default: chat for chat "
              "requests, code for raw prompts)")
@click.option("--memory/--no-memory", default=None, help="draft from (and remember in) the n-gram memory (default: on when greedy)")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="run the batched step compiled (default: where `autolade profile --compile` measured that it pays "
                   "and the job's tokens win back the graph's warm-up, a minute or two on a CPU)")
@click.option("--trust-remote-code", is_flag=True, help="allow model repos to run their own code (off by default)")
@clean_errors
def batch_command(input_path, output, overwrite, model, dtype, max_batch, temperature, max_tokens, workload, memory,
                  compile_, trust_remote_code):
    """Answer every request of INPUT, several decoded together: JSON Lines of chat bodies ({"messages": [...]}),
    completion bodies ({"prompt": "..."}) or OpenAI Batch API lines, or a .txt file of one prompt per line."""
    from autolade import api
    from autolade.runtime.settings import compile_for_run
    from autolade.serve.jobs import BatchJob, job_tokens, read_job
    from autolade.serve.worker import ModelServer

    lines = read_job(input_path, temperature=temperature, max_tokens=max_tokens)  # a bad input fails before the model loads
    out = output or input_path.with_name(input_path.name.removesuffix(input_path.suffix) + ".out.jsonl")
    if out.resolve() == input_path.resolve():
        raise click.BadParameter("the output would overwrite the input: give another --output", param_hint="--output")
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype, trust_remote_code=trust_remote_code)
    if compile_ is None:  # the graph's warm-up counts against this job's tokens
        compile_, why = compile_for_run(mdl, new_tokens=job_tokens(lines))
        if why:
            click.echo(f"note: {why}", err=True)
    server = ModelServer(mdl, tok, name=model, workload=workload, memory=memory, max_batch=max_batch, compile=compile_)
    if server.compiled:
        click.echo("autolade: compiling the batched step (one graph; a minute or two on a CPU)...", err=True)
        click.echo(f"autolade: compiled in {server.warm_up():.0f} s", err=True)
    job = BatchJob(server, lines, out, workers=2 * max_batch)  # a line waits ready for every row that frees

    def progress(s) -> None:
        if sys.stderr.isatty():
            click.echo(f"\rautolade: {s.skipped + s.answered + s.errors}/{s.lines} lines ({s.errors} refused)", err=True, nl=False)

    summary = job.run(resume=not overwrite, progress=progress)
    if sys.stderr.isatty():
        click.echo("", err=True)
    rate = summary.completion_tokens / summary.seconds if summary.seconds else 0.0
    resumed = f"{summary.skipped} already in {out}, " if summary.skipped else ""
    click.echo(f"autolade: {resumed}{summary.answered} answered, {summary.errors} refused (see their 'error'), "
               f"{summary.completion_tokens} tokens in {summary.seconds:.1f} s ({rate:.1f} tok/s) -> {out}", err=True)
    if summary.interrupted:
        raise click.ClickException(f"interrupted: what finished is in {out}; run the same command again to resume")
