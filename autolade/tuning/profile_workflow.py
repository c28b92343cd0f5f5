"""``autolade profile``: this machine's step-latency curve of a model, saved in the store, and per
workload the setting an acceptance table predicts best on it, saved as a "predicted" profile
(timed against greedy first with ``verify``), and which dtype to run the model in.

``profile_machine`` is the whole workflow; it prints its report through ``echo`` (results) and
``log`` (progress), so the CLI stays argument handling only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autolade.errors import ConfigError

BOUND_EXAMPLES = ((2, 3, 2), (4, 4, 4), (7, 4, 7), (15, 5, 15))  # W/N/G rows shown by `autolade profile`
SHOWN_PREDICTIONS = 5  # settings `autolade profile` lists per workload, plus greedy
WORKLOADS = ("chat", "code")  # workloads a predicted profile is stored for
QUICK_CURVE = {"ks": (1, 2, 4, 8, 16, 32, 64), "contexts": (128,), "repeats": 3, "warmup": 1}  # `--quick`


@dataclass
class ProfileRun:
    """What ``profile_machine`` measured and stored."""

    hardware: Any  # the probed ``Hardware``
    curve: Any  # the measured ``StepCurve``
    curve_id: int  # its store id
    store_path: Path
    predicted: dict[str, int] = field(default_factory=dict)  # workload -> stored predicted profile id
    recommended_dtype: str | None = None  # None when there is nothing to compare
    dtype_why: str = ""
    plot: Path | None = None
    compile: bool | None = None  # whether the compiled step pays here (None: not measured)


def profile_machine(*, model: str, dtype: str = "float32", quick: bool = False, verify: int = 0,
                    plot: str | Path | None = None, echo: Callable[[str], None] = print,
                    log: Callable[[str], None] | None = None, compile: bool = False) -> ProfileRun:
    """Profile this hardware and ``model``'s step-latency curve in ``dtype``; save the curve in the store,
    and per workload the setting an acceptance table predicts best on it (a "predicted" profile; with
    ``verify`` N, timed on N held-out prompts first and greedy stored if it loses). ``quick``: fewer k
    values, one context, shorter benchmarks. ``plot``: also write the curve as a PNG. The report goes to
    ``echo``, progress to ``log`` (default: ``echo``). ``compile``: also measure the compiled step's curve
    (``engine/compiled.py``; minutes of warm-up on a CPU), store it, and where it is cheaper than the eager one
    (``records.curve.compile_pays``) price the predictions on it: ``generate()`` then compiles by itself."""
    from autolade.machine.hardware import probe_hardware
    from autolade.machine.models import load, model_fingerprint
    from autolade.machine.step_curve import measure_step_curve, plot_curve
    from autolade.records.curve import compile_pays, running_curve
    from autolade.records.vocab import model_tokenizer_fingerprints
    from autolade.store.db import ProfileStore
    from autolade.store.tables import find_table
    from autolade.tuning.dtype_advice import stored_dtype_advice

    log = log or echo
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ConfigError(f"verify must be 0 (off) or a number of prompts, got {verify!r}")
    log(f"loading {model} ({dtype})...")
    mdl, tok = load(model, dtype=dtype)
    device = str(next(mdl.parameters()).device)
    hardware = probe_hardware(device=device, quick=quick)
    echo(hardware.summary())
    fp = model_fingerprint(mdl)
    log(f"\nmeasuring step-latency curve of {fp['name']} ({fp['dtype']}, config {fp['config_hash']})...")
    curve = measure_step_curve(mdl, **QUICK_CURVE, name=fp["name"]) if quick else measure_step_curve(mdl, name=fp["name"])
    _echo_curve(curve, echo)
    compiled = _compiled_curve(mdl, fp["name"], quick=quick, echo=echo, log=log) if compile else None
    tok_fp = model_tokenizer_fingerprints(mdl, tok)
    with ProfileStore() as store:
        where = dict(hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
                     hardware_summary=hardware.summary(), model_name=fp["name"], model_config_hash=fp["config_hash"])
        curve_id = store.save_curve(curve, **where)
        echo(f"saved step curve #{curve_id} to {store.path}")
        run = ProfileRun(hardware=hardware, curve=curve, curve_id=curve_id, store_path=store.path)
        if compiled is not None:
            echo(f"saved the compiled step curve #{store.save_curve(compiled, **where)}")
            run.compile = compile_pays(curve, compiled)
            echo(f"compiled steps: {'on' if run.compile else 'off'} for generate() on this machine "
                 f"({_compile_ratio(curve, compiled)})")
        else:
            echo("compiled steps: not measured this run; `autolade profile --compile` (about a minute more) times them "
                 "and turns them on for generate() where they pay")
        pricing = running_curve(curve, compiled)  # the predictions are priced on the steps that will run
        chat_table = None
        for workload in WORKLOADS:
            table, source = find_table(store, model_fingerprint=fp, tokenizer_fingerprint=tok_fp, workload=workload,
                                       dtype=fp["dtype"])
            if table is None:
                echo(f"\n{workload}: {source}; generate() uses the built-in default")
                continue
            chat_table = chat_table or table
            run.predicted[workload] = store_prediction(
                store, mdl, tok, table=table, source=source, curve=pricing, hardware=hardware, fingerprint=fp,
                workload=workload, verify=verify, echo=echo, compiled=bool(run.compile))
        recommended, why = stored_dtype_advice(curve, store=store, hardware=hardware, model_fingerprint=fp, table=chat_table,
                                               compiled=compiled)
        run.recommended_dtype, run.dtype_why = recommended, why
        echo(f"dtype: {recommended} recommended: {why}" if recommended else f"dtype: {why}")
    if plot:
        run.plot = plot_curve(curve, plot)
        echo(f"wrote {run.plot}")
    return run


def _compiled_curve(model, name: str, *, quick: bool, echo: Callable[[str], None], log: Callable[[str], None]):
    from autolade.machine.step_curve import measure_compiled_curve

    log("\nmeasuring the compiled step (torch.compile; each bucket compiles once first)...")
    compiled = measure_compiled_curve(model, contexts=QUICK_CURVE["contexts"] if quick else (128, 512),
                                      repeats=QUICK_CURVE["repeats"] if quick else 5, name=name)
    echo("\ncompiled step latency, median ms per forward at each bucket width:")
    echo(compiled.table())
    for note in compiled.notes:
        echo(f"note: {note}")
    return compiled


def _compile_ratio(eager, compiled) -> str:
    """Compiled / eager cost at a few widths, for the report."""
    parts = []
    for k in (1, 4, 8, 16):
        width = next((w for w in compiled.ks if w >= k), None)
        if width is not None:
            parts.append(f"k={k}: {compiled.cost(width) / eager.cost(k):.2f}x eager")
    return ", ".join(parts)


def _echo_curve(curve, echo: Callable[[str], None]) -> None:
    """The curve's table, its notes, the spare compute and the speedup bounds of a few W/N/G."""
    echo("\nstep latency, median ms per forward of k packed tokens:")
    echo(curve.table())
    for note in curve.notes:
        echo(f"note: {note}")
    echo(f"\nspare compute: k={curve.spare_compute()} (largest k costing at most 1.25 x c(1))")
    echo("speedup upper bound N * c(1)/c(k) (every draft accepted), k = 1 + (N-1)W + G(N-1):")
    for w, n, g in BOUND_EXAMPLES:
        echo(f"  W={w:<2} N={n} G={g:<2} k={1 + (n - 1) * w + g * (n - 1):<4} bound {curve.speedup_bound(w, n, g):.2f}x")


