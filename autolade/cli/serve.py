"""``autolade serve``: the OpenAI-compatible server (argument handling only; autolade/serve/ does the work)."""

from __future__ import annotations

import click

from autolade.cli.errors import clean_errors
from autolade.serve.requests import MAX_WAITING


@click.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (0.0.0.0: every interface)")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--name", default=None, help="the model name clients pass (default: --model)")
@click.option("--workload", default=None, help="default workload of requests that name none (default: chat for chat "
              "requests, code for raw completions)")
@click.option("--memory/--no-memory", default=None, help="draft from (and remember in) the n-gram memory (default: on when greedy)")
@click.option("--plain", is_flag=True, help="lookahead off: plain greedy steps through the same server (a baseline to compare with)")
@click.option("--max-batch", type=click.IntRange(1, 256), default=8, show_default=True,
              help="requests decoded together in one forward per step; more wait for a free row")
@click.option("--max-waiting", type=click.IntRange(0, 4096), default=MAX_WAITING, show_default=True,
              help="requests that may wait for a free row; past max-batch + this, a request gets a 503 at once")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="run the batched step compiled, one graph built before serving (default: where `autolade profile "
                   "--compile` measured that it pays on this machine)")
@click.option("--trust-remote-code", is_flag=True, help="allow model repos to run their own code (off by default)")
@clean_errors
def serve(model, dtype, host, port, name, workload, memory, plain, max_batch, max_waiting, compile_, trust_remote_code):
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models)."""
    try:
        import uvicorn

        from autolade.serve.app import create_app
    except ImportError as exc:
        raise click.ClickException(f"the server needs its extra ({exc.name} is missing): pip install -e '.[serve]' "
                                   "(bash tools/setup.sh installs it)") from None
    from autolade import api
    from autolade.serve.worker import ModelServer

    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype, trust_remote_code=trust_remote_code)
    from autolade.config import GREEDY

    server = ModelServer(mdl, tok, name=name or model, workload=workload, memory=False if plain else memory,
                         config=GREEDY if plain else None, max_batch=max_batch, compile=compile_)
    if server.compiled:
        click.echo("autolade: compiling the batched step (one graph; a minute or two on a CPU)...", err=True)
        click.echo(f"autolade: compiled in {server.warm_up():.0f} s", err=True)
    click.echo(f"autolade: serving {server.name} on http://{host}:{port}/v1 (up to {max_batch} requests decoded together, "
               f"one forward per step, {max_waiting} more may wait{'; lookahead off' if plain else ''}"
               f"{'; compiled steps' if server.compiled else ''})", err=True)
    uvicorn.run(create_app(server, max_waiting=max_waiting), host=host, port=port, log_level="warning")
