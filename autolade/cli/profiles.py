"""``autolade profile`` (this machine's step curve and predicted profiles) and ``autolade profiles ...``
(the tuned profiles in the store, and sharing them as JSON)."""

from __future__ import annotations

import click

from autolade.cli.errors import clean_errors


@click.command("profile")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="registry name, hub alias, HF dir, cached hub id or .gguf")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="write the step-latency curve as a PNG")
@click.option("--quick", is_flag=True, help="fewer k values, one context, shorter benchmarks (a rough picture)")
@click.option("--verify", type=int, default=0, show_default=True, metavar="N",
              help="time each prediction against greedy and HF prompt lookup on N held-out prompts; store greedy if it loses")
@click.option("--compile", "compile_", is_flag=True,
              help="also time the compiled step (torch.compile at a few fixed widths); generate() compiles where it pays")
@clean_errors
def profile_command(model, dtype, plot, quick, verify, compile_):
    """Profile this hardware and MODEL's step-latency curve; save the curve in the store, and per
    workload the setting an acceptance table predicts best on it (a "predicted" profile)."""
    from autolade.tuning.profile_workflow import profile_machine

    if verify < 0:
        raise click.BadParameter("--verify must be 0 (off) or a number of prompts")
    profile_machine(model=model, dtype=dtype, quick=quick, verify=verify, plot=plot, echo=click.echo,
                    log=lambda m: click.echo(m, err=True), compile=compile_)


@click.group("profiles")
def profiles_group() -> None:
    """Tuned profiles in this machine's store (AUTOLADE_HOME), and sharing them as JSON."""


@profiles_group.command("list")
@click.option("--hardware", default=None, help="hardware fingerprint or class")
@click.option("--model", default=None, help="model name or name:config_hash")
@click.option("--workload", default=None, help="workload tag")
@clean_errors
def profiles_list(hardware, model, workload):
    """What this machine has learned, per hardware/model/workload."""
    from autolade.store.db import ProfileStore

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
    from autolade.store.db import ProfileStore, profile_to_json

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

    from autolade.store.db import ProfileStore, profile_to_json

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
    from autolade.errors import ProfileError
    from autolade.paths import user_dir
    from autolade.store.access import require_writable
    from autolade.store.db import DB_NAME, ProfileStore, read_profile_file

    require_writable(user_dir() / DB_NAME, "import into")  # before the read-only open's warning
    rejected = 0
    with ProfileStore() as store:
        store.check_writable("import into")
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

    from autolade.records.acceptance import FORMAT, read_acceptance_file

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
    from autolade.store.db import ProfileStore

    with ProfileStore() as store:
        store.remove(profile_id)
    click.echo(f"removed #{profile_id}")
