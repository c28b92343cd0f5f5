"""Domain errors. Each says what went wrong and what to do; the CLI prints them without a traceback."""

from __future__ import annotations


class AutoladeError(Exception):
    """Base class for every error autolade raises on purpose."""


class ConfigError(AutoladeError, ValueError):
    """Invalid decoding settings (W/N/G, lengths, sampling arguments)."""


class InputError(AutoladeError, ValueError):
    """Invalid input: empty or over-long prompt, bad token ids."""


class ModelNotFoundError(AutoladeError, LookupError):
    """A model name or path that autolade cannot resolve."""


class ProfileError(AutoladeError, ValueError):
    """A profile (JSON or stored row) that fails validation."""


class StoreError(AutoladeError):
    """The profile database is corrupt, foreign, locked or unwritable."""


class WorkloadError(AutoladeError, ValueError):
    """A workload (prompt set) that cannot be read."""


class StoreWarning(UserWarning):
    """A store autolade went on without, or only read: read-only, corrupt or unreadable (said once per file)."""
