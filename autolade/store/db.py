"""The profile store: one SQLite file (``user_dir()/autolade.db``) of tuned profiles and step curves.

- Schema by append-only migrations (``migrations.py``), recorded in ``_migrations``: never edit one, only append.
- WAL mode and a busy timeout, so two processes saving at once lose nothing.
- A file that is not SQLite, or an SQLite file autolade did not create, is refused with a
  ``StoreError`` and left exactly as it was.
- A file this process cannot write (or its folder) is opened read-only (``autolade.store.access``): reads
  work, writes raise a ``StoreError`` naming the fix, and a ``StoreWarning`` says so once per file.
- ``find_profile()`` is what settings resolution calls: exact (hardware, model, dtype, workload) first, then
  the same model on the nearest hardware (same hardware class), from the store and from JSON
  files in the repo's ``profiles/`` (and any extra dirs); else ``(None, "default")``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from autolade.config import LookaheadConfig
from autolade.errors import ProfileError, StoreError
from autolade.paths import repo_profiles_dir, user_dir
from autolade.records.acceptance import FORMAT as ACCEPTANCE_FORMAT
from autolade.records.profile import (
    FORMAT,
    VERSION,
    Profile,
    export_profile,
    import_profile,
    model_key,
    profile_from_json,
    profile_to_json,
)
from autolade.store.access import connect_read_only, is_refusal, not_writable, read_only_error, warn_once
from autolade.store.measurements import Measurements
from autolade.store.migrations import MIGRATIONS, applied_migrations, immediate, migrate

__all__ = [
    "FORMAT",
    "VERSION",
    "MIGRATIONS",
    "Profile",
    "ProfileStore",
    "applied_migrations",
    "export_profile",
    "import_profile",
    "migrate",
    "model_key",
    "profile_from_json",
    "profile_to_json",
    "read_profile_file",
]

DB_NAME = "autolade.db"
DEFAULT_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's write to finish


# --- the store ------------------------------------------------------------------------------


class ProfileStore(Measurements):
    """Tuned profiles, step curves and acceptance tables in one SQLite file (the curve and table methods:
    ``autolade.store.measurements.Measurements``).

    ``path=None`` is ``user_dir()/autolade.db`` (``$AUTOLADE_HOME``); ``":memory:"`` is an
    in-memory store (tests).
    """

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                 read_only: bool | None = None) -> None:
        """``read_only``: None opens the file read-only where this process cannot write it or its folder
        (reads work, writes raise a StoreError that names the fix, one StoreWarning per file and process);
        True always (no warning); False never (a StoreError instead)."""
        self.memory = str(path) == ":memory:"
        self.path = Path(":memory:") if self.memory else Path(path) if path is not None else user_dir() / DB_NAME
        self.busy_timeout = busy_timeout
        self.why_read_only = ""  # why this store only reads ("": it writes)
        if self.memory:
            return self._connect(":memory:")
        _refuse_non_sqlite(self.path)
        why = "opened read-only" if read_only else None if read_only is False else not_writable(self.path)
        if why is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                return self._connect(str(self.path))
            except _Refused as exc:  # the file looked writable, but SQLite may not write it
                if read_only is False:
                    raise StoreError(f"could not open {self.path}: {exc}") from None
                why = f"SQLite: {exc}"
        self._open_read_only(why)
        if read_only is None:
            warn_once(str(self.path), f"{self.path} is read-only here ({why}): autolade reads what it holds and saves "
                      "nothing to it. Set AUTOLADE_HOME to a writable directory to save profiles, curves and answers.")

    @property
    def read_only(self) -> bool:
        """Whether this store only reads (``why_read_only`` says why)."""
        return bool(self.why_read_only)

    def _connect(self, target: str) -> None:
        try:
            conn = sqlite3.connect(target, timeout=self.busy_timeout)
        except sqlite3.OperationalError as exc:
            if is_refusal(exc):
                raise _Refused(str(exc)) from None
            raise StoreError(f"could not open {self.path}: {exc}") from None
        try:
            with self.errors_as("open"):
                self.db = sqlite_utils.Database(conn, execute_plugins=False)
                _retry_locked(self._open, timeout=self.busy_timeout)
        except BaseException:
            conn.close()
            raise

    def _open(self) -> None:
        try:
            tables = self.db.table_names()  # first read: fails here if the file is not a database
            self._refuse_foreign(tables)  # before anything writes: a foreign file stays byte-identical
            if not self.memory and self.db.journal_mode != "wal":
                self.db.enable_wal()
            migrate(self.db)
        except sqlite3.OperationalError as exc:
            if is_refusal(exc):
                raise _Refused(str(exc)) from None
            raise

    def _open_read_only(self, why: str) -> None:
        """Read what the file holds, write nothing; no file (or an empty one) reads as an empty store."""
        self.why_read_only = why
        exists = self.path.is_file() and self.path.stat().st_size > 0
        with self.errors_as("open"):
            conn = connect_read_only(self.path, timeout=self.busy_timeout) if exists else sqlite3.connect(":memory:")
        try:
            with self.errors_as("open"):
                self.db = sqlite_utils.Database(conn, execute_plugins=False)
                self._refuse_foreign(self.db.table_names())
                if not exists:
                    migrate(self.db)  # the schema, in memory: every read finds its tables empty
        except BaseException:
            conn.close()
            raise

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> ProfileStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- profiles

    def save(self, profile: Profile) -> int:
        """Insert a profile (validated on construction) and return its new id."""
        row = _profile_row(profile)
        row.pop("id")
        with self.errors_as("save a profile to"), self.writing():
            return self.db["profiles"].insert(row).last_pk

    def get(self, id: int) -> Profile:
        """The profile with this id; StoreError if there is none."""
        with self.errors_as("read"):
            rows = list(self.db.query("select * from profiles where id = ?", [id]))
        if not rows:
            raise StoreError(f"no profile #{id} in {self.path}; `autolade profiles list` shows what is there")
        return _row_profile(rows[0])

    def list(self, *, hardware: str | None = None, model: str | None = None, workload: str | None = None) -> list[Profile]:
        """Stored profiles, oldest first. ``hardware`` matches a fingerprint or class, ``model`` a name or fingerprint."""
        where, args = [], []
        if hardware is not None:
            where.append("(hardware_fingerprint = ? or hardware_class = ?)")
            args += [hardware, hardware]
        if model is not None:
            where.append("(model_name = ? or model_fingerprint = ?)")
            args += [model, model]
        if workload is not None:
            where.append("workload = ?")
            args.append(workload)
        sql = "select * from profiles" + (" where " + " and ".join(where) if where else "") + " order by id"
        with self.errors_as("read"):
            return [_row_profile(row) for row in self.db.query(sql, args)]

    def remove(self, id: int) -> None:
        """Delete one profile; StoreError if there is none."""
        with self.errors_as("remove a profile from"), self.writing():
            cursor = self.db.execute("delete from profiles where id = ?", [id])
        if cursor.rowcount == 0:
            raise StoreError(f"no profile #{id} in {self.path}; `autolade profiles list` shows what is there")

    def find_duplicate(self, profile: Profile) -> int | None:
        """Id of a stored profile with the same key, settings, policy and created date (a re-import)."""
        row = _profile_row(profile)
        sql = (
            "select id from profiles where hardware_fingerprint = ? and model_fingerprint = ? and dtype = ? "
            "and workload = ? and settings = ? and created = ? and coalesce(policy, '') = coalesce(?, '') order by id limit 1"
        )
        args = [row[k] for k in ("hardware_fingerprint", "model_fingerprint", "dtype", "workload", "settings", "created", "policy")]
        with self.errors_as("read"):
            found = list(self.db.query(sql, args))
        return found[0]["id"] if found else None

    def find_profile(
        self,
        *,
        hardware_fingerprint: str,
        hardware_class: str,
        model_fingerprint: str | dict[str, str],
        dtype: str,
        workload: str = "general",
        profile_dirs: Iterable[str | Path] = (),
        include_repo_profiles: bool = True,
    ) -> tuple[Profile | None, str]:
        """The best-matching profile and where it came from.

        Order: exact (hardware fingerprint, model, dtype, workload) in the store, then in JSON
        files; then the same model/dtype/workload on hardware of the same class, store then
        files; within a tier a tuned profile (store or file) beats a predicted one (``autolade
        profile``: notes start with "predicted"), then the store beats files and the most
        recently created wins. Sources read like
        ``store:exact:#12``, ``file:profiles/x.json:nearest-hardware`` or ``default`` (nothing
        matched: the caller falls back to the curve default, see ``latest_curve``).

        ``model_fingerprint`` is ``"name:config_hash"`` or the dict from
        ``autolade.machine.models.model_fingerprint(model)``.
        """
        model_fingerprint = model_key(model_fingerprint) if isinstance(model_fingerprint, dict) else model_fingerprint
        sql = (
            "select * from profiles where model_fingerprint = ? and dtype = ? and workload = ? "
            "and {col} = ? order by (coalesce(notes, '') like 'predicted%') asc, created desc, id desc limit 1"
        )
        dirs = [*([repo_profiles_dir()] if include_repo_profiles else []), *profile_dirs]
        files: list[tuple[Profile, str]] | None = None  # read only when the store has no tuned match
        for tier, column, value in (
            ("exact", "hardware_fingerprint", hardware_fingerprint),
            ("nearest-hardware", "hardware_class", hardware_class),
        ):
            with self.errors_as("read"):
                rows = list(self.db.query(sql.format(col=column), [model_fingerprint, dtype, workload, value]))
            stored = _row_profile(rows[0]) if rows else None
            if stored is not None and not _is_predicted(stored):
                return stored, f"store:{tier}:#{stored.id}"
            if files is None:
                files = list(_profile_files(dirs))
            matches = [
                (profile, label)
                for profile, label in files
                if profile.model_fingerprint == model_fingerprint
                and profile.dtype == dtype
                and profile.workload == workload
                and getattr(profile, column) == value
            ]
            # a tuned profile (store or file) beats one predicted from an acceptance table; then the store's
            shared = max(matches, key=lambda m: (not _is_predicted(m[0]), m[0].created)) if matches else None
            if shared is not None and (stored is None or not _is_predicted(shared[0])):
                return shared[0], f"file:{shared[1]}:{tier}"
            if stored is not None:
                return stored, f"store:{tier}:#{stored.id}"
        return None, "default"

    # -- transactions and errors (also for autolade.store.measurements and autolade.store.memory)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One write transaction that takes the write lock up front (waiting up to busy_timeout).

        A deferred transaction that reads first can fail at once with SQLITE_BUSY in WAL mode
        when another process commits in between; BEGIN IMMEDIATE waits instead.
        """
        self.check_writable()
        with immediate(self.db.conn):
            yield

    def check_writable(self, action: str = "save to") -> None:
        """A StoreError naming the fix when this store only reads."""
        if self.why_read_only:
            raise read_only_error(self.path, self.why_read_only, action)

    @contextlib.contextmanager
    def errors_as(self, action: str) -> Iterator[None]:
        """SQLite errors inside the block as a StoreError that reads "could not {action} {path}: ..."."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            message = str(exc)
            if is_refusal(exc):
                raise read_only_error(self.path, f"SQLite: {message}", action) from None
            if "locked" in message or "busy" in message:
                raise StoreError(
                    f"could not {action} {self.path}: the database is locked by another process "
                    f"(waited {self.busy_timeout:g} s). Retry when the other autolade process is done."
                ) from None
            raise StoreError(f"could not {action} {self.path}: {message}") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"could not {action} {self.path}: {exc} (the file is corrupt or not an autolade database). "
                "autolade leaves it untouched: move it aside, or point AUTOLADE_HOME at another directory."
            ) from None

    # -- internals

    def _refuse_foreign(self, tables: list[str]) -> None:
        if not tables:
            return
        foreign = "_migrations" not in tables
        if not foreign:
            columns = set(self.db["_migrations"].columns_dict)
            foreign = columns != {"name", "applied"} or MIGRATIONS[0][0] not in applied_migrations(self.db)
        if foreign:
            shown = ", ".join(sorted(tables)[:8]) + (", ..." if len(tables) > 8 else "")
            raise StoreError(
                f"{self.path} is an SQLite database that autolade did not create (tables: {shown}); "
                "autolade leaves it untouched. Point AUTOLADE_HOME at another directory, or move that file aside."
            )


class _Refused(Exception):
    """SQLite may not write the file or create the files beside it (the store then opens read-only)."""


def _retry_locked(fn: Callable[[], None], *, timeout: float) -> None:
    """Run fn, retrying while SQLite says locked/busy, up to ``timeout`` seconds.

    Needed at open: ``PRAGMA journal_mode=wal`` (and a read during another process's WAL
    setup) can fail at once with "database is locked" without waiting on the busy handler.
    """
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            message = str(exc)
            if ("locked" not in message and "busy" not in message) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _refuse_non_sqlite(path: Path) -> None:
    """A non-empty file that is not an SQLite database is refused before it is ever opened to write.

    Read through SQLite (read-only), never with a plain ``open()``: closing a plain descriptor of a database
    file drops every POSIX lock this process holds on it, so a store already open in this process (the one
    ``autolade accept`` or ``tune`` keeps while ``generate()`` opens its own to read settings) lost its locks;
    another process closing the store then deleted the WAL under it, and what it saved next was lost
    (measured: a killed `accept --recount` kept none of its saved rows; SQLite's "How To Corrupt" 2.2).
    SQLite's own connections share their locks within a process."""
    if not path.exists():
        return
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a profile database")
    try:
        if path.stat().st_size == 0:
            return
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=DEFAULT_BUSY_TIMEOUT)
        try:
            conn.execute("select count(*) from sqlite_master").fetchone()
        finally:
            conn.close()
    except OSError as exc:
        raise StoreError(f"cannot read profile database {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc) and "encrypted" not in str(exc):
            return  # locked, unreadable -shm, malformed pages: the real open says what and how to fix it
        raise StoreError(
            f"{path} is not an SQLite database (corrupt, or another kind of file); autolade leaves it untouched. "
            "Move it aside (e.g. mv it to a .bak name) or point AUTOLADE_HOME at another directory."
        ) from None


# --- rows <-> profiles ----------------------------------------------------------------------


def _profile_row(p: Profile) -> dict[str, Any]:
    return {
        "id": p.id,
        "hardware_fingerprint": p.hardware_fingerprint,
        "hardware_class": p.hardware_class,
        "hardware_summary": p.hardware_summary,
        "model_name": p.model_name,
        "model_config_hash": p.model_config_hash,
        "model_fingerprint": p.model_fingerprint,
        "dtype": p.dtype,
        "workload": p.workload,
        "settings": json.dumps(p.settings.to_dict(), sort_keys=True),
        "policy": json.dumps(p.policy, sort_keys=True) if p.policy is not None else None,
        "speedup": p.speedup,
        "tokens_per_s": p.tokens_per_s,
        "baseline_tokens_per_s": p.baseline_tokens_per_s,
        "prompt_set": p.prompt_set,
        "created": p.created,
        "autolade_version": p.autolade_version,
        "step_curve": json.dumps(p.step_curve, allow_nan=False) if p.step_curve is not None else None,
        "compiled": None if p.compiled is None else int(p.compiled),
        "notes": p.notes,
    }


def _row_profile(row: dict[str, Any]) -> Profile:
    try:
        return Profile(
            id=row["id"],
            hardware_fingerprint=row["hardware_fingerprint"],
            hardware_class=row["hardware_class"],
            hardware_summary=row["hardware_summary"] or "",
            model_name=row["model_name"],
            model_config_hash=row["model_config_hash"],
            dtype=row["dtype"],
            workload=row["workload"],
            settings=LookaheadConfig.from_dict(json.loads(row["settings"])),
            policy=json.loads(row["policy"]) if row["policy"] is not None else None,
            speedup=row["speedup"],
            tokens_per_s=row["tokens_per_s"],
            baseline_tokens_per_s=row["baseline_tokens_per_s"],
            prompt_set=row["prompt_set"],
            created=row["created"],
            autolade_version=row["autolade_version"],
            step_curve=json.loads(row["step_curve"]) if row["step_curve"] is not None else None,
            compiled=None if row.get("compiled") is None else bool(row["compiled"]),
            notes=row["notes"] or "",
        )
    except (ProfileError, ValueError, TypeError) as exc:
        raise StoreError(f"stored profile #{row.get('id')} is invalid: {exc}") from None


# --- JSON files -----------------------------------------------------------------------------


def _profile_files(dirs: Iterable[str | Path]) -> Iterator[tuple[Profile, str]]:
    """Valid profiles from ``*.json`` in each dir, with a readable label. Invalid files warn and are skipped."""
    seen: set[Path] = set()
    for folder in dirs:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            resolved = path.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            label = file_label(path)
            try:
                text = path.read_text(encoding="utf-8")
                if _format_of(text) == ACCEPTANCE_FORMAT:
                    continue  # an acceptance table: autolade.store.tables.shipped_tables reads those
                yield profile_from_json(text, source=label), label
            except (OSError, UnicodeDecodeError, ProfileError) as exc:
                warnings.warn(f"skipping profile file {label}: {exc}", stacklevel=3)


def _format_of(text: str) -> Any:
    """The ``format`` field of a JSON object, or None (not JSON, not an object: the reader says why)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data.get("format") if isinstance(data, dict) else None


def file_label(path: Path) -> str:
    """Path relative to the repo root (``profiles/x.json``) or the cwd where possible, else absolute."""
    resolved = path.resolve()
    for base in (repo_profiles_dir().parent, Path.cwd()):
        try:
            return str(resolved.relative_to(base.resolve()))
        except ValueError:
            continue
    return str(resolved)


def read_profile_file(path: str | Path) -> Profile:
    """One JSON profile file, validated; ProfileError names the file and the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from None
    return profile_from_json(text, source=str(path))


def _is_predicted(profile: Profile) -> bool:
    """Whether ``autolade profile`` chose this profile from an acceptance table (not measured by a tune)."""
    return (profile.notes or "").startswith("predicted")
