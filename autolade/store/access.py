"""Whether this process may write a store file, opening one read-only, and saying so once.

A home this process cannot write (a read-only mount, another user's files, a shared cache) still
holds profiles, curves and remembered answers worth reading. ``ProfileStore`` opens such a file
read-only: ``not_writable`` says why before anything is opened (SQLite in WAL mode writes beside the
file, ``-wal`` and ``-shm``, so the folder must be writable as well as the file), and where that
check is fooled, SQLite's own refusal (``is_refusal``) leads to the same place. ``connect_read_only``
opens with ``mode=ro``, and where SQLite cannot even create the shared-memory file a WAL reader
needs, with ``immutable=1`` (no locks, no WAL read: what the file itself holds).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import warnings
from pathlib import Path

from autolade.errors import StoreError, StoreWarning

# what SQLite says when it may not write the file or create the files beside it
REFUSALS = ("readonly database", "unable to open database file", "read-only file system")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def not_writable(path: Path) -> str | None:
    """Why this process cannot write the store file ``path`` (which may not exist yet), or None."""
    effective = os.access in os.supports_effective_ids  # the effective user: what open() checks

    def writable(p: Path) -> bool:
        return os.access(p, os.W_OK | (os.X_OK if p.is_dir() else 0), effective_ids=effective)

    folder = path.parent
    if path.exists():
        if not writable(path):
            return "the file is not writable"
        return None if writable(folder) else f"its folder {folder} is not writable"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if writable(existing):
        return None
    if existing == folder:
        return f"its folder {folder} is not writable"
    return f"its folder {folder} does not exist and cannot be created ({existing} is not writable)"


def read_only_error(path: Path, why: str, action: str = "save to") -> StoreError:
    """The error a write to a read-only store raises: what, why, and the fix."""
    return StoreError(f"cannot {action} {path}: it is read-only here ({why}). Set AUTOLADE_HOME to a writable "
                      "directory (or make this one writable) and run the command again there.")


def require_writable(path: Path, action: str) -> None:
    """``read_only_error`` before anything is opened, when this process cannot write ``path``."""
    why = not_writable(path)
    if why:
        raise read_only_error(path, why, action)


def is_refusal(exc: BaseException) -> bool:
    """Whether an SQLite error says the file (or the files beside it) may not be written."""
    return isinstance(exc, sqlite3.OperationalError) and any(m in str(exc).lower() for m in REFUSALS)


def connect_read_only(path: Path, *, timeout: float) -> sqlite3.Connection:
    """An SQLite connection that can only read ``path`` (an existing file); its first read is done here."""
    uri = path.resolve().as_uri()
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout)
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if not is_refusal(exc):
            raise
    # a WAL file whose -shm cannot be created here: read the file as it is, without locks
    conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=timeout)
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def warn_once(key: str, message: str) -> None:
    """A ``StoreWarning`` with ``message``, the first time this process says it about ``key`` (a file)."""
    with _warned_lock:
        if (key, message) in _warned:
            return
        _warned.add((key, message))
    warnings.warn(message, StoreWarning, stacklevel=3)
