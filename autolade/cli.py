"""The ``autolade`` command. Thin: parse, call the library, turn domain errors into clean messages."""

from __future__ import annotations

import logging

import click

from .cli_errors import clean_errors
from .cli_memory import memory_group


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
    log = logging.getLogger("autolade.models")
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
@clean_errors
def generate(prompt, model, dtype, max_new_tokens, window, ngram, guesses, workload, policy, plot_path, raw, stats,
             trust_remote_code, do_sample, temperature, top_k, top_p, min_p, repetition_penalty, seed, memory):
    """Generate a completion for PROMPT with exact lookahead decoding."""
    from . import api
    from .prompts import encode_prompt
    from .settings import infer_workload

    workload = workload or infer_workload(prompt)
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype, trust_remote_code=trust_remote_code)
    ids = encode_prompt(tok, prompt, raw=raw)
    stream = TextStream(tok)
    res = api.generate(
        mdl, ids, max_new_tokens=max_new_tokens, window=window, ngram=ngram, guesses=guesses,
        workload=workload, policy=policy, tokenizer=tok, on_tokens=stream,
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        repetition_penalty=repetition_penalty, seed=seed, memory=memory,
    )
    stream.close()
    if stats:
        click.echo(res.stats.summary(), err=True)
    if plot_path:
        from .plots import plot_steps

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
                   "2,3,2,0,recycle=16,pairs=0 (the recycling table keeps rows per token only, not per (previous, token) pair); "
                   "default: a small built-in set")
@click.option("--profile", "profiles", multiple=True, metavar="WORKLOAD",
              help="also time the stored profile for this workload (repeatable), e.g. --profile code --profile chat")
@click.option("--heldout", is_flag=True, help="only the prompts `autolade tune` holds out (never tuned on)")
@click.option("--baselines", default="greedy,pld", show_default=True, help="HF methods: greedy (required, the reference), pld")
@click.option("--warmup", type=int, default=1, show_default=True, help="untimed runs of every method on the first prompt")
@click.option("--repeats", "-r", type=int, default=1, show_default=True, help="timed runs per prompt and method; the fastest is kept")
@click.option("--max-minutes", type=float, default=None, help="start no new prompt after this many minutes (report what ran)")
@click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
@click.option("--device", default=None, help="cpu or cuda[:N] (default: where the loader puts it)")
@click.option("--out", "-o", default="out/bench", show_default=True, help="writes OUT.json and OUT.png")
@click.option("--quiet", "-q", is_flag=True, help="no per-prompt progress on stderr")
@clean_errors
def bench_command(model, dtype, sets, add_copy, n_prompts, max_new_tokens, configs, profiles, heldout, baselines, warmup, repeats,
                  max_minutes, threads, device, out, quiet):
    """HF greedy vs HF prompt lookup vs autolade, interleaved prompt by prompt; table, JSON, PNG."""
    from .bench import bench_main
    from .prompts import COPY_SET

    if add_copy and COPY_SET not in sets.split(","):
        sets = f"{sets},{COPY_SET}"
    bench_main(
        model=model, dtype=dtype, sets=sets, prompts=n_prompts or None, max_new_tokens=max_new_tokens,
        configs=configs, profiles=profiles, heldout=heldout, baselines=baselines, warmup=warmup, repeats=repeats, threads=threads, device=device, out=out,
        max_seconds=None if max_minutes is None else 60 * max_minutes,
        echo=click.echo, progress=None if quiet else (lambda msg: click.echo(msg, err=True)),
    )


# --- profile / profiles (hardware + store) -------------------------------------------------

_BOUND_EXAMPLES = ((2, 3, 2), (4, 4, 4), (7, 4, 7), (15, 5, 15))  # W/N/G rows shown by `autolade profile`


