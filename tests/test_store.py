"""The SQLite profile store, its lookup order and the JSON sharing format (the schema: test_migrations.py)."""

from __future__ import annotations

import copy
import hashlib
import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from autolade.config import LookaheadConfig
from autolade.errors import ProfileError, StoreError
from autolade.records.curve import StepCurve
from autolade.store.db import (
    MIGRATIONS,
    Profile,
    ProfileStore,
    applied_migrations,
    export_profile,
    import_profile,
    model_key,
    profile_to_json,
)

HW = "cpu:AMD-EPYC:t2:avx512_bf16"
HW_CLASS = "cpu:AuthenticAMD:f26:avx512_bf16"
MODEL = model_key("smollm2-135m", "0123456789ab")
CURVE = StepCurve(points={128: {1: 40.0, 2: 36.0, 4: 41.0}}, dtype="bfloat16")


def make_profile(**changes) -> Profile:
    base = dict(
        hardware_fingerprint=HW,
        hardware_class=HW_CLASS,
        hardware_summary="2-core EPYC",
        model_name="smollm2-135m",
        model_config_hash="0123456789ab",
        dtype="bfloat16",
        workload="code",
        settings=LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=6, prompt_lookup_drafts=1),
        policy={"name": "adaptive", "grow_at": 0.5},
        speedup=1.4,
        tokens_per_s=35.0,
        baseline_tokens_per_s=25.0,
        prompt_set="humaneval[:20]",
        created="2026-01-02T03:04:05+00:00",
        step_curve=CURVE.to_dict(),
    )
    base.update(changes)
    return Profile(**base)


def find(store: ProfileStore, **changes):
    args = dict(hardware_fingerprint=HW, hardware_class=HW_CLASS, model_fingerprint=MODEL, dtype="bfloat16", workload="code")
    args.update(changes)
    return store.find_profile(**args)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- rows --------------------------------------------------------------------------------


def test_save_get_list_remove():
    store = ProfileStore(":memory:")
    first = store.save(make_profile())
    second = store.save(make_profile(workload="chat", hardware_fingerprint="cpu:other:t4:avx2", hardware_class="cpu:x:f1:avx2"))
    got = store.get(first)
    assert got.id == first and got == make_profile(id=first)
    assert got.curve.ks == [1, 2, 4] and got.model_fingerprint == MODEL
    assert [p.id for p in store.list()] == [first, second]
    assert [p.id for p in store.list(workload="chat")] == [second]
    assert [p.id for p in store.list(hardware=HW_CLASS)] == [first]
    assert [p.id for p in store.list(model="smollm2-135m")] == [first, second]
    assert [p.id for p in store.list(model=MODEL, workload="code")] == [first]
    store.remove(first)
    assert [p.id for p in store.list()] == [second]
    with pytest.raises(StoreError, match=f"no profile #{first}"):
        store.get(first)
    with pytest.raises(StoreError, match=f"no profile #{first}"):
        store.remove(first)


