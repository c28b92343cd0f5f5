"""Finding an acceptance table for a model: the store's first, then the files shipped in profiles/.

``find_table`` answers "how many tokens does each setting accept per step for this model and
workload": the store's table (``autolade accept`` or an import) first, else one shipped in the
``profiles/`` folder (``acceptance-<model>-<dtype>-<workload>.json``). When neither exists in
this dtype, a table of the other dtype of the same model is used and the source says so:
acceptance barely depends on the dtype (the greedy outputs differ only where the top-2 logits
nearly tie). A table for another model or tokenizer is never returned.

``autolade.runtime.predict`` prices a table on this machine's step curve;
``autolade.tuning.verify`` times the prediction on held-out prompts.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autolade.errors import ProfileError
from autolade.records.acceptance import FORMAT, AcceptanceTable
from autolade.records.profile import DTYPES, model_key
from autolade.records.vocab import as_fingerprints


def shipped_tables(dirs: Iterable[str | Path]) -> Iterator[tuple[AcceptanceTable, str]]:
    """Valid ``autolade-acceptance`` tables among ``*.json`` in each dir, with a readable label.
    Other formats are left to the profile reader; a corrupt acceptance file warns and is skipped."""
    from autolade.store.db import file_label

    seen: set[Path] = set()
    for folder in map(Path, dirs):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            label = file_label(path)
            try:
                text = path.read_text(encoding="utf-8")
                data = json.loads(text)
            except (OSError, UnicodeDecodeError, ValueError):
                continue  # not readable JSON: the profile reader warns about it
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                continue
            try:
                yield AcceptanceTable.from_dict(data), label
            except ProfileError as exc:
                warnings.warn(f"skipping acceptance file {label}: {exc}", stacklevel=3)


def find_table(store: Any, *, model_fingerprint: str | dict[str, str], tokenizer_fingerprint: str | Sequence[str],
               workload: str, dtype: str, table_dirs: Iterable[str | Path] | None = None) -> tuple[AcceptanceTable | None, str]:
    """(table, source) for this model, tokenizer, workload and dtype: the store's, else a shipped one
    (``table_dirs``, default the repo's ``profiles/``); then the same for the other dtypes of the
    model. ``(None, why)`` when there is none. ``tokenizer_fingerprint``: one, or all the tokenizer's
    (``vocab_fingerprint.tokenizer_fingerprints``: current and legacy)."""
    from autolade.paths import repo_profiles_dir

    fp = model_key(model_fingerprint) if isinstance(model_fingerprint, dict) else model_fingerprint
    tfps = as_fingerprints(tokenizer_fingerprint)
    dirs = [repo_profiles_dir()] if table_dirs is None else list(table_dirs)
    files: list[tuple[AcceptanceTable, str]] | None = None
    for d in (dtype, *(x for x in DTYPES if x != dtype)):
        where = d if d == dtype else f"measured in {d}, used for {dtype}: acceptance barely depends on the dtype"
        table = store.find_acceptance(model_fingerprint=fp, tokenizer_fingerprint=tfps, workload=workload, dtype=d)
        if files is None:
            files = list(shipped_tables(dirs))
        matches = [(t, label) for t, label in files if t.model_fingerprint == fp and t.dtype == d
                   and t.tokenizer_fingerprint in tfps and t.workload == workload]
        shipped, label = max(matches, key=lambda m: m[0].created) if matches else (None, "")
        if table is not None and shipped is not None and shipped.max_new_tokens == table.max_new_tokens:
            # a table the tuner started holds few rows: the shipped one fills in the rest (per setting, more prompts wins)
            shipped = replace(shipped, tokenizer_fingerprint=table.tokenizer_fingerprint)  # one may be legacy-keyed
            return table.merged(shipped), f"store + file:{label} ({workload}, {where})"
        if table is not None:
            return table, f"store ({workload}, {where})"
        if shipped is not None:
            return shipped, f"file:{label} ({workload}, {where})"
    return None, (f"no acceptance table for {fp} ({workload}) with this tokenizer: "
                  f"measure one with `autolade accept --workload {workload}`")
