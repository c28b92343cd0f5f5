"""The store's schema: append-only migrations, applied once, rolled back whole on failure."""

from __future__ import annotations

import pytest
import sqlite_utils

from autolade.store.migrations import MIGRATIONS, applied_migrations, migrate


def test_migrations_are_append_only():
    # Never edit, remove or reorder these: only append. A database records what it applied.
    assert [name for name, _ in MIGRATIONS][:3] == ["0001_profiles", "0002_curves", "0003_indexes"]


def test_migrate_in_memory():
    db = sqlite_utils.Database(memory=True)
    assert migrate(db) == [name for name, _ in MIGRATIONS]
    assert applied_migrations(db) == [name for name, _ in MIGRATIONS]
    assert {"profiles", "curves", "_migrations"} <= set(db.table_names())
    assert migrate(db) == []  # idempotent


def test_migrate_applies_only_what_is_missing():
    db = sqlite_utils.Database(memory=True)
    assert migrate(db, MIGRATIONS[:1]) == ["0001_profiles"]
    assert "curves" not in db.table_names()
    assert migrate(db) == [name for name, _ in MIGRATIONS[1:]]
    later = (*MIGRATIONS, ("0099_test_column", lambda d: d["profiles"].add_column("extra", str)))
    assert migrate(db, later) == ["0099_test_column"]
    assert "extra" in db["profiles"].columns_dict
    assert applied_migrations(db)[-1] == "0099_test_column"


def test_failed_migration_rolls_back():
    db = sqlite_utils.Database(memory=True)
    migrate(db)

    def broken(d):
        d["profiles"].add_column("half", str)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        migrate(db, (*MIGRATIONS, ("0099_broken", broken)))
    assert "0099_broken" not in applied_migrations(db)
    assert "half" not in db["profiles"].columns_dict


def test_the_pair_rows_column_is_added_to_a_recycling_table_that_has_rows():
    db = sqlite_utils.Database(memory=True)
    upto = [name for name, _ in MIGRATIONS].index("0006_recycling") + 1
    migrate(db, MIGRATIONS[:upto])
    db["recycling"].insert({"model_fingerprint": "m:1", "workload": "chat", "k": 1, "vocab_size": 4, "known": 0,
                            "rows": b"", "hits": "{}"})
    assert migrate(db) == [name for name, _ in MIGRATIONS[upto:]]
    assert db["recycling"].get(("m:1", "chat"))["pairs"] is None  # saved before pair rows: NULL