def test_file_store_uses_autolade_home_and_wal(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    with ProfileStore() as store:
        assert store.path == tmp_path / "home" / "autolade.db"
        store.save(make_profile())
        assert store.db.journal_mode == "wal"
    with ProfileStore() as again:  # reopening migrates nothing and keeps the rows
        assert len(again.list()) == 1


def test_curves():
    store = ProfileStore(":memory:")
    fp = {"name": "smollm2-135m", "config_hash": "0123456789ab", "dtype": "bfloat16"}
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16") is None
    store.save_curve(CURVE, hardware_fingerprint=HW, hardware_class=HW_CLASS, model_name="smollm2-135m", model_config_hash="0123456789ab")
    newer = StepCurve(points={128: {1: 30.0, 2: 31.0}}, dtype="bfloat16")
    store.save_curve(newer, hardware_fingerprint=HW, hardware_class=HW_CLASS, model_name="smollm2-135m", model_config_hash="0123456789ab")
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16").points == newer.points
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=MODEL, dtype="float32") is None
    # a newer curve whose repeats scattered does not displace a clean one
    scattered = StepCurve(points={128: {1: 90.0, 2: 31.0}}, spread={128: {1: 4.0, 2: 0.1}}, dtype="bfloat16")
    store.save_curve(scattered, hardware_fingerprint=HW, model_name="smollm2-135m", model_config_hash="0123456789ab")
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16").points == newer.points
    # the dict from autolade.machine.models.model_fingerprint works too, and its dtype must match the curve's
    store.save_curve(CURVE, hardware_fingerprint="cpu:other", model_fingerprint=fp, dtype="bfloat16")
    assert store.latest_curve(hardware_fingerprint="cpu:other", model_fingerprint=MODEL, dtype="bfloat16").points == CURVE.points
    with pytest.raises(ProfileError, match="differs"):
        store.save_curve(CURVE, hardware_fingerprint=HW, model_fingerprint=fp, dtype="float32")
    with pytest.raises(ProfileError, match="needs model_fingerprint"):
        store.save_curve(CURVE, hardware_fingerprint=HW)


