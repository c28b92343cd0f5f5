"""A real PostgreSQL server for the tests, started once per session in a temporary folder.

It comes from the PyPI package ``pgserver`` (PostgreSQL binaries in a wheel; the ``test`` extra installs
it, with the ``psycopg`` driver). The server listens on a Unix socket in its own folder, so
it needs no free port and cannot meet another server; as root, ``pgserver`` runs it as its own system
user. Where it cannot start, tests that use it skip and say why."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def postgres_url():
    """A ``postgresql://`` URL of a fresh, empty database on a server this session started."""
    try:
        import pgserver
    except ImportError:
        pytest.skip("no PostgreSQL for the tests: pgserver is missing (pip install -e '.[test]' installs it)")
    # its own folder, not pytest's (which is private to this user: the server runs as another one)
    data = Path(tempfile.mkdtemp(prefix="autolade-pg-")) / "data"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: no XDG_RUNTIME_DIR (pgserver keeps a lock file there)
            server = pgserver.get_server(data, cleanup_mode="delete")
        server.psql("CREATE DATABASE autolade_test;")
    except Exception as exc:  # binaries that do not run here, no user to run them as, ...
        pytest.skip(f"the PostgreSQL server from pgserver did not start here: {exc}")
    try:
        yield server.get_uri("autolade_test")
    finally:
        server.cleanup()
        shutil.rmtree(data.parent, ignore_errors=True)
