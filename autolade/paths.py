"""Where autolade keeps its state: one user dir, overridable by AUTOLADE_HOME."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "AUTOLADE_HOME"


def user_dir() -> Path:
    """The user dir (``$AUTOLADE_HOME`` or ``~/.cache/autolade``), created on first use."""
    raw = os.environ.get(ENV_VAR)
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "autolade"
    path.mkdir(parents=True, exist_ok=True)
    return path


def repo_profiles_dir() -> Path:
    """The top-level ``profiles/`` folder of a source checkout (shared, committed profiles)."""
    return Path(__file__).resolve().parent.parent / "profiles"


def repo_policies_dir() -> Path:
    """The top-level ``policies/`` folder: runtime policy presets as JSON data."""
    return Path(__file__).resolve().parent.parent / "policies"