@cli.command("profile")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write the step-latency curve as a PNG")
@click.option("--quick", is_flag=True, help="fewer k values, one context, shorter benchmarks (a rough picture)")
@click.option("--verify", type=int, default=0, show_default=True, metavar="N",
              help="time each prediction against greedy and HF prompt lookup on N held-out prompts; store greedy if it loses")
@clean_errors
def profile_command(model, dtype, plot, quick, verify):
    """Profile this hardware and MODEL's step-latency curve; save the curve in the store, and per
    workload the setting an acceptance table predicts best on it (a "predicted" profile)."""
    from .curve import stored_dtype_advice
    from .hardware import measure_step_curve, plot_curve, probe_hardware
    from .models import load, model_fingerprint
    from .store import ProfileStore
    from .tables import find_table
    from .vocab_fingerprint import model_tokenizer_fingerprints

    if verify < 0:
        raise click.BadParameter("--verify must be 0 (off) or a number of prompts")
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = load(model, dtype=dtype)
    device = str(next(mdl.parameters()).device)
    hardware = probe_hardware(device=device, quick=quick)
    click.echo(hardware.summary())
    fp = model_fingerprint(mdl)
    click.echo(f"\nmeasuring step-latency curve of {fp['name']} ({fp['dtype']}, config {fp['config_hash']})...", err=True)
    if quick:
        curve = measure_step_curve(mdl, ks=(1, 2, 4, 8, 16, 32, 64), contexts=(128,), repeats=3, warmup=1, name=fp["name"])
    else:
        curve = measure_step_curve(mdl, name=fp["name"])
    click.echo("\nstep latency, median ms per forward of k packed tokens:")
    click.echo(curve.table())
    for note in curve.notes:
        click.echo(f"note: {note}")
    click.echo(f"\nspare compute: k={curve.spare_compute()} (largest k costing at most 1.25 x c(1))")
    click.echo("speedup upper bound N * c(1)/c(k) (every draft accepted), k = 1 + (N-1)W + G(N-1):")
    for w, n, g in _BOUND_EXAMPLES:
        click.echo(f"  W={w:<2} N={n} G={g:<2} k={1 + (n - 1) * w + g * (n - 1):<4} bound {curve.speedup_bound(w, n, g):.2f}x")
    tok_fp = model_tokenizer_fingerprints(mdl, tok)
    with ProfileStore() as store:
        curve_id = store.save_curve(
            curve,
            hardware_fingerprint=hardware.fingerprint,
            hardware_class=hardware.hardware_class,
            hardware_summary=hardware.summary(),
            model_name=fp["name"],
            model_config_hash=fp["config_hash"],
        )
        click.echo(f"saved step curve #{curve_id} to {store.path}")
        chat_table = None
        for workload in ("chat", "code"):
            table, source = find_table(store, model_fingerprint=fp, tokenizer_fingerprint=tok_fp, workload=workload,
                                       dtype=fp["dtype"])
            if table is None:
                click.echo(f"\n{workload}: {source}; generate() uses the built-in default")
                continue
            chat_table = chat_table or table
            _store_prediction(store, mdl, tok, table, source, curve, hardware, fp, workload, verify)
        recommended, why = stored_dtype_advice(curve, store=store, hardware=hardware, model_fingerprint=fp, table=chat_table)
        click.echo(f"dtype: {recommended} recommended: {why}" if recommended else f"dtype: {why}")
    if plot:
        click.echo(f"wrote {plot_curve(curve, plot)}")


_SHOWN_PREDICTIONS = 5  # settings `autolade profile` lists per workload, plus greedy


