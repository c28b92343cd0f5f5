from autolade.cli.main import cli

__all__ = ["cli"]
