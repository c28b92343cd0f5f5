"""autolade.store.memory: remembered answers in the store, shared by processes, exported and imported."""

from __future__ import annotations

import json
import multiprocessing as mp
import zlib

import numpy as np
import pytest
import torch

from autolade.errors import ProfileError
from autolade.store.db import ProfileStore
from autolade.store.memory import (
    MemoryBank,
    add_answers,
    clear,
    decode_recycling,
    encode_recycling,
    export_memory,
    import_memory,
    read_memory_file,
    recycling_summary,
    summary,
)

MODEL = "tiny:abc123"


def _add_many(path: str, offset: int, n: int) -> None:
    bank = MemoryBank(path)
    bank.memory(model_key=MODEL, workload="code", vocab_size=10_000)
    for i in range(n):
        assert bank.remember(model_key=MODEL, workload="code", tokens=[offset + i, 1, 2, 3]) is None


def test_a_remembered_answer_drafts_in_another_bank(tmp_path):
    db = tmp_path / "a.db"
    one = MemoryBank(db)
    mem, note = one.memory(model_key=MODEL, workload="code", vocab_size=100)
    assert mem is not None and len(mem) == 0 and note.startswith("0 answers")
    assert one.remember(model_key=MODEL, workload="code", tokens=[5, 6, 7, 8, 9]) is None
    assert len(mem) == 1  # this process sees it at once
    other, _ = MemoryBank(db).memory(model_key=MODEL, workload="code", vocab_size=100)
    assert other.answers() == [(5, 6, 7, 8, 9)]
    assert other.drafts([5, 6])[0] == [(7, 8)]
    # another workload or model is another memory
    assert len(MemoryBank(db).memory(model_key=MODEL, workload="chat", vocab_size=100)[0]) == 0


def test_two_processes_adding_at_once_lose_nothing(tmp_path):
    db = str(tmp_path / "shared.db")
    ProfileStore(db).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(db, 1000 * (k + 1), 25)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    mem, _ = MemoryBank(db).memory(model_key=MODEL, workload="code", vocab_size=10_000)
    firsts = sorted(a[0] for a in mem.answers())
    assert firsts == sorted([1000 + i for i in range(25)] + [2000 + i for i in range(25)])


def test_a_bank_picks_up_answers_another_process_saved_later(tmp_path):
    db = tmp_path / "a.db"
    mine = MemoryBank(db)
    mem, _ = mine.memory(model_key=MODEL, workload="chat", vocab_size=100)
    MemoryBank(db).remember(model_key=MODEL, workload="chat", tokens=[1, 2, 3])
    mine.remember(model_key=MODEL, workload="chat", tokens=[4, 5, 6])
    mem, _ = mine.memory(model_key=MODEL, workload="chat", vocab_size=100)
    assert sorted(mem.answers()) == [(1, 2, 3), (4, 5, 6)]


def test_disk_keeps_the_newest_answers_per_key(tmp_path):
    with ProfileStore(tmp_path / "a.db") as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[i, i + 1] for i in range(10)], keep=4, source="t")
        (row,) = summary(store)
        assert row["answers"] == 4 and row["tokens"] == 8
    mem, _ = MemoryBank(tmp_path / "a.db").memory(model_key=MODEL, workload="code", vocab_size=100)
    assert [a[0] for a in mem.answers()] == [6, 7, 8, 9]


def test_rows_that_are_not_token_ids_are_skipped_and_named(tmp_path):
    db = tmp_path / "a.db"
    with ProfileStore(db) as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[1, 2, 3]], source="t")
        store.db["memory"].insert({"model_fingerprint": MODEL, "workload": "code", "tokens": "{not json", "n_tokens": 0})
        store.db["memory"].insert({"model_fingerprint": MODEL, "workload": "code", "tokens": "[1, 99999]", "n_tokens": 2})
        before = list(store.db.query("select * from memory order by id"))
    mem, note = MemoryBank(db).memory(model_key=MODEL, workload="code", vocab_size=100)
    assert mem.answers() == [(1, 2, 3)]
    assert "skipped 2" in note and "autolade memory clear" in note
    with ProfileStore(db) as store:  # left untouched
        assert list(store.db.query("select * from memory order by id")) == before


