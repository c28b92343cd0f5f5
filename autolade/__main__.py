"""``python3 -m autolade``: the same as the ``autolade`` command."""

from autolade.cli.main import cli

cli()