def store_prediction(store, model, tokenizer, *, table, source: str, curve, hardware, fingerprint: dict[str, str],
                     workload: str, verify: int = 0, echo: Callable[[str], None] = print, compiled: bool = False) -> int:
    """Print ``table``'s top settings priced on ``curve`` and store the chosen one as a predicted profile
    (with ``verify`` N, timed on N held-out prompts first: greedy is stored if it loses). Returns its store id.
    ``compiled``: ``curve`` is of the compiled steps (recorded in the profile)."""
    from autolade.config import GREEDY
    from autolade.records.profile import Profile
    from autolade.runtime.predict import PREDICTED, format_predictions, policy_spec, predicted_note, predicted_settings
    from autolade.tuning.verify import verify_prediction

    fp = fingerprint
    best, ranked = predicted_settings(table, curve)
    shown = ranked[:SHOWN_PREDICTIONS] + [p for p in ranked[SHOWN_PREDICTIONS:] if p.setting.greedy]
    echo(f"\n{workload}: predicted speedup from acceptance table {source}, at context {table.context_median}:")
    echo(format_predictions(shown))
    config, policy, notes, speedup = best.setting.config, policy_spec(best.setting), predicted_note(best, table, source), None
    if verify:
        holds, speedup, vs_pld = verify_prediction(model, tokenizer, workload=workload, prediction=best, prompts=verify,
                                                   cost=curve.cost)
        echo(f"verified on {verify} held-out prompts: {best.setting.label} {speedup:.2f}x greedy, "
             f"{vs_pld:.2f}x HF prompt lookup")
        if not holds:
            config, policy = GREEDY, None
            notes = f"{PREDICTED} setting {best.setting.label} measured {speedup:.2f}x greedy (< 1.0x): greedy stored. {notes}"
            speedup = None
    profile = Profile(
        hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
        model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=fp["dtype"], workload=workload,
        settings=config, policy=policy, speedup=speedup, prompt_set=table.prompt_set or None,
        hardware_summary=hardware.summary(), step_curve=curve.to_dict(), compiled=compiled, notes=notes,
    )
    label = "greedy" if config.greedy_only else best.setting.label
    profile_id = store.save(profile)
    echo(f"{workload}: stored predicted profile #{profile_id} ({label})")
    return profile_id
