"""Where the n-gram memory lives: earlier answers per (model, workload), in an SQLite file beside the store.

The memory holds the model's own outputs, token ids only, in the ``memory`` table of
``$AUTOLADE_HOME/memory.db`` (a file of the store's schema, apart from ``autolade.db`` so that
remembering an answer never touches the profiles), one row per answer: inserts never overwrite, so two processes
adding answers at once lose nothing, and each process picks up the other's rows (by id) the
next time it reads. ``autolade memory clear`` deletes them; ``export``/``import`` move them as
validated JSON (``autolade-memory`` v1), never pickles; an import skips answers already stored for its
model and workload, so a file imported twice is added once. A memory that cannot be read (locked or
corrupt store, rows that are not token ids) is left untouched: decoding goes on without it and
``res.stats.memory`` says why. One this process cannot write (a read-only home) is drafted from and
never written: the note says "read only".

The bank also keeps, per (model, workload), the token recycling table (``NextTokenTable``: the
model's own top-8 next tokens after each token and after each recent (previous, token) pair, and how
often each rank was right) from one
generation to the next, so recycled drafts start from what earlier answers taught. It is read from
the ``recycling`` table of the same file on first use in a process and saved after every answer
the bank remembers (only the tokens that have a row, and the pair rows: int32 ids, zlib-compressed,
tens of KB to ~2 MB), so a
one-shot ``autolade generate`` drafts from what earlier runs taught. It is a cache of the model's
own predictions: processes that write it at once keep the last writer's table (nothing of the
answers is lost), and a saved table that fails its checks (another vocabulary, ids out of range,
a damaged blob) is not used, the reason in ``res.stats.memory``; the next save replaces it.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autolade.engine.memory import AnswerMemory, MemoryConfig
from autolade.engine.recycle import NextTokenTable
from autolade.errors import AutoladeError, ConfigError, ProfileError
from autolade.records.profile import autolade_version, is_number, model_key, now_iso
from autolade.workloads import workload_or_general

FORMAT = "autolade-memory"
VERSION = 1
MEMORY_DB = "memory.db"  # in user_dir(), beside the profile store
KEEP_ANSWERS = 5000  # answers kept on disk per (model, workload); the oldest go first
MAX_ANSWER_TOKENS = 100_000  # one answer longer than this is not an answer: refused on import


@dataclass
class _Loaded:
    memory: AnswerMemory
    last_id: int = 0  # highest row id read
    skipped: list[int] = field(default_factory=list)  # row ids that were not token ids


class MemoryBank:
    """One process's view of the memories in one store: a (model, workload) memory is read on first
    use, topped up with rows other processes added at each later use, and every new answer saved."""

    def __init__(self, path: str | Path | None = None, *, config: MemoryConfig | None = None,
                 keep: int = KEEP_ANSWERS) -> None:
        self.path = path  # None: user_dir() / MEMORY_DB
        self.config = config or MemoryConfig()  # how drafts are matched and sized
        self.keep = keep  # answers kept on disk per key
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._recycled: dict[tuple[str, str], NextTokenTable] = {}  # token recycling tables, this process only
        self.read_only = ""  # why the file only reads, as the last read found ("": it writes)

    def _store(self):
        return open_memory_store(self.path)

    def memory(self, *, model_key: str, workload: str, vocab_size: int) -> tuple[AnswerMemory | None, str]:
        """(memory or None, what happened) for this model and workload, with every stored answer."""
        key = (model_key, workload)
        loaded = self._loaded.setdefault(key, _Loaded(AnswerMemory(self.config)))
        try:
            with self._store() as store:
                self.read_only = store.why_read_only
                rows = list(store.db.query(
                    "select id, tokens from memory where model_fingerprint = ? and workload = ? and id > ? order by id",
                    [model_key, workload, loaded.last_id]))
        except AutoladeError as exc:
            return None, f"off: the memory could not be read ({exc})"
        for row in rows:
            loaded.last_id = row["id"]
            tokens = _tokens(row["tokens"], vocab_size)
            if tokens is None:
                loaded.skipped.append(row["id"])
            else:
                loaded.memory.add(tokens)
        note = f"{len(loaded.memory)} answers ({loaded.memory.tokens} tokens, {workload})"
        if self.read_only:
            note += f", read only ({self.read_only}; nothing is remembered)"
        if loaded.skipped:
            note += (f"; skipped {len(loaded.skipped)} stored rows that are not token ids of this model "
                     f"(`autolade memory clear --workload {workload}` removes them)")
        return loaded.memory, note

    def remember(self, *, model_key: str, workload: str, tokens: list[int]) -> str | None:
        """Save one answer (and add it to this process's memory); the reason if it could not be saved."""
        if not tokens:
            return None
        try:
            with self._store() as store:
                new_id = add_answers(store, model_key=model_key, workload=workload, answers=[tokens], keep=self.keep,
                                     source="generate")
        except AutoladeError as exc:
            return f"the answer was not remembered ({exc})"
        loaded = self._loaded.get((model_key, workload))
        if loaded is not None and new_id == loaded.last_id + 1:  # nobody else wrote in between
            loaded.memory.add(tokens)
            loaded.last_id = new_id
        return None

    def recycled(self, *, model_key: str, workload: str, vocab_size: int) -> tuple[NextTokenTable, str]:
        """(this process's token recycling table for the model and workload, what happened): read from the
        store on first use (empty if none is saved or the saved one fails its checks: the note says why);
        a generation that drafts from it also teaches it, and ``save_recycled`` writes it back."""
        key = (model_key, workload)
        if key in self._recycled:
            return self._recycled[key], ""
        table, note = NextTokenTable(), ""
        try:
            with self._store() as store:
                rows = list(store.db.query("select * from recycling where model_fingerprint = ? and workload = ?",
                                           [model_key, workload]))
        except AutoladeError as exc:
            note = f"the saved token recycling table could not be read ({exc}): starting from an empty one"
            rows = []
        if rows:
            try:
                table = decode_recycling(rows[0], vocab_size=vocab_size)
                note = f"{table.known} of them saved by earlier runs"
            except ProfileError as exc:
                note = (f"the saved token recycling table is not used ({exc}); starting from an empty one, "
                        f"which replaces it (`autolade memory clear --workload {workload}` deletes it)")
        self._recycled[key] = table
        return table, note

    def save_recycled(self, *, model_key: str, workload: str, vocab_size: int) -> str | None:
        """Write this process's table for the key to the store (replacing the saved one); the reason if not."""
        table = self._recycled.get((model_key, workload))
        if table is None or not table.known:
            return None
        row = encode_recycling(table, vocab_size=vocab_size)
        try:
            with self._store() as store, store.errors_as("save the token recycling table to"), store.writing():
                store.db["recycling"].upsert({"model_fingerprint": model_key, "workload": workload, **row},
                                             pk=("model_fingerprint", "workload"))
        except AutoladeError as exc:
            return f"the token recycling table was not saved ({exc})"
        return None


def memory_path() -> Path:
    from autolade.paths import user_dir

    return user_dir() / MEMORY_DB


def open_memory_store(path: str | Path | None = None):
    """The memory's SQLite file (a ``ProfileStore`` of its own; None: ``memory_path()``)."""
    from autolade.store.db import ProfileStore

    return ProfileStore(memory_path() if path is None else path)


@functools.cache
def memory_bank(path: str) -> MemoryBank:
    """The process's bank for the memory file at ``path``; generate() uses it."""
    return MemoryBank(path)


def _tokens(text: Any, vocab_size: int) -> list[int] | None:
    """The stored answer's ids, or None if the row is not a list of ids below ``vocab_size``."""
    try:
        tokens = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < vocab_size for t in tokens):
        return None
    return tokens