def _store_prediction(store, mdl, tok, table, source, curve, hardware, fp, workload, verify) -> None:
    """Print the table's top settings priced on ``curve`` and store the chosen one as a predicted profile."""
    from .config import GREEDY
    from .predict import format_predictions
    from .profile_format import Profile
    from .tables import PREDICTED, policy_spec, predicted_note, predicted_settings, verify_prediction

    best, ranked = predicted_settings(table, curve)
    shown = ranked[:_SHOWN_PREDICTIONS] + [p for p in ranked[_SHOWN_PREDICTIONS:] if p.setting.greedy]
    click.echo(f"\n{workload}: predicted speedup from acceptance table {source}, at context {table.context_median}:")
    click.echo(format_predictions(shown))
    config, policy, notes, speedup = best.setting.config, policy_spec(best.setting), predicted_note(best, table, source), None
    if verify:
        holds, speedup, vs_pld = verify_prediction(mdl, tok, workload=workload, prediction=best, prompts=verify,
                                                   cost=curve.cost)
        click.echo(f"verified on {verify} held-out prompts: {best.setting.label} {speedup:.2f}x greedy, "
                   f"{vs_pld:.2f}x HF prompt lookup")
        if not holds:
            config, policy = GREEDY, None
            notes = f"{PREDICTED} setting {best.setting.label} measured {speedup:.2f}x greedy (< 1.0x): greedy stored. {notes}"
            speedup = None
    profile = Profile(
        hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
        model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=fp["dtype"], workload=workload,
        settings=config, policy=policy, speedup=speedup, prompt_set=table.prompt_set or None,
        hardware_summary=hardware.summary(), step_curve=curve.to_dict(), notes=notes,
    )
    label = "greedy" if config.greedy_only else best.setting.label
    click.echo(f"{workload}: stored predicted profile #{store.save(profile)} ({label})")


@cli.group("profiles")
def profiles_group() -> None:
    """Tuned profiles in this machine's store (AUTOLADE_HOME), and sharing them as JSON."""


@profiles_group.command("list")
@click.option("--hardware", default=None, help="hardware fingerprint or class")
@click.option("--model", default=None, help="model name or name:config_hash")
@click.option("--workload", default=None, help="workload tag")
@clean_errors
def profiles_list(hardware, model, workload):
    """What this machine has learned, per hardware/model/workload."""
    from .store import ProfileStore

    with ProfileStore() as store:
        rows = store.list(hardware=hardware, model=model, workload=workload)
        if not rows:
            click.echo(f"no profiles in {store.path}")
            return
    click.echo(f"{'id':>4}  {'hardware':<34} {'model':<22} {'dtype':<8} {'workload':<10} {'W/N/G/PL':<11} {'speedup':>7} {'tok/s':>7}  created")
    for p in rows:
        s = p.settings
        settings = f"{s.window}/{s.ngram}/{s.guesses}/{s.prompt_lookup}"
        speedup = f"{p.speedup:.2f}x" if p.speedup is not None else "-"
        tps = f"{p.tokens_per_s:.1f}" if p.tokens_per_s is not None else "-"
        click.echo(
            f"{p.id:>4}  {p.hardware_fingerprint[:34]:<34} {p.model_name[:22]:<22} {p.dtype:<8} {p.workload[:10]:<10} "
            f"{settings:<11} {speedup:>7} {tps:>7}  {p.created[:10]}"
        )


@profiles_group.command("show")
@click.argument("profile_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="print the shareable JSON instead")
@clean_errors
def profiles_show(profile_id, as_json):
    """Show one stored profile."""
    from .store import ProfileStore, profile_to_json

    with ProfileStore() as store:
        profile = store.get(profile_id)
    click.echo(profile_to_json(profile) if as_json else profile.describe(), nl=not as_json)


@profiles_group.command("export")
@click.argument("profile_id", type=int)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="file to write (default: stdout)")
@clean_errors
def profiles_export(profile_id, output):
    """Write one profile as shareable JSON (e.g. into the repo's profiles/)."""
    from pathlib import Path

    from .store import ProfileStore, profile_to_json

    with ProfileStore() as store:
        text = profile_to_json(store.get(profile_id))
    if output is None:
        click.echo(text, nl=False)
        return
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text, encoding="utf-8")
    click.echo(f"exported #{profile_id} to {output}")