def test_compiled_curves_are_kept_apart():
    store = ProfileStore(":memory:")
    fp = {"name": "smollm2-135m", "config_hash": "0123456789ab", "dtype": "bfloat16"}
    eager = StepCurve(points={128: {1: 30.0, 2: 31.0}}, dtype="bfloat16")
    compiled = StepCurve(points={128: {1: 10.0, 8: 12.0}}, dtype="bfloat16", compiled=True)
    store.save_curve(eager, hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16")
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16", compiled=True) is None
    store.save_curve(compiled, hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16")
    # the newer compiled curve does not displace the eager one, and is found when asked for
    assert store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16").points == eager.points
    got = store.latest_curve(hardware_fingerprint=HW, model_fingerprint=fp, dtype="bfloat16", compiled=True)
    assert got.points == compiled.points and got.compiled


# --- find_profile ------------------------------------------------------------------------


def write_profile(folder: Path, name: str, profile: Profile) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(profile_to_json(profile))
    return path


def test_find_profile_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared"
    store = ProfileStore(":memory:")
    assert find(store, profile_dirs=[shared]) == (None, "default")

    # same model, same hardware class, other machine: nearest-hardware from a file
    teammate = make_profile(hardware_fingerprint="cpu:AMD-EPYC-9B14:t4:avx512_bf16", created="2026-01-01T00:00:00+00:00")
    write_profile(shared, "teammate.json", teammate)
    profile, source = find(store, profile_dirs=[shared])
    assert source == "file:shared/teammate.json:nearest-hardware" and profile.hardware_fingerprint == teammate.hardware_fingerprint

    # the store's nearest beats a file's nearest
    near_id = store.save(teammate.with_(settings=LookaheadConfig(window=3)))
    assert find(store, profile_dirs=[shared])[1] == f"store:nearest-hardware:#{near_id}"

    # an exact file beats any nearest
    write_profile(shared, "exact.json", make_profile())
    assert find(store, profile_dirs=[shared])[1] == "file:shared/exact.json:exact"

    # the store's exact beats everything; the most recent exact row wins
    old = store.save(make_profile(created="2025-01-01T00:00:00+00:00"))
    new = store.save(make_profile(created="2026-06-01T00:00:00+00:00"))
    profile, source = find(store, profile_dirs=[shared])
    assert source == f"store:exact:#{new}" and profile.id == new and old < new

    # other dtype, workload or model: nothing matches
    assert find(store, dtype="float32", profile_dirs=[shared]) == (None, "default")
    assert find(store, workload="chat", profile_dirs=[shared]) == (None, "default")
    assert find(store, model_fingerprint="smollm2-135m:ffffffffffff", profile_dirs=[shared]) == (None, "default")
    # nor other hardware of another class
    assert find(store, hardware_fingerprint="cuda:NVIDIA-H200", hardware_class="cuda:NVIDIA-H200", profile_dirs=[shared]) == (None, "default")


def test_lookup_skips_invalid_files_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "bad.json").write_text('{"format": "autolade-profile", "version": 1}')
    (shared / "notjson.json").write_text("{nope")
    write_profile(shared, "good.json", make_profile())
    with pytest.warns(UserWarning, match="skipping profile file"):
        profile, source = find(ProfileStore(":memory:"), profile_dirs=[shared])
    assert source == "file:shared/good.json:exact"


def test_lookup_reads_repo_profiles_dir():
    # the repo's profiles/ is searched by default; whatever it holds must be valid
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile, source = find(ProfileStore(":memory:"), model_fingerprint="no-such-model:000000000000")
    assert (profile, source) == (None, "default")


# --- JSON --------------------------------------------------------------------------------


def test_export_import_round_trip():
    profile = make_profile(id=7)
    data = json.loads(profile_to_json(profile))
    assert data["format"] == "autolade-profile" and data["version"] == 1
    assert "id" not in data
    back = import_profile(data)
    assert back == profile.with_(id=None)
    assert data["measured"]["compiled"] is None  # not recorded: measured before compiled steps existed
    for compiled in (True, False):  # the steps it was measured on, through JSON and the store
        shared = import_profile(json.loads(profile_to_json(profile.with_(compiled=compiled, id=None))))
        assert shared.compiled is compiled
        with ProfileStore(":memory:") as store:
            assert store.get(store.save(shared)).compiled is compiled
    del data["measured"]["compiled"]  # a file from before the field
    assert import_profile(data).compiled is None


def mutate(path: str, value):
    data = export_profile(make_profile())
    target = data
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[key]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("format", "something-else", "format must be 'autolade-profile'"),
        ("version", 2, "version 2 is not supported"),
        ("hardware", KeyError, "missing field 'hardware'"),
        ("hardware.fingerprint", KeyError, "missing field 'hardware.fingerprint'"),
        ("model.dtype", KeyError, "missing field 'model.dtype'"),
        ("model.dtype", "int4", "dtype must be one of"),
        ("workload", 5, "field 'workload' must be string"),
        ("workload", "has spaces and /", "workload must be a short tag"),
        ("settings", [1, 2], "field 'settings' must be object"),
        ("settings.window", 10**6, "settings: window=1000000 is beyond"),
        ("settings.window", "4", "settings: window must be an integer"),
        ("settings.bogus", 1, "settings: unknown decoding setting"),
        ("measured.speedup", 1e9, "speedup must be a finite number in"),
        ("measured.speedup", float("nan"), "speedup must be a finite number in"),
        ("measured.speedup", -1.0, "speedup must be a finite number in"),
        ("measured.speedup", True, "field 'measured.speedup' must be number"),
        ("measured.tokens_per_s", "fast", "field 'measured.tokens_per_s' must be number"),
        ("policy", {"grow": 1}, "policy must be an object with a string 'name'"),
        ("created", "yesterday", "created must be an ISO 8601 date"),
        ("step_curve", {"points": {"128": {"2": 1.0}}}, "k=1"),
        ("measured.compiled", "yes", "measured.compiled must be true, false or null"),
        ("measured.compiled", 1, "measured.compiled must be true, false or null"),
    ],
)
def test_import_rejects(path, value, message):
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace("[", r"\[")):
        import_profile(mutate(path, value))


def test_import_rejects_non_objects():
    for data in (None, [], "x", 3):
        with pytest.raises(ProfileError, match="must be a JSON object"):
            import_profile(copy.deepcopy(data))


def test_profile_validates_on_construction():
    with pytest.raises(ProfileError, match="speedup"):
        make_profile(speedup=float("inf"))
    with pytest.raises(ProfileError, match="settings must be a LookaheadConfig"):
        make_profile(settings={"window": 4})