def test_an_unreadable_store_turns_the_memory_off_with_a_reason(tmp_path):
    bad = tmp_path / "autolade.db"
    bad.write_bytes(b"this is not sqlite at all" * 10)
    bank = MemoryBank(bad)
    mem, note = bank.memory(model_key=MODEL, workload="code", vocab_size=100)
    assert mem is None and note.startswith("off:") and "not an SQLite database" in note
    assert "not remembered" in bank.remember(model_key=MODEL, workload="code", tokens=[1, 2])
    assert bad.read_bytes() == b"this is not sqlite at all" * 10


def test_clear_by_workload_and_all(tmp_path):
    with ProfileStore(tmp_path / "a.db") as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[1], [2]], source="t")
        add_answers(store, model_key=MODEL, workload="chat", answers=[[3]], source="t")
        assert clear(store, workload="code") == 2
        assert [r["workload"] for r in summary(store)] == ["chat"]
        assert clear(store) == 1
        assert summary(store) == []


def test_export_import_round_trip(tmp_path):
    src, dst = tmp_path / "src.db", tmp_path / "dst.db"
    with ProfileStore(src) as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[1, 2, 3], [4, 5]], source="t")
        assert export_memory(store, model_key=MODEL, workload="code", path=tmp_path / "m.json", vocab_size=100) == 2
    data = read_memory_file(tmp_path / "m.json")
    assert data["answers"] == [[1, 2, 3], [4, 5]] and data["vocab_size"] == 100
    with ProfileStore(dst) as store:
        assert import_memory(tmp_path / "m.json", store, model_key=MODEL, vocab_size=100) == (2, 0)
    mem, _ = MemoryBank(dst).memory(model_key=MODEL, workload="code", vocab_size=100)
    assert mem.answers() == [(1, 2, 3), (4, 5)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": "autolade-memory", "version": 1, "model": "m", "workload": "code", "answers": [[1, 2', "truncated"),
        ('{"format": "autolade-profile", "version": 1}', "not an autolade memory file"),
        ('{"format": "autolade-memory", "version": 9, "model": "m", "workload": "c", "answers": [[1]]}', "version 9"),
        ('{"format": "autolade-memory", "version": 1, "model": "m", "workload": "c", "answers": [[1, -4]]}', "answer 0"),
        ('{"format": "autolade-memory", "version": 1, "model": "m", "workload": "c", "vocab_size": 10, "answers": [[1, 12]]}',
         "answer 0"),
        ('{"format": "autolade-memory", "version": 1, "model": "m", "workload": "c", "answers": [["__import__"]]}', "answer 0"),
    ],
)
def test_bad_files_are_refused_and_the_store_is_untouched(tmp_path, content, message):
    f = tmp_path / "m.json"
    f.write_text(content)
    with ProfileStore(tmp_path / "a.db") as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[7, 8]], source="t")
        with pytest.raises(ProfileError, match=message):
            import_memory(f, store)
        assert [r["answers"] for r in summary(store)] == [1]


def test_a_memory_of_another_model_or_tokenizer_is_refused(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"format": "autolade-memory", "version": 1, "model": "other:1", "workload": "code",
                             "answers": [[1, 500]]}))
    with ProfileStore(tmp_path / "a.db") as store:
        with pytest.raises(ProfileError, match="not 'tiny:abc123'"):
            import_memory(f, store, model_key=MODEL)
        with pytest.raises(ProfileError, match="another tokenizer"):
            import_memory(f, store, vocab_size=100)
        assert summary(store) == []


# --- the token recycling table, saved beside the answers -------------------------------------------


