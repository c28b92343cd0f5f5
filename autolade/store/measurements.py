"""Step curves and acceptance tables in the profile store: the measurements ``ProfileStore`` keeps besides profiles.

``Measurements`` is mixed into ``autolade.store.db.ProfileStore``, which supplies ``db`` (the
``sqlite_utils.Database``), ``errors_as(action)`` (sqlite errors as ``StoreError``) and ``writing()`` (one
immediate write transaction). Step curves are keyed by hardware, model and dtype; acceptance tables
(``autolade.records.acceptance``) are hardware-free, keyed by model, tokenizer, workload and dtype.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from autolade.errors import ProfileError, StoreError
from autolade.records.curve import StepCurve
from autolade.records.profile import autolade_version, model_key, now_iso


class Measurements:
    """``ProfileStore``'s step-curve and acceptance-table methods (see the module docstring for what it relies on)."""

    # -- step curves

    def save_curve(
        self,
        curve: StepCurve,
        *,
        hardware_fingerprint: str,
        hardware_class: str = "",
        hardware_summary: str = "",
        model_fingerprint: str | dict[str, str] | None = None,
        model_name: str | None = None,
        model_config_hash: str | None = None,
        dtype: str | None = None,
    ) -> int:
        """Store a measured curve; returns its id. The model is ``model_fingerprint`` (the dict from
        ``autolade.machine.models.model_fingerprint`` or ``"name:hash"``) or ``model_name`` + ``model_config_hash``."""
        if isinstance(model_fingerprint, dict):
            model_name, model_config_hash = model_fingerprint["name"], model_fingerprint["config_hash"]
            dtype = dtype or model_fingerprint.get("dtype")
        elif isinstance(model_fingerprint, str):
            model_name, _, model_config_hash = model_fingerprint.rpartition(":")
        if not model_name or not model_config_hash:
            raise ProfileError("save_curve needs model_fingerprint, or model_name and model_config_hash")
        if dtype is not None and dtype != curve.dtype:
            raise ProfileError(f"save_curve: dtype {dtype!r} differs from the curve's {curve.dtype!r}")
        row = {
            "hardware_fingerprint": hardware_fingerprint,
            "hardware_class": hardware_class,
            "hardware_summary": hardware_summary,
            "model_name": model_name,
            "model_config_hash": model_config_hash,
            "model_fingerprint": model_key(model_name, model_config_hash),
            "dtype": curve.dtype,
            "curve": json.dumps(curve.to_dict(), allow_nan=False),
            "created": now_iso(),
            "autolade_version": autolade_version(),
        }
        with self.errors_as("save a curve to"), self.writing():
            return self.db["curves"].insert(row).last_pk

    def latest_curve(self, *, hardware_fingerprint: str, model_fingerprint: str | dict[str, str], dtype: str,
                     compiled: bool = False) -> StepCurve | None:
        """The most recent step curve for this hardware/model/dtype whose repeats agreed; else the most recent; else
        None. ``compiled``: of the compiled step (``StepCurve.compiled``) instead of the eager one."""
        model_fingerprint = model_key(model_fingerprint) if isinstance(model_fingerprint, dict) else model_fingerprint
        sql = (
            "select curve from curves where hardware_fingerprint = ? and model_fingerprint = ? and dtype = ? "
            "order by id desc limit 40"
        )
        with self.errors_as("read"):
            rows = list(self.db.query(sql, [hardware_fingerprint, model_fingerprint, dtype]))
        curves = [c for row in rows if (c := StepCurve.from_dict(json.loads(row["curve"]))).compiled == compiled]
        return next((c for c in curves if not c.noisy_points()), curves[0] if curves else None)

    # -- acceptance tables (autolade.records.acceptance: hardware-free, keyed by model, tokenizer, workload, dtype)

    def save_acceptance(self, table: Any) -> int:
        """Store an ``AcceptanceTable`` (validated on construction); returns its id. A table with the
        same key and ``created`` (the same measuring run, saved again with more rows) replaces that row."""
        from autolade.records.acceptance import AcceptanceTable

        if not isinstance(table, AcceptanceTable) or not table.rows:
            raise ProfileError("save_acceptance needs an AcceptanceTable with at least one row")
        row = {
            "model_name": table.model_name,
            "model_config_hash": table.model_config_hash,
            "model_fingerprint": table.model_fingerprint,
            "tokenizer_fingerprint": table.tokenizer_fingerprint,
            "workload": table.workload,
            "dtype": table.dtype,
            "acceptance_table": table.to_json(),
            "created": table.created,
            "autolade_version": table.autolade_version,
        }
        key = [row[k] for k in ("model_fingerprint", "tokenizer_fingerprint", "workload", "dtype", "created")]
        sql = ("select id from acceptance where model_fingerprint = ? and tokenizer_fingerprint = ? and workload = ? "
               "and dtype = ? and created = ? order by id desc limit 1")
        with self.errors_as("save an acceptance table to"), self.writing():
            found = list(self.db.query(sql, key))
            if found:
                self.db["acceptance"].update(found[0]["id"], row)
                return found[0]["id"]
            return self.db["acceptance"].insert(row).last_pk

    def find_acceptance(self, *, model_fingerprint: str | dict[str, str], tokenizer_fingerprint: str | Sequence[str],
                        workload: str, dtype: str) -> Any:
        """The most recent ``AcceptanceTable`` for this key, or None. ``tokenizer_fingerprint``: one, or
        every fingerprint the tokenizer's tables may carry (``vocab_fingerprint.tokenizer_fingerprints``)."""
        from autolade.records.acceptance import AcceptanceTable
        from autolade.records.vocab import as_fingerprints

        model_fingerprint = model_key(model_fingerprint) if isinstance(model_fingerprint, dict) else model_fingerprint
        fps = as_fingerprints(tokenizer_fingerprint)
        sql = (f"select id, acceptance_table from acceptance where model_fingerprint = ? and tokenizer_fingerprint in "
               f"({', '.join('?' for _ in fps)}) and workload = ? and dtype = ? order by created desc, id desc limit 1")
        with self.errors_as("read"):
            rows = list(self.db.query(sql, [model_fingerprint, *fps, workload, dtype]))
        if not rows:
            return None
        try:
            return AcceptanceTable.from_json(rows[0]["acceptance_table"], source=f"stored acceptance table #{rows[0]['id']}")
        except ProfileError as exc:
            raise StoreError(str(exc)) from None
