"""autolade.store.db on a home this process cannot write: read what is there, write nothing, say so once.

Split from test_store.py. ``readonly.read_only`` makes the home really read-only, as root too (see there)."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
from readonly import read_only, readable_home
from test_store import make_profile

from autolade.errors import StoreError, StoreWarning
from autolade.paths import user_dir
from autolade.store import db as store_db
from autolade.store.db import ProfileStore


@pytest.fixture
def home(monkeypatch):
    with readable_home(monkeypatch) as path:
        yield path


def snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def test_a_read_only_home_is_read_warned_once_and_never_written(home):
    with ProfileStore() as store:
        pid = store.save(make_profile())
    before = snapshot(home)
    with read_only(home), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ProfileStore() as store:
            assert store.read_only and "not writable" in store.why_read_only
            assert [p.id for p in store.list()] == [pid] and store.get(pid).workload == "code"
            with pytest.raises(StoreError, match="read-only") as info:
                store.save(make_profile(workload="chat"))
            assert "AUTOLADE_HOME" in str(info.value)
        with ProfileStore() as again:  # the second open in this process: no second warning
            assert len(again.list()) == 1
    said = [w for w in caught if issubclass(w.category, StoreWarning)]
    assert len(said) == 1 and "read-only" in str(said[0].message) and "AUTOLADE_HOME" in str(said[0].message)
    assert snapshot(home) == before  # byte-identical, no -wal or -shm left beside it


def test_sqlite_refusing_to_write_falls_back_to_read_only(home, monkeypatch):
    """When the writability check is fooled (it says writable), SQLite's own refusal
    ("attempt to write a readonly database") still opens the store read-only."""
    with ProfileStore() as store:
        store.save(make_profile())
    before = snapshot(home)
    monkeypatch.setattr(store_db, "not_writable", lambda path: None)
    with read_only(home), pytest.warns(StoreWarning, match="read-only"):
        with ProfileStore() as store:
            assert store.read_only and "readonly database" in store.why_read_only
            assert len(store.list()) == 1
    assert snapshot(home) == before


def test_a_read_only_home_without_a_store_reads_as_empty_and_creates_nothing(home):
    with read_only(home), pytest.warns(StoreWarning):
        with ProfileStore() as store:
            assert store.list() == [] and store.read_only
            assert store.path == home / "autolade.db"
    assert list(home.iterdir()) == []


def test_a_home_that_cannot_be_created_reads_as_empty(home, monkeypatch):
    deeper = home / "not" / "there"
    monkeypatch.setenv("AUTOLADE_HOME", str(deeper))
    with read_only(home):
        assert user_dir() == deeper  # no PermissionError
        with pytest.warns(StoreWarning), ProfileStore() as store:
            assert store.list() == []
    assert not deeper.exists()


def test_read_only_on_request_leaves_a_writable_store_alone(home):
    with ProfileStore() as store:
        store.save(make_profile())
    before = snapshot(home)["autolade.db"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        with ProfileStore(read_only=True) as store:
            assert len(store.list()) == 1
            with pytest.raises(StoreError, match="read-only"):
                store.remove(1)
    assert snapshot(home)["autolade.db"] == before  # (a WAL reader may leave an empty -wal and its -shm beside it)
