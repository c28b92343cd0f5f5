"""A home this process really cannot write, even when the tests run as root.

Root ignores file modes, so ``read_only(home)`` does what an unprivileged user on a read-only share
sees: it makes ``home`` and everything in it read-only (dirs 0o555, files 0o444) and, as root, also
switches the effective user to ``nobody`` while inside (``os.seteuid``; the real user stays root, so
it switches back). SQLite and ``os.access(..., effective_ids=True)`` then refuse writes for real: the
store's own read-only path runs, not a stand-in. The home must be reachable by ``nobody`` (pytest's
``tmp_path`` is under a 0o700 dir): ``readable_home`` makes one under the system temp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import autolade

NOBODY = 65534
PACKAGE = Path(autolade.__file__).resolve().parent


@contextlib.contextmanager
def readable_home(monkeypatch) -> Iterator[Path]:
    """A fresh AUTOLADE_HOME that any user can read (removed after)."""
    home = Path(tempfile.mkdtemp(prefix="autolade-ro-"))
    home.chmod(0o755)
    monkeypatch.setenv("AUTOLADE_HOME", str(home))
    try:
        yield home
    finally:
        for path in [home, *home.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def read_only(home: Path) -> Iterator[None]:
    """While inside, this process cannot write ``home`` or anything in it; modes are restored after."""
    modes = {p: p.stat().st_mode & 0o7777 for p in [home, *home.rglob("*")] if not p.is_symlink()}
    for path in modes:
        path.chmod(0o555 if path.is_dir() else 0o444)
    root = os.geteuid() == 0
    try:
        if root:
            os.seteuid(NOBODY)
            if not os.access(PACKAGE, os.R_OK | os.X_OK, effective_ids=True):
                # a checkout under a 0o700 folder (`git clone . "$(mktemp -d)/x"`): nobody cannot even import
                # autolade's lazily loaded modules there, so no read-only home can be tested from it
                pytest.skip(f"{PACKAGE} is not readable by uid {NOBODY}: clone into a folder others can read")
        yield
    finally:
        if root:
            os.seteuid(0)
        for path, mode in modes.items():
            path.chmod(mode)
