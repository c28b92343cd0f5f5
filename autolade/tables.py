"""Finding an acceptance table for a model, and turning its prediction into settings.

``find_table`` answers "how many tokens does each setting accept per step for this model and
workload": the store's table (``autolade accept`` or an import) first, else one shipped in the
``profiles/`` folder (``acceptance-<model>-<dtype>-<workload>.json``). When neither exists in
this dtype, a table of the other dtype of the same model is used and the source says so:
acceptance barely depends on the dtype (the greedy outputs differ only where the top-2 logits
nearly tie). A table for another model or tokenizer is never returned.

``predicted_settings`` prices a table on this machine's step curve (``autolade.predict``) and
returns the chosen setting as (config, policy spec); ``verify_prediction`` times it against
greedy on held-out prompts through ``measure_holdout``, the one place that calls the measuring
harness.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .acceptance import FORMAT, AcceptanceTable, Setting
from .errors import ProfileError
from .profile_format import DTYPES, model_key
from .vocab_fingerprint import as_fingerprints

PREDICTED = "predicted"  # a Profile whose notes start with this was chosen from a table, not tuned


def shipped_tables(dirs: Iterable[str | Path]) -> Iterator[tuple[AcceptanceTable, str]]:
    """Valid ``autolade-acceptance`` tables among ``*.json`` in each dir, with a readable label.
    Other formats are left to the profile reader; a corrupt acceptance file warns and is skipped."""
    from .store import _label

    seen: set[Path] = set()
    for folder in map(Path, dirs):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            label = _label(path)
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
    from .paths import repo_profiles_dir

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


def policy_spec(setting: Setting) -> dict[str, Any] | None:
    """The Profile/generate() policy spec that runs ``setting``: None (static) or ``{"name": "lookup"}``."""
    return None if setting.policy == "static" else {"name": setting.policy}


def predicted_settings(table: AcceptanceTable, curve: Any) -> tuple[Any, Any]:
    """(the chosen Prediction, its ranking): ``predict.choose`` over the table's settings on this curve."""
    from .predict import choose, predict

    return choose(table, curve), predict(table, curve)


def predicted_note(prediction: Any, table: AcceptanceTable, table_source: str) -> str:
    """The notes of a predicted Profile (they start with ``PREDICTED``: resolution ranks it below a tuned one)."""
    return (f"{PREDICTED} by autolade profile from acceptance table {table_source} "
            f"(created {table.created}): {prediction.setting.label} at {prediction.speedup:.2f}x greedy "
            f"({prediction.tokens_per_step:.2f} tokens/step, {prediction.packed_per_step:.1f} packed/step)")


def is_predicted(profile: Any) -> bool:
    return profile.notes.startswith(PREDICTED)


def measure_holdout(model: Any, tokenizer: Any, *, workload: str, config: Any, policy: dict | None, prompts: int,
                    max_new_tokens: int, cost: Any = None) -> tuple[float, float]:
    """(speedup over HF greedy, over HF prompt lookup) of one setting on ``prompts`` held-out prompts,
    timed through the tuner's measuring harness (the one import to re-point when it moves)."""
    from .models import eos_ids
    from .prompts import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload
    from .tune import Candidate, Runner, measure

    held = split_workload(load_workload(workload), holdout_fraction=HOLDOUT_FRACTION)[1][:prompts]
    if not held:
        raise ProfileError(f"workload {workload!r} has no held-out prompts to verify on")
    ids = [encode_prompt(tokenizer, p.text, kind=p.kind) for p in held]
    runner = Runner(model, max_new_tokens=max_new_tokens, eos=eos_ids(model), cost=cost)
    m = measure(runner, ids, Candidate(config, policy), pld=True, offset=10_000)
    return m.ratio(), m.ratio(m.pld_s)


def verify_prediction(model: Any, tokenizer: Any, *, workload: str, prediction: Any, prompts: int,
                      max_new_tokens: int = 64, cost: Any = None, measure_fn: Any = None) -> tuple[bool, float, float]:
    """(holds, speedup, vs prompt lookup): whether the predicted setting measured at least greedy's
    speed (>= 1.0x) on ``prompts`` held-out prompts. Greedy itself always holds (1.0x, unmeasured)."""
    if prediction.setting.greedy:
        return True, 1.0, float("nan")
    fn = measure_fn or measure_holdout
    speedup, vs_pld = fn(model, tokenizer, workload=workload, config=prediction.setting.config,
                         policy=policy_spec(prediction.setting), prompts=prompts, max_new_tokens=max_new_tokens, cost=cost)
    return speedup >= 1.0, speedup, vs_pld


def covered(table: AcceptanceTable, config: Any, policy: dict | None) -> Setting | None:
    """The table's Setting that runs exactly ``config`` under ``policy`` (None/static or plain lookup), or None."""
    name = "static" if policy is None or policy == {"name": "static"} else policy.get("name")
    if policy is not None and name == "lookup" and set(policy) != {"name"}:
        return None  # lookup with its own parameters: not the tabulated default
    for row in table.rows:
        if row.setting.config == config and row.setting.policy == name:
            return row.setting.unpriced  # what runs; a recycling setting's rows at each price are read together
    return None

