"""Where autolade keeps its state (one user dir, overridable by AUTOLADE_HOME) and finds its shipped data."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "AUTOLADE_HOME"


def user_dir() -> Path:
    """The user dir (``$AUTOLADE_HOME`` or ``~/.cache/autolade``), created on first use where it can be: on a
    read-only filesystem it is returned as it is, and the stores in it read as empty (see docs/operations.md)."""
    raw = os.environ.get(ENV_VAR)
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "autolade"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # read-only: whoever writes there says so (ProfileStore opens read-only)
    return path


def repo_profiles_dir() -> Path:
    """The shipped ``profiles/`` folder (shared, committed profiles): see ``shipped_dir``."""
    return shipped_dir("profiles")


def repo_policies_dir() -> Path:
    """The shipped ``policies/`` folder: runtime policy presets as JSON data. See ``shipped_dir``."""
    return shipped_dir("policies")


def shipped_dir(name: str) -> Path:
    """A data folder that ships with autolade (``"profiles"`` or ``"policies"``).

    A wheel carries it as ``autolade/_shipped/<name>`` (pyproject.toml maps the checkout's
    top-level folder there); a source checkout or an editable install reads the top-level
    ``<name>/`` folder next to the ``autolade`` package.
    """
    package = Path(__file__).resolve().parent
    packaged = package / "_shipped" / name
    return packaged if packaged.is_dir() else package.parent / name