# --- the store's recycling table ---------------------------------------------------------------

MAX_K = 64  # next tokens per token a saved table may keep
MAX_SAVED_PAIRS = 1 << 20  # (previous, token) rows a saved table may hold


def encode_recycling(table: NextTokenTable, *, vocab_size: int) -> dict[str, Any]:
    """The ``recycling`` row of ``table`` (its known tokens only; next tokens past ``vocab_size`` dropped)."""
    ids, rows = table.known_rows()  # [n], [n, k]
    keep = (ids < vocab_size) & (rows[:, 0] < vocab_size)  # a row whose top token is past the vocabulary: dropped
    ids, rows = ids[keep], np.where(rows < vocab_size, rows, -1)[keep]
    packed = np.concatenate([ids[:, None], rows], axis=1).astype("<i4")  # [n, 1 + k]
    keys, nexts = table.known_pairs()  # [p, 2], [p, k]
    keep = (keys < vocab_size).all(axis=1) & (nexts[:, 0] < vocab_size)
    pairs = np.concatenate([keys, np.where(nexts < vocab_size, nexts, -1)], axis=1)[keep].astype("<i4")  # [p, 2 + k]
    return {"k": table.k, "vocab_size": int(vocab_size), "known": int(len(ids)),
            "rows": zlib.compress(packed.tobytes(), 1), "pairs": zlib.compress(pairs.tobytes(), 1),
            "hits": json.dumps({"hits": list(table.hits.hits), "seen": table.hits.seen}),
            "updated": now_iso(), "autolade_version": autolade_version()}