# --- bad files ---------------------------------------------------------------------------


def test_corrupt_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "autolade.db"
    path.write_bytes(b"this is not a database\n" * 50)
    before = sha(path)
    with pytest.raises(StoreError, match="is not an SQLite database") as info:
        ProfileStore(path)
    assert str(path) in str(info.value) and "AUTOLADE_HOME" in str(info.value)
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autolade.db"]


def test_damaged_sqlite_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "autolade.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    before = sha(path)
    with pytest.raises(StoreError, match="corrupt") as info:
        ProfileStore(path)
    assert str(path) in str(info.value)
    assert sha(path) == before


def test_foreign_database_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("create table users (id integer primary key, name text)")
    conn.execute("insert into users (name) values ('ann')")
    conn.commit()
    conn.close()
    before = sha(path)
    with pytest.raises(StoreError, match="autolade did not create") as info:
        ProfileStore(path)
    assert "users" in str(info.value) and str(path) in str(info.value)
    assert sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no -wal, no -shm


def test_foreign_migrations_table_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("create table _migrations (id integer, version text)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="autolade did not create"):
        ProfileStore(path)


def test_locked_database_times_out_with_a_clear_error(tmp_path):
    path = tmp_path / "autolade.db"
    store = ProfileStore(path, busy_timeout=0.2)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        with pytest.raises(StoreError, match="locked by another process"):
            store.save(make_profile())
        with pytest.raises(StoreError, match="locked by another process"):
            ProfileStore(tmp_path / "autolade.db", busy_timeout=0.2).save(make_profile())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.save(make_profile()) == 1  # works again once released


# --- concurrency -------------------------------------------------------------------------


def _writer(path: str, tag: str, count: int, barrier) -> None:
    barrier.wait()  # both open the fresh file at once: migrations must run exactly once
    store = ProfileStore(path)
    for i in range(count):
        store.save(make_profile(workload=f"{tag}-{i}"))
    store.close()


def test_two_processes_saving_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "autolade.db")
    # fork: the children inherit the imports (spawn would re-import torch via autolade, seconds each)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, tag, 40, barrier)) for tag in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0]
    store = ProfileStore(path)
    rows = store.list()
    assert len(rows) == 80 and len({p.id for p in rows}) == 80
    assert {p.workload for p in rows} == {f"{t}-{i}" for t in "ab" for i in range(40)}
    assert applied_migrations(store.db) == [name for name, _ in MIGRATIONS]


def _held_open_then_killed(path: str, opened, closed) -> None:
    """A process that keeps one store open (as `autolade accept` does), opens a second in passing (as each
    generate() does to read settings), saves after another process closed its own, and dies without closing."""
    import os

    store = ProfileStore(path)
    ProfileStore(path).close()
    opened.set()
    closed.wait(60)
    store.save(make_profile(workload="saved-before-the-kill"))
    os._exit(0)  # killed: no close, no checkpoint; what was committed must still be there


def test_a_store_held_open_keeps_its_saves_when_another_process_closes_one(tmp_path):
    """Closing a plain descriptor of the database file drops every POSIX lock the process holds on it: the
    store's old header check did that, so another process's close deleted the WAL under a store held open and
    its next saves were lost (a killed `accept --recount` kept none of its rows)."""
    path = str(tmp_path / "autolade.db")
    ProfileStore(path).close()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    opened, closed = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_held_open_then_killed, args=(path, opened, closed))
    proc.start()
    assert opened.wait(60)
    ProfileStore(path).close()  # another process (a `profiles list`) opens and closes the store meanwhile
    assert (tmp_path / "autolade.db-wal").exists(), "the WAL of a store held open must survive another's close"
    closed.set()
    proc.join(60)
    assert proc.exitcode == 0
    assert [p.workload for p in ProfileStore(path).list()] == ["saved-before-the-kill"]
