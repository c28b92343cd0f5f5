"""Domain errors at the CLI's edge: one readable line, never a traceback."""

from __future__ import annotations

import functools
import sys

import click

from autolade.errors import AutoladeError


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