def decode_recycling(row: dict[str, Any], *, vocab_size: int) -> NextTokenTable:
    """The table a ``recycling`` row holds, checked field by field; ProfileError naming what is wrong."""
    k, vocab = row.get("k"), row.get("vocab_size")
    if type(k) is not int or not 1 <= k <= MAX_K:
        raise ProfileError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
    if vocab != vocab_size:
        raise ProfileError(f"it was saved for a vocabulary of {vocab!r} ids, this model has {vocab_size}")
    packed = _unpack(row.get("rows"), "rows", key_width=1, k=k, most=vocab_size, vocab_size=vocab_size)  # [n, 1 + k]
    ids, nexts = packed[:, 0], packed[:, 1:]
    if ids.size and len(np.unique(ids)) != len(ids):
        raise ProfileError(f"its token ids are not distinct ids in [0, {vocab_size})")
    pairs = None
    if row.get("pairs") is not None:  # NULL: saved before pair rows
        both = _unpack(row["pairs"], "pair rows", key_width=2, k=k, most=MAX_SAVED_PAIRS, vocab_size=vocab_size)
        if len(np.unique(both[:, :2], axis=0)) != len(both):
            raise ProfileError("its pair rows repeat a (previous, token) pair")
        pairs = (both[:, :2], both[:, 2:])
    try:
        rates = json.loads(row.get("hits") or "")
        hits, seen = rates["hits"], rates["seen"]
    except (TypeError, ValueError, KeyError):
        raise ProfileError("its rank hits are not {\"hits\": [...], \"seen\": n} JSON") from None
    if not is_number(seen) or seen < 0 or not isinstance(hits, list) or len(hits) != k \
            or not all(is_number(h) and 0 <= h <= seen for h in hits):
        raise ProfileError(f"its rank hits must be {k} counts between 0 and seen ({seen!r})")
    return NextTokenTable.from_known(ids, nexts, hits=hits, seen=seen, pairs=pairs)


def _unpack(blob: Any, what: str, *, key_width: int, k: int, most: int, vocab_size: int) -> np.ndarray:
    """[n, key_width + k] int64 from a zlib blob of int32 rows: ``key_width`` ids, then k next tokens (the
    first an id, the rest ids or -1); at most ``most`` rows; ProfileError naming ``what`` is wrong."""
    if not isinstance(blob, bytes):
        raise ProfileError(f"its {what} are not a blob")
    width = 4 * (key_width + k)  # bytes per row
    try:
        raw = zlib.decompressobj().decompress(blob, width * most + 1)
    except zlib.error as exc:
        raise ProfileError(f"its {what} do not decompress ({exc})") from None
    if len(raw) > width * most or len(raw) % width:
        raise ProfileError(f"its {what} hold {len(raw)} bytes, not whole rows of {width} (at most {most} of them)")
    packed = np.frombuffer(raw, dtype="<i4").reshape(-1, key_width + k).astype(np.int64)  # [n, key_width + k]
    keys, nexts = packed[:, :key_width], packed[:, key_width:]
    if keys.size and (keys.min() < 0 or keys.max() >= vocab_size):
        raise ProfileError(f"its {what}' token ids are not ids in [0, {vocab_size})")
    if nexts.size and (nexts.min() < -1 or nexts.max() >= vocab_size or (nexts[:, 0] == -1).any()):
        raise ProfileError(f"its {what}' next tokens are not ids in [0, {vocab_size}) (or -1 after the first)")
    return packed


# --- the store's memory table ------------------------------------------------------------------


def add_answers(store: Any, *, model_key: str, workload: str, answers: list[list[int]], keep: int = KEEP_ANSWERS,
                source: str) -> int:
    """Insert answers (one row each, one transaction) and trim the key to its newest ``keep``; returns the last id."""
    return _insert(store, model_key=model_key, workload=workload, answers=answers, keep=keep, source=source)[0]


