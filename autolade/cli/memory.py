"""``autolade memory``: what the n-gram memory remembers, where, and how to move or clear it."""

from __future__ import annotations

import click

from autolade.cli.errors import clean_errors


@click.group("memory")
def memory_group() -> None:
    """Earlier answers kept as a draft source (token ids of the model's outputs, per model and workload).

    They live in $AUTOLADE_HOME/memory.db (default ~/.cache/autolade), beside the profile store; `clear` deletes them."""


@memory_group.command("list")
@clean_errors
def memory_list():
    """Where the memory lives and what it holds, per model and workload."""
    from autolade.store.memory import open_memory_store, recycling_summary, summary

    with open_memory_store() as store:
        rows, tables = summary(store), recycling_summary(store)
        click.echo(f"memory in {store.path} (token ids of earlier answers; `autolade memory clear` deletes them)")
    if not rows:
        click.echo("nothing remembered")
    else:
        click.echo(f"{'model':<40} {'workload':<10} {'answers':>7} {'tokens':>8}  first .. last")
        for r in rows:
            click.echo(f"{r['model'][:40]:<40} {r['workload'][:10]:<10} {r['answers']:>7} {r['tokens'] or 0:>8}  "
                       f"{r['first'][:10]} .. {r['last'][:10]}")
    if tables:
        click.echo("token recycling tables (the model's own next-token predictions, drafted from by configs with recycle > 0):")
        for r in tables:
            click.echo(f"{r['model'][:40]:<40} {r['workload'][:10]:<10} {r['known'] or 0:>7} tokens known, saved {(r['updated'] or '')[:10]}")


@memory_group.command("clear")
@click.option("--model", default=None, help="only this model (name or name:config_hash)")
@click.option("--workload", default=None, help="only this workload (chat, code, ...)")
@click.option("--yes", is_flag=True, help="do not ask")
@clean_errors
def memory_clear(model, workload, yes):
    """Delete remembered answers (all of them, or one model's / workload's)."""
    from autolade.store.memory import clear, matching_keys, open_memory_store
    from autolade.workloads import workload_tag

    tag = workload_tag(workload) if workload else None
    with open_memory_store() as store:
        keys = matching_keys(store, model) if model else [None]
        what = f"{'all models' if model is None else ', '.join(keys) or model}, {tag or 'all workloads'}"
        if model and not keys:
            click.echo(f"nothing remembered for model {model!r}")
            return
        if not yes:
            click.confirm(f"delete the remembered answers and token recycling tables of {what} from {store.path}?",
                          abort=True)
        n = sum(clear(store, model_key=k, workload=tag) for k in keys)
    click.echo(f"deleted {n} remembered answers and their token recycling tables ({what})")


@memory_group.command("export")
@click.option("--model", required=True, help="model name or name:config_hash (see `autolade memory list`)")
@click.option("--workload", required=True, help="workload tag")
@click.option("--output", "-o", type=click.Path(dir_okay=False), required=True)
@clean_errors
def memory_export(model, workload, output):
    """Write one model's memory of one workload as autolade-memory JSON."""
    from autolade.errors import ProfileError
    from autolade.store.memory import export_memory, matching_keys, open_memory_store
    from autolade.workloads import workload_tag

    with open_memory_store() as store:
        keys = matching_keys(store, model)
        if len(keys) != 1:
            raise ProfileError(f"model {model!r} names {len(keys)} remembered models ({', '.join(keys) or 'none'}); "
                               "give the full name:config_hash from `autolade memory list`")
        n = export_memory(store, model_key=keys[0], workload=workload_tag(workload), path=output)
    click.echo(f"wrote {n} answers to {output}")


@memory_group.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@clean_errors
def memory_import(files):
    """Add autolade-memory JSON files to this machine's memory (each file all or nothing; an answer already
    remembered for the file's model and workload is not added again)."""
    from autolade.store.access import require_writable
    from autolade.store.memory import import_memory, memory_path, open_memory_store

    require_writable(memory_path(), "import into")  # before the read-only open's warning
    with open_memory_store() as store:
        store.check_writable("import into")
        for f in files:
            new, already = import_memory(f, store)
            click.echo(f"imported {new} new answers from {f} ({already} already in the memory)")
