"""The ``autolade`` command. Thin: parse, call the library, turn domain errors into clean messages.

The group and ``generate`` / ``bench`` are here; the other commands live beside this module
(``profiles``: ``profile`` and ``profiles ...``; ``tune``: ``tune`` and ``accept``; ``memory``) and
are registered on the one group at the bottom."""

from __future__ import annotations

import logging

import click

from autolade.cli.batch import batch_command
from autolade.cli.errors import clean_errors
from autolade.cli.memory import memory_group
from autolade.cli.profiles import profile_command, profiles_group
from autolade.cli.serve import serve as serve_command
from autolade.cli.tune import accept_command, tune_command


@click.group()
@click.version_option(package_name="autolade")
def cli() -> None:
    """Exact lookahead decoding for Hugging Face causal LMs, tuned to this machine."""
    _echo_model_notes()


class _EchoHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def _echo_model_notes() -> None:
    """Model downloads and conversions say on stderr what they need (disk, time) before they start."""
    log = logging.getLogger("autolade.machine.models")
    if not any(isinstance(h, _EchoHandler) for h in log.handlers):
        log.addHandler(_EchoHandler())
        log.setLevel(logging.INFO)


# --- generate / bench (engine) -------------------------------------------------------------


class TextStream:
    """Prints decoded text as tokens are accepted (holds back an incomplete UTF-8 tail)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.printed = 0

    def __call__(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        click.echo(text[self.printed :], nl=False)
        self.printed = len(text)

    def close(self) -> None:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        click.echo(text[self.printed :])


@cli.command()
@click.argument("prompt")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--max-new-tokens", "-n", type=int, default=256, show_default=True)
@click.option("--window", "-W", type=int, default=None, help="lookahead window W (0 = no Jacobi window)")
@click.option("--ngram", "-N", type=int, default=None, help="n-gram size N")
@click.option("--guesses", "-G", type=int, default=None, help="pool n-grams verified per step G")
@click.option("--workload", default=None, help="profile workload tag to use (chat, code, ...)")
@click.option("--policy", default=None, help="runtime policy: static, adaptive, lookup, a preset in policies/ or a .json file")
@click.option("--plot", "plot_path", default=None, help="with --stats: PNG of W, G, packed size and acceptance per step")
@click.option("--raw", is_flag=True, help="no chat template: the prompt is fed as plain text")
@click.option("--stats", is_flag=True, help="print steps, tokens/step, tok/s and where the settings came from")
@click.option("--trust-remote-code", is_flag=True, help="allow model repos to run their own code (off by default)")
@click.option("--sample", "do_sample", is_flag=True, help="sample (exactly the distribution of HF do_sample=True) instead of greedy")
@click.option("--temperature", type=float, default=None, help="with --sample: temperature (default: the model's, else 1.0)")
@click.option("--top-k", type=int, default=None, help="with --sample: top-k (0 = off; default: the model's, else 50)")
@click.option("--top-p", type=float, default=None, help="with --sample: nucleus top-p (default: the model's, else 1.0 = off)")
@click.option("--min-p", type=float, default=None, help="with --sample: min-p (default: the model's, else off)")
@click.option("--repetition-penalty", type=float, default=None, help="repetition penalty, greedy or sampled (1.0 = off)")
@click.option("--seed", type=int, default=None, help="with --sample: RNG seed for a reproducible run")
@click.option("--memory/--no-memory", default=None, help="draft from (and remember in) the n-gram memory of earlier answers (default: on)")
@click.option("--new-workload", is_flag=True, help="--workload names a new workload on purpose: no note that it starts a new memory bucket")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="compiled decode steps (torch.compile, fixed widths, static cache; default: where `autolade profile --compile` "
                   "found they pay and -n tokens win back their warm-up)")
@clean_errors
def generate(prompt, model, dtype, max_new_tokens, window, ngram, guesses, workload, policy, plot_path, raw, stats,
             trust_remote_code, do_sample, temperature, top_k, top_p, min_p, repetition_penalty, seed, memory, new_workload,
             compile_):
    """Generate a completion for PROMPT with exact lookahead decoding."""
    from autolade import api
    from autolade.errors import InputError
    from autolade.runtime.settings import compile_for_run, default_resolver
    from autolade.tuning.dtype_advice import isa_note
    from autolade.workloads import encode_prompt, infer_workload, workload_tag

    if not prompt.strip():
        raise InputError("the prompt is empty: give some text")
    api.check_arguments(  # every bad value fails here, before the model loads
        max_new_tokens=max_new_tokens, window=window, ngram=ngram, guesses=guesses, policy=policy, do_sample=do_sample,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    named, workload = workload, workload or infer_workload(prompt)
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype, trust_remote_code=trust_remote_code)
    if note := isa_note(default_resolver().hardware(mdl), dtype):  # bf16 on a CPU without bf16 instructions
        click.echo(f"note: {note}", err=True)
    remembers = (memory if memory is not None else not do_sample and api.MEMORY_DEFAULT) is True
    if named and remembers and not new_workload and workload_tag(named) not in (known := api.known_workloads(mdl)):
        click.echo(f"note: workload {workload_tag(named)!r} is new for this model (known: {', '.join(known)}); its "
                   "answers start a new memory bucket: pass --new-workload if that is meant", err=True)
    if compile_ is None:  # one call in a fresh process: the graph's warm-up counts against it
        compile_, why = compile_for_run(mdl, new_tokens=max_new_tokens)
        if why:
            click.echo(f"note: {why}", err=True)
    ids = encode_prompt(tok, prompt, raw=raw)
    stream = TextStream(tok)
    res = api.generate(
        mdl, ids, max_new_tokens=max_new_tokens, window=window, ngram=ngram, guesses=guesses,
        workload=workload, policy=policy, tokenizer=tok, on_tokens=stream,
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, seed=seed, memory=memory, compile=compile_,
    )
    stream.close()
    if stats:
        click.echo(res.stats.summary(), err=True)
    if plot_path:
        from autolade.bench.plots import plot_steps

        click.echo(f"per-step plot: {plot_steps(res.stats, plot_path)}", err=True)

@cli.command("bench")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--sets", default="chat,code", show_default=True, help="comma-separated: chat, code, copy, or workload files")
@click.option("--copy", "add_copy", is_flag=True, help="add the copy-heavy set (HumanEval code to repeat / fix and reprint)")
@click.option("--prompts", "-p", "n_prompts", type=int, default=10, show_default=True, help="prompts per set (0 = all)")
@click.option("--max-new-tokens", "-n", type=int, default=128, show_default=True)
@click.option("--config", "-c", "configs", multiple=True, metavar="W,N,G[,LOOKUP]",
              help="autolade setting to time (repeatable), e.g. 0,0,0,0 (greedy through the loop), 0,4,0,10 (prompt lookup only), 4,4,4,10,drafts=1, "
                   "2,3,2,0,recycle=16,carry=1 (the token recycling table kept from prompt to prompt, as generate() keeps it with the memory on), "
                   "0,4,0,16,pad=1 (steps with nothing to draft pack a filler draft; pad=0 never; absent: as the stored step curve says), "
                   "4,4,4,10,compile=1 (compiled steps at fixed widths on a static cache; compile=0 eager; absent: as the stored curves say), "
                   "2,3,2,0,recycle=16,pairs=0 (the recycling table keeps rows per token only, not per (previous, token) pair); "
                   "default: a small built-in set")
@click.option("--profile", "profiles", multiple=True, metavar="WORKLOAD",
              help="also time the stored profile for this workload (repeatable), e.g. --profile code --profile chat")
@click.option("--heldout", is_flag=True, help="only the prompts `autolade tune` holds out (never tuned on)")
@click.option("--baselines", default="greedy,pld", show_default=True, help="HF methods: greedy (required, the reference), pld, static (a StaticCache + compiled forward), "
                   "assisted (assisted generation with --draft)")
@click.option("--draft", default=None, metavar="MODEL",
              help="the draft model of the assisted baseline (same tokenizer); default: the model's registry sibling, "
                   "e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b")
@click.option("--warmup", type=int, default=1, show_default=True, help="untimed runs of every method on the first prompt")
@click.option("--repeats", "-r", type=int, default=1, show_default=True, help="timed runs per prompt and method; the fastest is kept")
@click.option("--max-minutes", type=float, default=None, help="start no new prompt after this many minutes (report what ran)")
@click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
@click.option("--device", default=None, help="cpu or cuda[:N] (default: where the loader puts it)")
@click.option("--out", "-o", default="out/bench", show_default=True, help="writes OUT.json and OUT.png")
@click.option("--quiet", "-q", is_flag=True, help="no per-prompt progress on stderr")
@clean_errors
def bench_command(model, dtype, sets, add_copy, n_prompts, max_new_tokens, configs, profiles, heldout, baselines, draft, warmup,
                  repeats, max_minutes, threads, device, out, quiet):
    """HF greedy vs HF prompt lookup vs autolade, interleaved prompt by prompt; table, JSON, PNG."""
    from autolade.bench import bench_main
    from autolade.workloads import COPY_SET

    if add_copy and COPY_SET not in sets.split(","):
        sets = f"{sets},{COPY_SET}"
    bench_main(
        model=model, dtype=dtype, sets=sets, prompts=n_prompts or None, max_new_tokens=max_new_tokens,
        configs=configs, profiles=profiles, heldout=heldout, baselines=baselines, warmup=warmup, repeats=repeats, threads=threads, device=device, out=out,
        draft=draft,
        max_seconds=None if max_minutes is None else 60 * max_minutes,
        echo=click.echo, progress=None if quiet else (lambda msg: click.echo(msg, err=True)),
    )


cli.add_command(profile_command)
cli.add_command(profiles_group)
cli.add_command(tune_command)
cli.add_command(accept_command)
cli.add_command(memory_group)
cli.add_command(serve_command)
cli.add_command(batch_command)