def _insert(store: Any, *, model_key: str, workload: str, answers: list[list[int]], keep: int, source: str,
            skip_stored: bool = False) -> tuple[int, int]:
    """(last id, answers inserted). ``skip_stored``: an answer already stored for the key is not added again
    (counted per copy: a file that holds one answer twice keeps two, and importing it again adds none)."""
    rows = [{"model_fingerprint": model_key, "workload": workload, "tokens": json.dumps(a), "n_tokens": len(a),
             "source": source, "created": now_iso(), "autolade_version": autolade_version()} for a in answers]
    last = 0
    with store.errors_as("save the memory to"), store.writing():
        if skip_stored:
            stored = Counter(r["tokens"] for r in store.db.query(
                "select tokens from memory where model_fingerprint = ? and workload = ?", [model_key, workload]))
            new = []
            for row in rows:
                if stored[row["tokens"]] > 0:
                    stored[row["tokens"]] -= 1
                else:
                    new.append(row)
            rows = new
        for row in rows:
            last = store.db["memory"].insert(row).last_pk
        store.db.execute(
            "delete from memory where model_fingerprint = ? and workload = ? and id not in "
            "(select id from memory where model_fingerprint = ? and workload = ? order by id desc limit ?)",
            [model_key, workload, model_key, workload, keep])
    return last, len(rows)


def summary(store: Any) -> list[dict[str, Any]]:
    """One line per (model, workload): answers, tokens, first and last saved."""
    with store.errors_as("read"):
        return list(store.db.query(
            "select model_fingerprint as model, workload, count(*) as answers, sum(n_tokens) as tokens, "
            "min(created) as first, max(created) as last from memory group by model_fingerprint, workload "
            "order by model_fingerprint, workload"))


def recycling_summary(store: Any) -> list[dict[str, Any]]:
    """One line per saved token recycling table: model, workload, tokens known, last saved."""
    with store.errors_as("read"):
        return list(store.db.query(
            "select model_fingerprint as model, workload, known, updated from recycling order by model_fingerprint, workload"))


def clear(store: Any, *, model_key: str | None = None, workload: str | None = None) -> int:
    """Delete the remembered answers (of one model and/or workload) and their saved token recycling
    tables; returns how many answers."""
    where, args = _where(model_key, workload)
    with store.errors_as("clear the memory in"), store.writing():
        n = next(iter(store.db.query(f"select count(*) as n from memory{where}", args)))["n"]
        store.db.execute(f"delete from memory{where}", args)
        store.db.execute(f"delete from recycling{where}", args)
    return n


def _where(model_key: str | None, workload: str | None) -> tuple[str, list[str]]:
    parts, args = [], []
    if model_key:
        parts.append("model_fingerprint = ?")
        args.append(model_key)
    if workload:
        parts.append("workload = ?")
        args.append(workload)
    return (" where " + " and ".join(parts) if parts else ""), args


# --- files -------------------------------------------------------------------------------------


def export_memory(store: Any, *, model_key: str, workload: str, path: str | Path, vocab_size: int | None = None) -> int:
    """Write one (model, workload) memory as ``autolade-memory`` JSON; returns the answers written."""
    with store.errors_as("read"):
        rows = list(store.db.query("select tokens from memory where model_fingerprint = ? and workload = ? order by id",
                                   [model_key, workload]))
    answers = [json.loads(r["tokens"]) for r in rows]
    if not answers:
        raise ProfileError(f"no remembered answers for model {model_key!r}, workload {workload!r}; "
                           "`autolade memory list` shows what there is")
    data = {"format": FORMAT, "version": VERSION, "model": model_key, "workload": workload,
            "vocab_size": vocab_size, "created": now_iso(), "autolade_version": autolade_version(), "answers": answers}
    Path(path).write_text(json.dumps(data) + "\n")
    return len(answers)