def _teach(table, vocab=100, seed=0):
    """Packs 12 tokens (each after a previous one) and their [12, vocab] logits into ``table``, and records
    a few rank hits."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(vocab, generator=g)
    table.observe(order[:12].tolist(), torch.randn(12, vocab, generator=g), previous=order[12:24].tolist())
    for rank in (0, 0, 2, None):
        table.hits.record(rank)


def test_a_saved_recycling_table_is_what_the_next_process_starts_from(tmp_path):
    db = tmp_path / "a.db"
    one = MemoryBank(db)
    table, note = one.recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert table.known == 0 and note == ""  # nothing saved yet
    assert one.save_recycled(model_key=MODEL, workload="chat", vocab_size=100) is None  # empty: nothing written
    with ProfileStore(db) as store:
        assert recycling_summary(store) == []
    _teach(table)
    assert one.save_recycled(model_key=MODEL, workload="chat", vocab_size=100) is None
    again, note = MemoryBank(db).recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert note == "12 of them saved by earlier runs" and again.known == 12
    assert again.k == table.k and all(np.array_equal(a, b) for a, b in zip(again.known_rows(), table.known_rows()))
    assert all(np.array_equal(again.row(t), table.row(t)) for t in range(100))
    assert all(np.array_equal(a, b) for a, b in zip(again.known_pairs(), table.known_pairs()))  # oldest first
    assert len(again.pairs) == 12
    assert again.hits.hits == table.hits.hits and again.hits.seen == table.hits.seen == 4
    assert MemoryBank(db).recycled(model_key=MODEL, workload="code", vocab_size=100)[0].known == 0  # its own key
    assert one.recycled(model_key=MODEL, workload="chat", vocab_size=100) == (table, "")  # read once per process
    with ProfileStore(db) as store:
        (row,) = recycling_summary(store)
        assert (row["model"], row["workload"], row["known"]) == (MODEL, "chat", 12)
        assert clear(store, workload="chat") == 0 and recycling_summary(store) == []  # cleared with the answers


def test_next_tokens_past_the_vocabulary_are_not_saved():
    from autolade.engine.recycle import NextTokenTable

    table = NextTokenTable(k=2)
    logits = torch.zeros(2, 120)
    logits[0, 110], logits[0, 5] = 2.0, 1.0  # token 7: top 110 (past a 100-id vocabulary), then 5
    logits[1, 6], logits[1, 105] = 2.0, 1.0  # token 8: top 6, then 105
    table.observe([7, 8], logits)
    back = decode_recycling(encode_recycling(table, vocab_size=100), vocab_size=100)
    assert back.known == 1 and back.row(8).tolist() == [6, -1] and back.row(7).tolist() == [-1, -1]


def test_a_table_saved_before_pair_rows_loads_without_them(tmp_path):
    row = _saved_row()
    del row["pairs"]
    db = tmp_path / "a.db"
    with ProfileStore(db) as store:
        store.db["recycling"].insert({"model_fingerprint": MODEL, "workload": "chat", **row})
        assert store.db["recycling"].get((MODEL, "chat"))["pairs"] is None  # the column 0007 added: NULL
    table, note = MemoryBank(db).recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert table.known == 12 and table.pairs == {} and note == "12 of them saved by earlier runs"


def _blob(rows):
    return zlib.compress(np.array(rows, dtype="<i4").tobytes())


def _saved_row(**changes):
    from autolade.engine.recycle import NextTokenTable

    table = NextTokenTable()
    _teach(table)
    return {**encode_recycling(table, vocab_size=100), **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vocab_size": 50}, "vocabulary of 50 ids"),
        ({"k": 0}, "k must be"),
        ({"rows": b"not zlib at all"}, "do not decompress"),
        ({"rows": "text"}, "not a blob"),
        ({"rows": zlib.compress(b"\x01\x00\x00")}, "not whole rows"),
        ({"rows": _blob([[150] + [1] * 8])}, "token ids"),
        ({"rows": _blob([[3] + [1] * 8, [3] + [2] * 8])}, "token ids"),  # one id twice
        ({"rows": _blob([[3, -1] + [1] * 7])}, "next tokens"),
        ({"rows": _blob([[3, 400] + [1] * 7])}, "next tokens"),
        ({"rows": zlib.compress(bytes(4 * 9 * 101))}, "not whole rows"),  # more rows than ids
        ({"pairs": b"not zlib"}, "pair rows do not decompress"),
        ({"pairs": "text"}, "pair rows are not a blob"),
        ({"pairs": _blob([[1, 2] + [3] * 8, [1, 2] + [4] * 8])}, "repeat a"),
        ({"pairs": _blob([[1, 100] + [3] * 8])}, "pair rows' token ids"),
        ({"pairs": _blob([[1, 2, -1] + [3] * 7])}, "pair rows' next tokens"),
        ({"pairs": zlib.compress(b"\x01" * 20)}, "pair rows hold 20 bytes"),
        ({"hits": "{broken"}, "rank hits"),
        ({"hits": '{"hits": [1, 2], "seen": 4}'}, "8 counts"),
        ({"hits": '{"hits": [9, 0, 0, 0, 0, 0, 0, 0], "seen": 4}'}, "8 counts"),
        ({"hits": '{"hits": [1, 0, 0, 0, 0, 0, 0, 0], "seen": NaN}'}, "8 counts"),
    ],
)
def test_a_damaged_or_foreign_saved_table_is_refused_by_field(changes, message):
    with pytest.raises(ProfileError, match=message):
        decode_recycling(_saved_row(**changes), vocab_size=100)


def test_a_bad_saved_table_is_not_used_and_the_next_save_replaces_it(tmp_path):
    db = tmp_path / "a.db"
    with ProfileStore(db) as store:
        store.db["recycling"].insert({"model_fingerprint": MODEL, "workload": "chat",
                                      **_saved_row(rows=b"damaged")})
    bank = MemoryBank(db)
    table, note = bank.recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert table.known == 0 and "not used (its rows do not decompress" in note and "autolade memory clear" in note
    _teach(table, seed=3)
    assert bank.save_recycled(model_key=MODEL, workload="chat", vocab_size=100) is None
    assert MemoryBank(db).recycled(model_key=MODEL, workload="chat", vocab_size=100)[0].known == 12


def test_an_unreadable_store_leaves_the_recycling_table_in_the_process(tmp_path):
    bad = tmp_path / "autolade.db"
    bad.write_bytes(b"this is not sqlite at all" * 10)
    bank = MemoryBank(bad)
    table, note = bank.recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert table.known == 0 and "could not be read" in note
    _teach(table)
    assert "not saved" in bank.save_recycled(model_key=MODEL, workload="chat", vocab_size=100)
    assert bank.recycled(model_key=MODEL, workload="chat", vocab_size=100)[0] is table  # still taught in the process
    assert bad.read_bytes() == b"this is not sqlite at all" * 10


def test_importing_a_file_twice_adds_its_answers_once(tmp_path):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"format": "autolade-memory", "version": 1, "model": MODEL, "workload": "code",
                             "answers": [[1, 2, 3], [4, 5], [4, 5]]}))  # an answer given twice is kept twice
    with ProfileStore(tmp_path / "a.db") as store:
        add_answers(store, model_key=MODEL, workload="code", answers=[[1, 2, 3]], source="generate")
        add_answers(store, model_key=MODEL, workload="chat", answers=[[4, 5]], source="generate")  # another workload
        assert import_memory(f, store) == (2, 1)  # [1, 2, 3] was there already
        assert import_memory(f, store) == (0, 3)
        answers = [json.loads(r["tokens"]) for r in store.db.query(
            "select tokens from memory where workload = 'code' order by id")]
    assert answers == [[1, 2, 3], [4, 5], [4, 5]]


def test_a_read_only_memory_is_drafted_from_and_never_written(monkeypatch):
    from readonly import read_only, readable_home

    from autolade.errors import StoreWarning

    with readable_home(monkeypatch) as home:
        db = home / "memory.db"
        assert MemoryBank(db).remember(model_key=MODEL, workload="code", tokens=[5, 6, 7, 8]) is None
        before = db.read_bytes()
        with read_only(home), pytest.warns(StoreWarning, match="read-only"):
            bank = MemoryBank(db)
            mem, note = bank.memory(model_key=MODEL, workload="code", vocab_size=100)
            assert mem is not None and mem.answers() == [(5, 6, 7, 8)] and mem.drafts([5, 6])[0] == [(7, 8)]
            assert "read only" in note and "could not be read" not in note and bank.read_only
            assert "read-only" in bank.remember(model_key=MODEL, workload="code", tokens=[1, 2])
        assert db.read_bytes() == before and sorted(p.name for p in home.iterdir()) == ["memory.db"]
