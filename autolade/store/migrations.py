"""The store's schema: append-only migrations, recorded in ``_migrations``, applied in one write transaction.

Never edit or reorder one, only append: a user's file has run the old ones, and a column a later
migration adds is NULL in the rows written before it (readers treat NULL as "saved before this").
The profile store (``autolade.db``) and the memory (``memory.db``) share the schema.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator

import sqlite_utils

from autolade.records.profile import now_iso


def _m0001_profiles(db: sqlite_utils.Database) -> None:
    db["profiles"].create(
        {
            "id": int,
            "hardware_fingerprint": str,
            "hardware_class": str,
            "hardware_summary": str,
            "model_name": str,
            "model_config_hash": str,
            "model_fingerprint": str,
            "dtype": str,
            "workload": str,
            "settings": str,  # LookaheadConfig as JSON
            "policy": str,  # JSON or NULL
            "speedup": float,
            "tokens_per_s": float,
            "baseline_tokens_per_s": float,
            "prompt_set": str,
            "created": str,
            "autolade_version": str,
            "step_curve": str,  # StepCurve JSON or NULL
            "notes": str,
        },
        pk="id",
        not_null={"hardware_fingerprint", "hardware_class", "model_name", "model_fingerprint", "dtype", "workload", "settings"},
    )


def _m0002_curves(db: sqlite_utils.Database) -> None:
    db["curves"].create(
        {
            "id": int,
            "hardware_fingerprint": str,
            "hardware_class": str,
            "hardware_summary": str,
            "model_name": str,
            "model_config_hash": str,
            "model_fingerprint": str,
            "dtype": str,
            "curve": str,  # StepCurve JSON
            "created": str,
            "autolade_version": str,
        },
        pk="id",
        not_null={"hardware_fingerprint", "model_fingerprint", "dtype", "curve"},
    )


def _m0003_indexes(db: sqlite_utils.Database) -> None:
    db["profiles"].create_index(["model_fingerprint", "dtype", "workload", "hardware_fingerprint"], index_name="idx_profiles_exact")
    db["profiles"].create_index(["model_fingerprint", "dtype", "workload", "hardware_class"], index_name="idx_profiles_class")
    db["curves"].create_index(["model_fingerprint", "dtype", "hardware_fingerprint"], index_name="idx_curves_key")


def _m0004_acceptance(db: sqlite_utils.Database) -> None:
    db["acceptance"].create(
        {
            "id": int,
            "model_name": str,
            "model_config_hash": str,
            "model_fingerprint": str,
            "tokenizer_fingerprint": str,
            "workload": str,
            "dtype": str,
            "acceptance_table": str,  # AcceptanceTable JSON
            "created": str,
            "autolade_version": str,
        },
        pk="id",
        not_null={"model_fingerprint", "tokenizer_fingerprint", "workload", "dtype", "acceptance_table"},
    )
    db["acceptance"].create_index(["model_fingerprint", "tokenizer_fingerprint", "workload", "dtype"], index_name="idx_acceptance_key")


def _m0005_memory(db: sqlite_utils.Database) -> None:
    db["memory"].create(
        {
            "id": int,
            "model_fingerprint": str,  # name:config_hash
            "workload": str,
            "tokens": str,  # one answer's token ids, JSON list
            "n_tokens": int,
            "source": str,  # "generate", "import:<file>"
            "created": str,
            "autolade_version": str,
        },
        pk="id",
        not_null={"model_fingerprint", "workload", "tokens"},
    )
    db["memory"].create_index(["model_fingerprint", "workload", "id"], index_name="idx_memory_key")


def _m0006_recycling(db: sqlite_utils.Database) -> None:
    db["recycling"].create(
        {
            "model_fingerprint": str,  # name:config_hash
            "workload": str,
            "k": int,  # next tokens kept per token
            "vocab_size": int,  # the model's vocabulary: every id below it
            "known": int,  # tokens with a row
            "rows": bytes,  # zlib of little-endian int32 [known, 1 + k]: a token id, then its k next tokens (-1: none)
            "hits": str,  # JSON {"hits": [k numbers], "seen": number}: how often the next token sat at each rank
            "updated": str,
            "autolade_version": str,
        },
        pk=("model_fingerprint", "workload"),
        not_null={"model_fingerprint", "workload", "k", "vocab_size", "rows", "hits"},
    )


def _m0007_recycling_pairs(db: sqlite_utils.Database) -> None:
    # zlib of little-endian int32 [p, 2 + k]: a previous token, a token, then the k next tokens after the two;
    # least recently predicted first (NULL: saved before pair rows, none)
    db["recycling"].add_column("pairs", bytes)


def _m0008_profile_compiled(db: sqlite_utils.Database) -> None:
    # the steps a profile was measured or priced on: 1 compiled, 0 eager (NULL: not recorded, from before compiled steps)
    db["profiles"].add_column("compiled", int)


Migration = tuple[str, Callable[[sqlite_utils.Database], None]]
MIGRATIONS: tuple[Migration, ...] = (
    ("0001_profiles", _m0001_profiles),
    ("0002_curves", _m0002_curves),
    ("0003_indexes", _m0003_indexes),
    ("0004_acceptance", _m0004_acceptance),
    ("0005_memory", _m0005_memory),
    ("0006_recycling", _m0006_recycling),
    ("0007_recycling_pairs", _m0007_recycling_pairs),
    ("0008_profile_compiled", _m0008_profile_compiled),
)


def applied_migrations(db: sqlite_utils.Database) -> list[str]:
    if "_migrations" not in db.table_names():
        return []
    return [row["name"] for row in db.query("select name from _migrations order by rowid")]


def migrate(db: sqlite_utils.Database, migrations: Iterable[Migration] = MIGRATIONS) -> list[str]:
    """Apply the migrations not yet recorded, in order, in one write transaction. Returns their names.

    ``BEGIN IMMEDIATE`` takes the write lock before reading what is applied, so two processes
    opening a fresh file at once migrate it exactly once.
    """
    newly = []
    with immediate(db.conn):
        db.execute("create table if not exists _migrations (name text primary key, applied text not null)")
        done = set(applied_migrations(db))
        for name, apply in migrations:
            if name in done:
                continue
            apply(db)
            db.execute("insert into _migrations (name, applied) values (?, ?)", [name, now_iso()])
            newly.append(name)
    return newly


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error. sqlite-utils calls inside nest as savepoints."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
