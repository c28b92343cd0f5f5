"""``python3 -m autolade``: the same as the ``autolade`` command."""

from .cli import cli

cli()