@profiles_group.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@clean_errors
def profiles_import(files):
    """Import JSON profiles and acceptance tables (validated; a file already imported is not added twice)."""
    from .errors import ProfileError
    from .store import ProfileStore, read_profile_file

    rejected = 0
    with ProfileStore() as store:
        for path in files:
            try:
                if _import_acceptance_file(store, path):
                    continue
                profile = read_profile_file(path)
            except ProfileError as exc:
                rejected += 1
                click.echo(f"rejected {exc}", err=True)
                continue
            what = f"{profile.hardware_fingerprint} / {profile.model_name} {profile.dtype} / {profile.workload}"
            existing = store.find_duplicate(profile)
            if existing is not None:
                click.echo(f"{path}: already in the store as #{existing} ({what})")
                continue
            click.echo(f"{path}: imported as #{store.save(profile)} ({what})")
    if rejected:
        raise click.ClickException(f"{rejected} of {len(files)} file(s) rejected")


def _import_acceptance_file(store, path) -> bool:
    """Store ``path`` if it is an ``autolade-acceptance`` table (validated first: a corrupt one is a
    ProfileError and the store is untouched); False for any other file."""
    import json
    from pathlib import Path

    from .acceptance import FORMAT, read_acceptance_file

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # the profile reader names what is wrong
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return False
    table = read_acceptance_file(path)
    what = f"acceptance table {table.model_fingerprint} {table.dtype} / {table.workload}, {len(table.rows)} settings"
    known = store.find_acceptance(model_fingerprint=table.model_fingerprint, tokenizer_fingerprint=table.tokenizer_fingerprint,
                                  workload=table.workload, dtype=table.dtype)
    if known is not None and known.to_dict() == table.to_dict():
        click.echo(f"{path}: already in the store ({what})")
        return True
    click.echo(f"{path}: imported as acceptance #{store.save_acceptance(table)} ({what})")
    return True


@profiles_group.command("rm")
@click.argument("profile_id", type=int)
@clean_errors
def profiles_rm(profile_id):
    """Delete one stored profile."""
    from .store import ProfileStore

    with ProfileStore() as store:
        store.remove(profile_id)
    click.echo(f"removed #{profile_id}")


# --- tune ----------------------------------------------------------------------------------


