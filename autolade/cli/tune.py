"""``autolade tune`` (the Optuna search of this machine's best setting) and ``autolade accept``
(measuring acceptance tables, hardware-free)."""

from __future__ import annotations

import click

from autolade.cli.errors import clean_errors


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


@click.command("tune")
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
def tune_command(model, dtype, workload, trials, budget, storage, study_name, max_new_tokens, tune_prompts, holdout_prompts,
                 no_policy, no_paper, memory, report_png):
    """Search W/N/G (and the runtime policy) for this machine, model and workload; save the winner."""
    from autolade import api
    from autolade.machine.hardware import probe_hardware
    from autolade.machine.models import model_fingerprint
    from autolade.machine.step_curve import stored_or_measured
    from autolade.paths import user_dir
    from autolade.store.db import ProfileStore
    from autolade.tuning.dtype_advice import stored_dtype_advice
    from autolade.tuning.search import study_name_for
    from autolade.tuning.search import tune as run_tune
    from autolade.tuning.space import TuneOptions
    from autolade.tuning.study_storage import check_storage
    from autolade.workloads import load_workload, workload_tag

    opts = TuneOptions(trials=trials, budget_s=parse_duration(budget), max_new_tokens=max_new_tokens,
                       tune_prompts=tune_prompts, holdout_prompts=holdout_prompts, search_policy=not no_policy,
                       memory=memory)
    check_storage(storage)  # a bad --storage or --workload fails now, not after the load and the step curve
    load_workload(workload)
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


@click.command("accept")
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
@click.option("--recount", multiple=True, metavar="LABEL",
              help="count only this row of the existing table (-o FILE, else the store's) again, on --prompts prompts "
                   "(more than before); repeatable, e.g. --recount 'lookup 16x3 scaled + recycle 16, priced 0.025'")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="also write the table as shareable JSON")
@clean_errors
def accept_command(model, workload, dtype, n_prompts, max_new_tokens, grid, replay_prompts, traces, recount, output):
    """Measure how many tokens each candidate setting accepts per step (never timed: hardware-free).

    Saved to the store after every setting, so an interrupted run keeps what it measured. With --recount,
    the named rows of the table already made are counted again on more prompts, and rows counted on fewer
    prompts than its replayed ones get their sample scale refreshed (pass --traces to skip the greedy pass)."""
    import platform
    from dataclasses import replace
    from pathlib import Path

    from autolade import api
    from autolade.machine.models import model_fingerprint
    from autolade.records.acceptance import REPLAYED_ON, engine_prompt_set, read_acceptance_file, write_acceptance_file
    from autolade.records.grid import compact_grid, default_grid, lookup_grid, replayable
    from autolade.records.vocab import model_tokenizer_fingerprints
    from autolade.store.db import ProfileStore
    from autolade.tuning.acceptance_measure import empty_table, measure_acceptance
    from autolade.tuning.acceptance_replay import add_replayed_rows, read_traces
    from autolade.workloads import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload, workload_tag

    if n_prompts < 1:
        raise click.BadParameter("--prompts must be at least 1")
    if replay_prompts < 0:
        raise click.BadParameter("--replay-prompts must be 0 (off) or more")
    if max_new_tokens < 1:
        raise click.BadParameter("--max-new-tokens must be at least 1")
    if recount and (replay_prompts or click.get_current_context().get_parameter_source("grid").name != "DEFAULT"):
        raise click.BadParameter("--recount counts named rows of the table already made: drop --grid and --replay-prompts")
    # the tuning split only: the held-out prompts stay unseen by every table, profile and tune (read before
    # the load, so that a bad --workload fails at once)
    tuning = split_workload(load_workload(workload), holdout_fraction=HOLDOUT_FRACTION)[0]
    click.echo(f"loading {model} ({dtype})...", err=True)
    mdl, tok = api.load(model, dtype=dtype)
    ids = [encode_prompt(tok, p.text, kind=p.kind) for p in tuning[:n_prompts]]
    tag = workload_tag(workload)
    grid = {"compact": compact_grid, "lookup": lookup_grid}.get(grid, default_grid)()
    # with --replay-prompts M >= --prompts, replay counts the static prompt-lookup settings: the engine runs the rest
    engine_grid = [g for g in grid if not (replay_prompts >= n_prompts and replayable(g))]
    if not recount:
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

        if recount:
            table = _recount(mdl, tok, resume, recount, tuning, ids=ids, max_new_tokens=max_new_tokens,
                             traces=traces, save=save)
            click.echo(f"saved acceptance table ({len(table.rows)} settings) to {store.path}")
            if output:
                click.echo(f"wrote {output}")
            return
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


def _recount(mdl, tok, table, labels, tuning, *, ids, max_new_tokens, traces, save):
    """``accept --recount``: the named rows of ``table`` counted on ``ids`` (the first prompts of ``tuning``),
    then the sample scales of rows counted on fewer prompts than the replayed ones made again."""
    from autolade.records.acceptance import REPLAYED_ON
    from autolade.tuning.acceptance_measure import recount_rows
    from autolade.tuning.acceptance_replay import add_replayed_rows, read_traces
    from autolade.workloads import encode_prompt

    if table is None:
        raise click.UsageError("no acceptance table to re-count rows of: run `autolade accept` first (or pass the "
                               "table's file with -o)")
    if max_new_tokens != table.max_new_tokens and click.get_current_context().get_parameter_source(
            "max_new_tokens").name != "DEFAULT":
        raise click.BadParameter(f"the table counts {table.max_new_tokens} new tokens per prompt: pass -n "
                                 f"{table.max_new_tokens} (or leave -n out)")
    click.echo(f"re-counting {len(labels)} rows on {len(ids)} prompts x {table.max_new_tokens} tokens...", err=True)
    table = recount_rows(mdl, ids, table, labels, progress=lambda m: click.echo(m, err=True), on_row=save)
    replayed = [table.row_prompts(r) for r in table.rows if r.counted_by == "replay"]
    if REPLAYED_ON in table.prompt_set and replayed and len(ids) < max(replayed):
        m = max(replayed)
        click.echo(f"refreshing the sample scales against the {m} replayed prompts"
                   f"{'' if traces else ' (one greedy run each: pass --traces to skip it)'}...", err=True)
        more = [encode_prompt(tok, p.text, kind=p.kind) for p in tuning[:m]]
        # the table's own prompt-lookup settings: the scale is their mean, so others would move every row's scale
        table = add_replayed_rows(table, mdl, more, [r.setting for r in table.rows],
                                  progress=lambda msg: click.echo(msg, err=True),
                                  outputs=read_traces(traces) if traces else None)
    save(table)
    return table