def read_memory_file(path: str | Path) -> dict[str, Any]:
    """The validated content of an ``autolade-memory`` file; ProfileError naming the problem otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read memory file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ProfileError(f"{path} is not valid JSON ({exc}); was it truncated? Export it again.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{path} is not an autolade memory file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ProfileError(f"{path} is autolade-memory version {data.get('version')!r}; this autolade reads version {VERSION}")
    for k in ("model", "workload"):
        if not isinstance(data.get(k), str) or not data[k]:
            raise ProfileError(f"{path}: {k!r} must be a non-empty string")
    vocab = data.get("vocab_size")
    if vocab is not None and (type(vocab) is not int or vocab < 1):
        raise ProfileError(f"{path}: 'vocab_size' must be a positive integer or null")
    answers = data.get("answers")
    if not isinstance(answers, list) or not answers:
        raise ProfileError(f"{path}: 'answers' must be a non-empty list of token-id lists")
    top = vocab if vocab is not None else 1 << 31
    for i, a in enumerate(answers):
        if not isinstance(a, list) or not 0 < len(a) <= MAX_ANSWER_TOKENS or not all(type(t) is int and 0 <= t < top for t in a):
            raise ProfileError(f"{path}: answer {i} is not a list of 1..{MAX_ANSWER_TOKENS} token ids in [0, {top})")
    return data


def import_memory(path: str | Path, store: Any, *, model_key: str | None = None, vocab_size: int | None = None,
                  keep: int = KEEP_ANSWERS) -> tuple[int, int]:
    """Add a memory file's answers to the store (all or nothing), skipping those already stored for its model and
    workload, so that importing a file twice adds it once; returns (new, already there). ``model_key`` /
    ``vocab_size``: refuse a file made for another model."""
    data = read_memory_file(path)
    if model_key is not None and data["model"] != model_key:
        raise ProfileError(f"{path} is a memory of model {data['model']!r}, not {model_key!r}; "
                           "import it where that model is used, or pass --model for that model")
    if vocab_size is not None and any(t >= vocab_size for a in data["answers"] for t in a):
        raise ProfileError(f"{path} has token ids past this model's vocabulary ({vocab_size}): it is for another tokenizer")
    _, new = _insert(store, model_key=data["model"], workload=data["workload"], answers=data["answers"], keep=keep,
                     source=f"import:{Path(path).name}", skip_stored=True)
    return new, len(data["answers"]) - new


def matching_keys(store: Any, model: str | None) -> list[str]:
    """Stored model keys that ``model`` names: a full ``name:config_hash`` or just the name (None: all)."""
    keys = [r["model"] for r in summary(store) + recycling_summary(store)]
    return sorted({k for k in keys if model is None or k == model or k.split(":", 1)[0] == model})


# --- one generate() call's memory -------------------------------------------------------------


@dataclass(frozen=True)
class OpenedMemory:
    """What ``open_memory`` found for one call."""

    answers: AnswerMemory | None  # the memory to draft from; None: off
    note: str  # what res.stats.memory says
    remember: Callable[[list[int]], str | None] | None = None  # saves the answer and the carried table; None: read only
    table: NextTokenTable | None = None  # the carried token recycling table
    table_note: str = ""  # what reading that table said


def open_memory(model: Any, mode: bool | str | AnswerMemory, workload: str | None, *,
                 recycle: bool = False) -> OpenedMemory:
    """The memory ``mode`` asks for (``generate(memory=)``); ``recycle``: the config recycles, so carry its table."""
    if isinstance(mode, AnswerMemory):
        return OpenedMemory(mode, f"{len(mode)} answers ({mode.tokens} tokens), given by the caller, read only")
    if mode not in (True, False, "read"):
        raise ConfigError(f"memory must be True, False, 'read', an AnswerMemory or None (the default), got {mode!r}")
    if mode is False:
        return OpenedMemory(None, "off")
    from autolade.machine.models import model_fingerprint

    key = model_key(model_fingerprint(model))
    tag = workload_or_general(workload)
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    vocab = int(getattr(cfg, "vocab_size", 0) or 1 << 31)
    bank = memory_bank(str(memory_path()))
    answers, note = bank.memory(model_key=key, workload=tag, vocab_size=vocab)
    table, table_note = bank.recycled(model_key=key, workload=tag, vocab_size=vocab) if recycle else (None, "")
    if mode == "read" or bank.read_only:  # asked for, or a file this process cannot write: remember nothing
        note += "" if bank.read_only else ", read only"
        return OpenedMemory(answers, note, None, None if table is None else table.copy(), table_note)

    def remember(new: list[int]) -> str | None:  # the answer, then the table it taught (saved for the next run)
        why = [bank.remember(model_key=key, workload=tag, tokens=list(new)),
               bank.save_recycled(model_key=key, workload=tag, vocab_size=vocab) if table is not None else None]
        return "; ".join(w for w in why if w) or None

    return OpenedMemory(answers, note, remember, table, table_note)