def parse_duration(text: str | None) -> float | None:
    """'90s', '20m', '1.5h' or plain seconds -> seconds."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration: use e.g. 90s, 20m or 1.5h") from None


@cli.command()
@click.option("--model", "-m", default="smollm2-135m", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--workload", "-w", default="chat", show_default=True, help="chat, code, or a .jsonl/.txt file of prompts")
@click.option("--trials", type=int, default=40, show_default=True)
@click.option("--budget", default=None, help="stop starting trials after this long (e.g. 20m)")
@click.option("--storage", default=None, help="Optuna storage shared by every worker of the study: sqlite:///PATH (default: the user dir), "
              "journal:PATH (or PATH.log), postgresql://USER@HOST/DB (several machines)")
@click.option("--study", "study_name", default=None, help="study name (default: model-dtype-workload-hardware)")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--tune-prompts", type=int, default=5, show_default=True)
@click.option("--holdout-prompts", type=int, default=8, show_default=True)
@click.option("--no-policy", is_flag=True, help="search static W/N/G only")
@click.option("--no-paper", is_flag=True, help="skip measuring the paper's A100 setting on the held-out split")
@click.option("--memory", is_flag=True, help="trials also draft from this model's n-gram memory of the workload "
              "(read only; each prompt's own earlier answers left out); its own study")
@click.option("--report", "report_png", default=None, help="PNG report path (default: user dir)")
@clean_errors
def tune(model, dtype, workload, trials, budget, storage, study_name, max_new_tokens, tune_prompts, holdout_prompts,
         no_policy, no_paper, memory, report_png):
    """Search W/N/G (and the runtime policy) for this machine, model and workload; save the winner."""
    from . import api
    from .curve import stored_dtype_advice, stored_or_measured
    from .hardware import probe_hardware
    from .models import model_fingerprint
    from .paths import user_dir
    from .prompts import workload_tag
    from .store import ProfileStore
    from .tune import TuneOptions, study_name_for
    from .tune import tune as run_tune

    opts = TuneOptions(trials=trials, budget_s=parse_duration(budget), max_new_tokens=max_new_tokens,
                       tune_prompts=tune_prompts, holdout_prompts=holdout_prompts, search_policy=not no_policy,
                       memory=memory)
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype)
    hardware = probe_hardware(quick=True)
    store = ProfileStore()
    fp = model_fingerprint(mdl)
    curve = stored_or_measured(mdl, store=store, hardware=hardware, log=lambda m: click.echo(m, err=True))
    recommended, why = stored_dtype_advice(curve, store=store, hardware=hardware, model_fingerprint=fp)
    if recommended is not None and recommended != fp["dtype"]:
        click.echo(f"note: {recommended} recommended on this machine ({why}); tuning {fp['dtype']} as asked", err=True)
    name = study_name or study_name_for(hardware.fingerprint, fp["name"], fp["dtype"], workload_tag(workload), memory=memory)
    report_png = report_png or str(user_dir() / "reports" / f"{name}.png")
    res = run_tune(mdl, tok, model_name=fp["name"], workload=workload, options=opts, storage=storage,
                   study_name=name, store=store, hardware=hardware, curve=curve, compare_paper=not no_paper,
                   report_png=report_png, log=lambda m: click.echo(m, err=True))
    click.echo("")
    click.echo(f"{'setting':<34}{'held-out speedup':>18}")
    for cand, ratio in res.finalists:
        mark = " <- best" if cand is res.best else ""
        click.echo(f"{cand.label():<34}{ratio:>17.3f}x{mark}")
    click.echo("")
    click.echo(f"best: {res.best.label()}")
    click.echo(f"held-out: {res.speedup:.3f}x greedy (95% CI {res.ci[0]:.2f}-{res.ci[1]:.2f}), "
               f"{res.vs_pld:.3f}x HF prompt lookup, "
               f"{sum(res.holdout.tokens) / max(sum(res.holdout.steps), 1):.2f} tokens/step, "
               f"{sum(res.holdout.steps)} steps")
    click.echo(f"profile #{res.profile_id} saved; report {res.report_png}; study {res.study_name!r} ({res.trials_run} trials)")


# --- accept (acceptance tables: hardware-free) ----------------------------------------------


@cli.command("accept")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--workload", "-w", default="chat", show_default=True, help="chat, code, or a .jsonl/.txt file of prompts")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--prompts", "-p", "n_prompts", type=int, default=10, show_default=True, help="prompts measured per setting")
@click.option("--max-new-tokens", "-n", type=int, default=128, show_default=True)
@click.option("--grid", type=click.Choice(["full", "compact", "lookup"]), default="full", show_default=True,
              help="candidate settings: full (52), compact (31) or lookup (greedy and static prompt lookup: replay alone counts them)")
@click.option("--replay-prompts", type=int, default=0, show_default=True, metavar="M",
              help="also count the prompt-lookup settings on M prompts by replaying one greedy run each (cheap)")
@click.option("--traces", type=click.Path(dir_okay=False, exists=True), default=None,
              help="greedy outputs of this model and dtype already made (tools/draft_bound.py --save-traces), for the replay")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="also write the table as shareable JSON")
@clean_errors
def accept_command(model, workload, dtype, n_prompts, max_new_tokens, grid, replay_prompts, traces, output):
    """Measure how many tokens each candidate setting accepts per step (never timed: hardware-free).

    Saved to the store after every setting, so an interrupted run keeps what it measured."""
    import platform
    from dataclasses import replace
    from pathlib import Path

    from . import api
    from .acceptance import (
        REPLAYED_ON,
        compact_grid,
        default_grid,
        engine_prompt_set,
        lookup_grid,
        read_acceptance_file,
        replayable,
        write_acceptance_file,
    )
    from .acceptance_measure import empty_table, measure_acceptance
    from .acceptance_replay import add_replayed_rows, read_traces
    from .models import model_fingerprint
    from .prompts import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload, workload_tag
    from .store import ProfileStore
    from .vocab_fingerprint import model_tokenizer_fingerprints

    if n_prompts < 1:
        raise click.BadParameter("--prompts must be at least 1")
    if replay_prompts < 0:
        raise click.BadParameter("--replay-prompts must be 0 (off) or more")
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype)
    # the tuning split only: the held-out prompts stay unseen by every table, profile and tune
    tuning = split_workload(load_workload(workload), holdout_fraction=HOLDOUT_FRACTION)[0]
    ids = [encode_prompt(tok, p.text, kind=p.kind) for p in tuning[:n_prompts]]
    tag = workload_tag(workload)
    grid = {"compact": compact_grid, "lookup": lookup_grid}.get(grid, default_grid)()
    # with --replay-prompts M >= --prompts, replay counts the static prompt-lookup settings: the engine runs the rest
    engine_grid = [g for g in grid if not (replay_prompts >= n_prompts and replayable(g))]
    click.echo(f"measuring {len(engine_grid)} settings on {len(ids)} {tag} prompts x {max_new_tokens} tokens"
               f"{f', {len(grid) - len(engine_grid)} by replay on {replay_prompts}' if len(engine_grid) < len(grid) else ''}...",
               err=True)
    with ProfileStore() as store:
        # an interrupted run resumes: the -o file if it exists (a corrupt one stops here, untouched), else the store
        tfps = model_tokenizer_fingerprints(mdl, tok)
        resume = read_acceptance_file(output) if output and Path(output).exists() else store.find_acceptance(
            model_fingerprint=model_fingerprint(mdl), tokenizer_fingerprint=tfps, workload=tag, dtype=dtype)
        if resume is not None and resume.tokenizer_fingerprint in tfps[1:]:  # a legacy-keyed table resumes re-keyed
            resume = replace(resume, tokenizer_fingerprint=tfps[0])

        def save(table):
            store.save_acceptance(table)
            if output:
                write_acceptance_file(table, output)

        table = measure_acceptance(
            mdl, ids, engine_grid, max_new_tokens=max_new_tokens, workload=tag, tokenizer=tok,
            prompt_set=f"{tag} tuning split[:{len(ids)}]", measured_on=platform.node(),
            progress=lambda m: click.echo(m, err=True), on_row=save, resume_from=resume,
        ) if engine_grid else (resume if resume is not None and resume.max_new_tokens == max_new_tokens else empty_table(
            mdl, tok, workload=tag, max_new_tokens=max_new_tokens, prompts=replay_prompts,
            prompt_set=f"{tag} tuning split[:{replay_prompts}]", measured_on=platform.node()))  # fmt: skip
        if replay_prompts:
            click.echo(f"replaying the prompt-lookup settings over {replay_prompts} greedy outputs...", err=True)
            more = [encode_prompt(tok, p.text, kind=p.kind) for p in tuning[:replay_prompts]]
            table = replace(table, prompt_set=f"{engine_prompt_set(table.prompt_set)}{REPLAYED_ON}{tag} tuning split[:{len(more)}]")
            table = add_replayed_rows(table, mdl, more, grid, progress=lambda m: click.echo(m, err=True),
                                      outputs=read_traces(traces) if traces else None)
            save(table)
        click.echo(f"saved acceptance table ({len(table.rows)} settings, {table.model_fingerprint} {table.dtype} "
                   f"{table.workload}, tokenizer {table.tokenizer_fingerprint}) to {store.path}")
    if output:
        click.echo(f"wrote {output}")


cli.add_command(memory_group)
