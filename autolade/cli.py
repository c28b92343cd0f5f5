"""The ``autolade`` command. Thin: parse, call the library, turn domain errors into clean messages."""

from __future__ import annotations

import functools
import sys

import click

from .errors import AutoladeError


def clean_errors(fn):
    """Domain errors become one readable line and exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AutoladeError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)

    return wrapper


@click.group()
@click.version_option(package_name="autolade")
def cli() -> None:
    """Exact lookahead decoding for Hugging Face causal LMs, tuned to this machine."""


# --- generate / bench (engine) -------------------------------------------------------------

# --- profile / profiles (hardware + store) -------------------------------------------------

# --- tune ----------------------------------------------------------------------------------


def main() -> None:  # pragma: no cover - console entry
    cli()
