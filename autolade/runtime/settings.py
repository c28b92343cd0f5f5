"""Settings resolution: which settings generate() uses when the caller gives none. A stored or
shared profile for this hardware, model, dtype and workload (tuned beats predicted); else the
setting an acceptance table of this model predicts best on this machine's step-latency curve;
else a built-in default.

``SettingsResolver`` resolves once per model: it keeps the hardware probe, the model's fingerprint
and what the store and the ``profiles/`` files answered, keyed on those files' stamps, so a
profile saved or a curve measured since is seen on the next call. generate() and bench share
``default_resolver()``.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from autolade.config import SCALED_LOOKUP, LookaheadConfig
from autolade.errors import ConfigError, StoreError
from autolade.runtime.defaults import builtin_default
from autolade.workloads import lookup_order, workload_tag


@dataclass(frozen=True)
class CacheInfo:
    hits: int  # reads answered from the cache
    misses: int  # reads that opened the store and read the profile files
    probes: int  # hardware probes run


@dataclass(frozen=True)
class _Answers:
    """What the store and the profile files said for one model, dtype and machine."""

    curve: Any  # StepCurve or None
    compiled_curve: Any = None  # the compiled step's StepCurve or None (``autolade profile --compile``)
    found: Mapping[str, tuple[Any, str]] = field(default_factory=dict)  # workload tag -> (Profile or None, source)
    problem: str = ""  # why the store was not read ("": it was); the shared files still were

    def compile_pays(self) -> bool:
        """Whether both curves were measured and the compiled step is cheaper (``records.curve.compile_pays``)."""
        from autolade.records.curve import compile_pays

        return self.curve is not None and self.compiled_curve is not None and compile_pays(self.curve, self.compiled_curve)


def _probe_identity(device: str):
    from autolade.machine.hardware import probe_hardware

    return probe_hardware(device=device, measure=False)  # identity only: no micro-benchmarks


class SettingsResolver:
    """Settings for models on this machine, resolved once per model and store state.

    ``probe(device)`` describes the machine (default: ``probe_hardware(measure=False)``); it runs
    once per device and torch thread count. Each read opens the store, reads and closes it; a store
    that does not exist yet is not created (only the shared files are read). ``maxsize``: how many
    (model, store state) answers are kept.
    """

    def __init__(self, *, probe: Callable[[str], Any] | None = None, maxsize: int = 32) -> None:
        self._probe = probe or _probe_identity
        self._maxsize = maxsize
        self._lock = threading.Lock()
        self._hardware: dict[tuple[str, int], Any] = {}
        self._fingerprints: OrderedDict[int, tuple[weakref.ref, int, Any, dict[str, str]]] = OrderedDict()
        self._answers: OrderedDict[tuple, _Answers] = OrderedDict()
        self._hits = self._misses = self._probes = 0

    def cache_info(self) -> CacheInfo:
        return CacheInfo(hits=self._hits, misses=self._misses, probes=self._probes)

    def hardware(self, model: torch.nn.Module):
        """The ``HardwareProfile`` of the device the model runs on."""
        param = next(model.parameters())
        device = "cpu" if param.device.type == "cpu" else f"cuda:{param.device.index or 0}"
        key = (device, torch.get_num_threads())  # threads are part of a CPU's fingerprint
        with self._lock:
            found = self._hardware.get(key)
        if found is None:
            found = self._probe(device)
            with self._lock:
                self._probes += 1
                self._hardware[key] = found
        return found

    def fingerprint(self, model: torch.nn.Module) -> dict[str, str]:
        """``models.model_fingerprint(model)``, hashed once per live model, config object and dtype."""
        from autolade.machine.models import model_fingerprint

        stamp = (id(model.config), getattr(model, "dtype", None))
        with self._lock:
            entry = self._fingerprints.get(id(model))
        if entry is not None and entry[0]() is model and entry[1:3] == stamp:
            return entry[3]
        fp = model_fingerprint(model)
        with self._lock:
            self._fingerprints[id(model)] = (weakref.ref(model), *stamp, fp)
            self._fingerprints.move_to_end(id(model))
            while len(self._fingerprints) > self._maxsize:
                self._fingerprints.popitem(last=False)
        return fp

    def find(self, model: torch.nn.Module, workload: str):
        """(profile or None, source) for exactly this workload: the store, then the shared JSON
        files in ``profiles/``; exact hardware first, then the same hardware class."""
        tag = workload_tag(workload)
        return self._read(model, [tag]).found[tag]

    def curve(self, model: torch.nn.Module, *, compiled: bool = False):
        """This machine's latest step-latency curve for this model and dtype, or None. ``compiled``: the curve
        of the steps a compiled decode runs (``records.curve.as_run`` of the compiled curve), where one was
        measured; else the eager one."""
        answers = self._read(model, [])
        if compiled and answers.compiled_curve is not None:
            from autolade.records.curve import as_run

            return as_run(answers.compiled_curve)
        return answers.curve

    def answers(self, model: torch.nn.Module) -> _Answers:
        """What the store holds for this model on this machine, whatever the workload (its curves)."""
        return self._read(model, [])

    def stored_profile(self, model: torch.nn.Module, workload: str):
        """(profile, source) for exactly this workload; a ``ConfigError`` that names the fix if there is none."""
        tag = workload_tag(workload)
        prof, source = self._read(model, [tag]).found[tag]
        if prof is None:
            raise ConfigError(f"no {tag!r} profile for this model, dtype and machine: run "
                              f"`autolade tune --workload {workload}` or import one (`autolade profiles import FILE`)")
        return prof, source

    def resolve(self, model: torch.nn.Module, *, workload: str | None = None, tokenizer: Any = None,
                compiled: bool | None = False) -> tuple[LookaheadConfig, str, dict | None]:
        """(config, source, policy spec) for this model on this machine and ``workload`` (any of
        its names: ``humaneval`` is ``code``). Order: a tuned profile for this exact hardware; a
        predicted one (``autolade profile``) for it; profiles of the same hardware class; then, with
        this machine's step curve and an acceptance table of this model and ``tokenizer`` (only
        fingerprinted when it comes to that), the table's predicted best; else the built-in default. A
        store that cannot be read is passed over (the source says why; warned once per file). ``compiled``: the
        steps run compiled (None: where the stored curves say it pays); predictions are then priced on the
        compiled curve, and a profile that found plain greedy best on the other kind of steps gives way to a
        prediction on these (``_other_steps``)."""
        tag = workload_tag(workload) if workload else None
        # the named workload first; a profile of another workload on this machine beats a blind default
        order = lookup_order(workload)
        answers = self._read(model, order)
        if compiled is None:
            compiled = answers.compile_pays()
        config, source, policy = self._choose(model, answers, order, tag, tokenizer, compiled=compiled)
        return config, (f"{source}; {answers.problem}" if answers.problem else source), policy

    def _choose(self, model: torch.nn.Module, answers: _Answers, order: Sequence[str], tag: str | None,
                tokenizer: Any, *, compiled: bool = False) -> tuple[LookaheadConfig, str, dict | None]:
        """``resolve`` from what the store and the files answered."""
        from autolade.records.curve import as_run
        from autolade.runtime.predict import is_predicted

        curve = as_run(answers.compiled_curve) if compiled and answers.compiled_curve is not None else answers.curve
        passed = ""  # a profile given way to a prediction on the steps that run, said in the source
        for t in order:
            prof, source = answers.found[t]
            if prof is not None:
                note = "" if t == tag or not tag else f", no {tag!r} profile"
                if self._other_steps(prof, compiled) and curve is not None:
                    passed = f"; {source} ({t}) passed over: greedy best on {'eager' if compiled else 'compiled'} steps"
                    break
                if is_predicted(prof):
                    return prof.settings, f"predicted ({source}, {t}{note})", prof.policy
                return prof.settings, f"{source} ({t}{note})", prof.policy
        config, policy = builtin_default(next(model.parameters()).device.type)
        if curve is None:
            return config, "default (built-in; run `autolade profile` or `autolade tune` for this machine)", policy
        found = None
        if tokenizer is not None:
            from autolade.records.vocab import model_tokenizer_fingerprints

            found = self._table(model, tag or "chat", model_tokenizer_fingerprints(model, tokenizer))
        if found is not None and found[0] is not None:
            from autolade.runtime.predict import choose, policy_spec

            best = choose(found[0], curve)
            steps = "compiled step-latency curve" if compiled and answers.compiled_curve is not None else "step-latency curve"
            return (best.setting.config, f"predicted ({best.speedup:.2f}x from acceptance table {found[1]} on this "
                    f"machine's {steps}{passed})", policy_spec(best.setting))
        if passed:  # no prediction to give way to: the profile after all
            prof, source = answers.found[t]
            return prof.settings, f"{source} ({t}; measured on {'eager' if compiled else 'compiled'} steps)", prof.policy
        why = found[1] if found is not None else "no tokenizer given to look up an acceptance table"
        # No measured acceptance: never a guess that can lose to greedy. Where even 2 packed tokens
        # cost >1.25x one (fp32 on small CPUs) the cost-aware policy sizes or skips each draft by the
        # curve: 1.05x-1.12x the static rule in fp32 here, level with it in bf16 (BENCHMARKS.md).
        if config == SCALED_LOOKUP and curve.spare_compute() < 2:
            return SCALED_LOOKUP, f"default (cost-aware lookup on this machine's step-latency curve; {why})", {"name": "cost-aware"}
        return config, f"default (built-in; {why})", policy

    @staticmethod
    def _other_steps(prof: Any, compiled: bool) -> bool:
        """Whether ``prof`` found plain greedy best on the other kind of steps than the ones that run. That verdict
        is the step curve's (drafts cost more than they bring), and a compiled curve is another curve: on the 2-core
        Zen 4 EPYC, SmolLM2 fp32's tuned profile (greedy, tuned eager) ran compiled at 1.82x / 1.93x HF greedy on
        MT-Bench / HumanEval where prompt lookup 16 compiled ran 1.94x / 3.21x (BENCHMARKS.md). A profile that
        drafts keeps its measured setting (it transfers, as the shipped profiles run compiled show)."""
        return bool(prof.compiled) != compiled and prof.settings.greedy_only and prof.policy is None

    def _table(self, model: torch.nn.Module, tag: str, tokenizer_fingerprint: tuple[str, ...]):
        """(table or None, source or why) from ``tables.find_table``, cached while the store and files are unchanged."""
        from autolade.paths import repo_profiles_dir, user_dir
        from autolade.store.db import DB_NAME, ProfileStore
        from autolade.store.tables import find_table

        fp = self.fingerprint(model)
        db = user_dir() / DB_NAME
        stamp = _stamp(db, (repo_profiles_dir(),))
        key = ("table", str(db), fp["name"], fp["config_hash"], fp["dtype"], tag, tokenizer_fingerprint, stamp)
        with self._lock:
            cached = self._answers.get(key)
        if cached is not None:
            return cached

        def find(target) -> Any:
            with ProfileStore(target) as store:
                return find_table(store, model_fingerprint=fp, tokenizer_fingerprint=tokenizer_fingerprint,
                                  workload=tag, dtype=fp["dtype"])

        try:
            found = find(db if db.exists() else ":memory:")
        except StoreError as exc:  # the store cannot be read: the shipped tables still count
            _unreadable(db, exc)
            return find(":memory:")
        with self._lock:
            self._answers[key] = found
            while len(self._answers) > self._maxsize:
                self._answers.popitem(last=False)
        return found

    def _read(self, model: torch.nn.Module, tags: Sequence[str]) -> _Answers:
        """The curve and the profiles of ``tags``: from the cache while the store and the profile
        files are unchanged, else read (and cached if nothing changed while reading)."""
        from autolade.paths import repo_profiles_dir, user_dir
        from autolade.records.profile import model_key
        from autolade.store.db import DB_NAME

        hardware, fp = self.hardware(model), self.fingerprint(model)
        db, dirs = user_dir() / DB_NAME, (repo_profiles_dir(),)
        stamp = _stamp(db, dirs)
        key = (str(db), hardware.fingerprint, hardware.hardware_class, model_key(fp), fp["dtype"], stamp)
        with self._lock:
            cached = self._answers.get(key)
            if cached is not None:
                self._answers.move_to_end(key)
                if all(t in cached.found for t in tags):
                    self._hits += 1
                    return cached
            self._misses += 1
        known = cached.found if cached is not None else {}
        (curve, compiled), found, problem = _read_store(db, hardware, fp, [t for t in tags if t not in known])
        answers = _Answers(curve=curve, compiled_curve=compiled, found={**known, **found}, problem=problem)
        if not problem and _stamp(db, dirs) == stamp:  # read, and nothing was written meanwhile: safe to keep
            with self._lock:
                self._answers[key] = answers
                self._answers.move_to_end(key)
                while len(self._answers) > self._maxsize:
                    self._answers.popitem(last=False)
        return answers


def _read_store(db: Path, hardware, fp: dict[str, str], tags: Iterable[str]):
    """(curve, {tag: (profile or None, source)}, problem): one open of the store, closed again. A store
    not created yet reads as an empty one (the shared files still count); so does one that cannot be
    read (corrupt, foreign, locked), left as it is: ``problem`` says why, warned once per file."""
    from autolade.store.db import ProfileStore

    tags = list(tags)
    try:
        with ProfileStore(db if db.exists() else ":memory:") as store:
            return (*_read_open_store(store, hardware, fp, tags), "")
    except StoreError as exc:
        problem = _unreadable(db, exc)
    with ProfileStore(":memory:") as store:
        return (*_read_open_store(store, hardware, fp, tags), problem)


def _read_open_store(store, hardware, fp: dict[str, str], tags: list[str]):
    found = {
        tag: store.find_profile(hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
                                model_fingerprint=fp, dtype=fp["dtype"], workload=tag)
        for tag in tags
    }
    curves = tuple(store.latest_curve(hardware_fingerprint=hardware.fingerprint, model_fingerprint=fp, dtype=fp["dtype"],
                                      compiled=compiled) for compiled in (False, True))
    return curves, found


def _unreadable(db: Path, exc: StoreError) -> str:
    """What settings resolution says (once on stderr, and in each call's settings source) about a store it could not read."""
    from autolade.store.access import warn_once

    why = str(exc)
    if "untouched" not in why:
        why += " (autolade leaves the file untouched)"
    problem = f"the profile store could not be read, so no stored profile or curve is used: {why}"
    warn_once(str(db), problem)
    return problem


def _stamp(db: Path, dirs: Iterable[Path]) -> tuple:
    """What changes when a profile or curve is saved: the store file and its WAL journal
    (mtime, size), and each profiles dir's JSON files (name, mtime, size)."""
    parts: list[Any] = []
    for path in (db, db.with_name(db.name + "-wal")):
        try:
            st = path.stat()
            parts.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            parts.append(None)
    for folder in dirs:
        try:
            with os.scandir(folder) as entries:
                files = [(e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in entries if e.name.endswith(".json")]
            parts.append(tuple(sorted(files)))
        except OSError:
            parts.append(None)
    return tuple(parts)


@functools.cache
def default_resolver() -> SettingsResolver:
    """The process's resolver: generate() and bench share its cache."""
    return SettingsResolver()


def resolve_settings(model: torch.nn.Module, *, workload: str | None = None, tokenizer: Any = None,
                     compiled: bool | None = False) -> tuple[LookaheadConfig, str, dict | None]:
    """(config, source, policy spec) for this model on this machine; see ``SettingsResolver.resolve``."""
    return default_resolver().resolve(model, workload=workload, tokenizer=tokenizer, compiled=compiled)


def stored_cost(model: torch.nn.Module, *, compiled: bool = False):
    """c(k) in ms (``StepCurve.cost``) from this machine's stored step-latency curve for this model
    and dtype, or None when none was measured. ``compiled``: of the compiled steps, where measured."""
    curve = default_resolver().curve(model, compiled=compiled)
    return curve.cost if curve is not None else None


def stored_token_cost(model: torch.nn.Module, *, compiled: bool = False) -> float | None:
    """One more packed token's cost relative to a one-token step (``StepCurve.token_cost``) from this
    machine's stored step curve for this model and dtype, or None when none was measured."""
    curve = default_resolver().curve(model, compiled=compiled)
    return curve.token_cost() if curve is not None else None


def stored_pads_single(model: torch.nn.Module, *, compiled: bool = False) -> bool:
    """Whether this machine's stored step curve for this model and dtype says a two-token step costs less
    than a one-token step (``StepCurve.pads_single``); False when none was measured."""
    curve = default_resolver().curve(model, compiled=compiled)
    return curve is not None and curve.pads_single()


def stored_buckets(model: torch.nn.Module) -> tuple[int, ...] | None:
    """The widths a compiled decode runs at on this machine (``records.curve.useful_buckets`` of the stored
    compiled curve), or None when none was measured (then ``engine.compiled.default_buckets``)."""
    from autolade.records.curve import useful_buckets

    compiled = default_resolver().answers(model).compiled_curve
    return useful_buckets(compiled) if compiled is not None else None


def stored_compile(model: torch.nn.Module) -> bool:
    """Whether this machine's stored curves for this model and dtype say the compiled step pays
    (``records.curve.compile_pays``); False when no compiled curve was measured (``autolade profile --compile``)."""
    return default_resolver().answers(model).compile_pays()


def compile_for_run(model: torch.nn.Module, *, new_tokens: int) -> tuple[bool, str]:
    """(compile, note) for a process that decodes ``new_tokens`` in all and has compiled nothing yet (a command
    line run): compiled where the stored curves say the compiled step pays and ``new_tokens`` win back the warm-up
    the compiled curve recorded (``records.curve.breakeven_tokens``); a curve without one decides alone. The note,
    "" unless the warm-up overrules the curves, says why the steps run eager."""
    from autolade.records.curve import breakeven_tokens

    answers = default_resolver().answers(model)
    if not answers.compile_pays():
        return False, ""
    need = breakeven_tokens(answers.curve, answers.compiled_curve)
    if need is None or new_tokens >= need:
        return True, ""
    return False, (f"eager steps: compiled ones pay on this machine, but their warm-up ({answers.compiled_curve.warmup_s:.0f} s, "
                   f"measured by `autolade profile --compile`) is won back only after about {need:,.0f} new tokens, not "
                   f"{new_tokens:,}; --compile runs them anyway")


def stored_profile(model: torch.nn.Module, workload: str):
    """(profile, source) for exactly this workload; a ``ConfigError`` that names the fix if there is none."""
    return default_resolver().stored_profile(model, workload)
