"""Where an ``autolade tune`` study lives, and how several tuning workers share it.

``--storage`` names an Optuna storage that any number of ``autolade tune`` processes, on one machine
or many, may use at once for the same study:

* ``sqlite:///PATH``: one machine (the default, ``sqlite:///$AUTOLADE_HOME/optuna.db``);
* ``journal:PATH`` or a path ending in ``.log``: Optuna's append-only journal file, one machine or a
  shared filesystem;
* ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``mysql://...``): a database server, for workers on
  several machines (needs SQLAlchemy and a driver: ``pip install psycopg2-binary`` for PostgreSQL).

Sharing rules, kept here so that ``tune()`` and the tests drive one code path:

* the worker that creates the study enqueues the warm-start trials, once; a worker that joins an
  existing study enqueues nothing and reseeds its sampler (two workers with one seed would otherwise
  draw the same points);
* ``trials`` counts the study as a whole: a worker stops once the study holds that many trials that
  are done (complete, pruned, or failed by an exception the caller catches) or running; a trial that
  loses a race for the last places is dropped (FAIL, user attr ``surplus``) and not counted;
* every trial has a heartbeat: a worker killed mid-trial leaves a RUNNING trial that the next worker
  marks FAIL once its heartbeat is ``grace_s`` old; it is not counted, so a resumed run replaces it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages._heartbeat import BaseHeartbeat  # not exported; the base RDBStorage's heartbeat uses
from optuna.trial import TrialState

from autolade.errors import ConfigError

FORMS = ("sqlite:///PATH, journal:PATH (or a PATH ending in .log), "
         "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB or mysql://USER@HOST/DB")
HEARTBEAT_S = 20  # seconds between a running trial's heartbeats
GRACE_S = 120  # a running trial whose last heartbeat is older than this is a dead worker's: marked FAIL
CAUGHT_ATTR = "caught"  # user attr of a trial failed by an exception the caller catches (it counts as done)
SURPLUS_ATTR = "surplus"  # user attr of a trial dropped because the study already held its trials
_SERVERS = ("postgresql", "mysql")  # RDB schemes besides sqlite
_DRIVER_PACKAGES = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary", "mysqldb": "mysqlclient"}


class SurplusTrial(Exception):
    """This trial started after the study already held its ``trials`` (another worker took the place)."""


def default_storage_url() -> str:
    from autolade.paths import user_dir

    return f"sqlite:///{user_dir() / 'optuna.db'}"


def _is_journal(url: str) -> bool:
    return url.startswith("journal:") or ("://" not in url and url.endswith(".log"))


def check_storage(url: str | None) -> None:
    """A ConfigError, naming the accepted forms, for a ``--storage`` value that no storage could be
    opened from (unknown form, unnamed journal file, missing database driver); None (the default) is
    fine. Opens and writes nothing, so ``autolade tune`` checks it before it loads the model."""
    if url is None:
        return
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"--storage {url!r} is empty: use {FORMS}")
    if _is_journal(url):
        if not Path(url.removeprefix("journal:")).expanduser().name:
            raise ConfigError(f"--storage {url!r}: name the journal file, e.g. journal:/path/to/optuna.log")
        return
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme not in ("sqlite", *_SERVERS):
        raise ConfigError(f"--storage {url!r} is not a storage autolade knows: use {FORMS}")
    if scheme != "sqlite":
        _check_driver(url)


def open_storage(url: str, *, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S):
    """The Optuna storage a ``--storage`` value names (see the module doc for the forms)."""
    check_storage(url)
    if _is_journal(url):
        path = Path(url.removeprefix("journal:")).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        backend = optuna.storages.journal.JournalFileBackend(str(path))
        return _HeartbeatJournalStorage(backend, heartbeat_s=heartbeat_s, grace_s=grace_s)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}  # wait for another worker's write, do not fail at once
        Path(url.split(":///", 1)[-1]).expanduser().parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(3):  # workers creating the same new database at once may collide on its tables
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat_interval
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s,
                                                  grace_period=grace_s)
        except Exception as exc:  # bad URL, unreachable server, foreign database
            last = exc
            time.sleep(0.5 * (attempt + 1))
    raise ConfigError(f"cannot open the Optuna storage {url}: {last}") from None


def _check_driver(url: str) -> None:
    """Say what to install when the URL's database driver (SQLAlchemy's default for the scheme unless
    the URL names one, e.g. ``postgresql+psycopg2://``) is missing."""
    try:
        import sqlalchemy.engine.url

        dialect = sqlalchemy.engine.url.make_url(url).get_dialect()
    except Exception as exc:  # no SQLAlchemy, a malformed URL, an unknown driver name
        raise ConfigError(f"--storage {url!r}: {exc} (accepted: {FORMS})") from None
    try:
        dialect.import_dbapi()
    except ImportError:
        package = _DRIVER_PACKAGES.get(dialect.driver, dialect.driver)
        raise ConfigError(f"--storage {url.split('://', 1)[0]}://... needs the {dialect.driver} driver: "
                          f"pip install {package}") from None


def open_study(*, storage, study_name: str, sampler, pruner, direction: str = "maximize",
               warm_starts: Callable[[], Sequence[dict[str, Any]]] | None = None):
    """Create the study, or join it when another worker already has. Only the creator enqueues
    ``warm_starts()`` (called only then); a joining worker reseeds ``sampler``."""
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, sampler=sampler, pruner=pruner,
                                    direction=direction)
    except optuna.exceptions.DuplicatedStudyError:
        sampler.reseed_rng()
        return optuna.load_study(study_name=study_name, storage=storage, sampler=sampler, pruner=pruner)
    except Exception as exc:  # locked or foreign database
        raise ConfigError(f"cannot open the Optuna study {study_name!r}: {exc}") from None
    for params in warm_starts() if warm_starts is not None else ():
        study.enqueue_trial(params, skip_if_exists=True)
    return study


def counts_as_done(trial) -> bool:
    """Complete, pruned, or failed by an exception the tuner catches (a diverged trial)."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and bool(trial.user_attrs.get(CAUGHT_ATTR)))


def done_trials(study) -> list:
    return [t for t in study.get_trials(deepcopy=False) if counts_as_done(t)]


def claimed(study, *, before: int | None = None) -> int:
    """Trials done or running (numbered below ``before``, if given): the places of ``trials`` taken."""
    return sum(1 for t in study.get_trials(deepcopy=False)
               if (before is None or t.number < before) and (counts_as_done(t) or t.state == TrialState.RUNNING))


def run_trials(study, objective: Callable[[Any], float], *, trials: int, budget_s: float | None = None,
               catch: tuple[type[Exception], ...] = (), progress: bool = False) -> int:
    """Run ``objective`` in this worker until the study holds ``trials`` claimed trials (or ``budget_s``
    runs out). Returns how many trials this worker ran that count as done."""
    mine: list[int] = []

    def guarded(trial) -> float:
        if claimed(study, before=trial.number) >= trials:  # another worker took the last place first
            trial.set_user_attr(SURPLUS_ATTR, True)
            study.stop()
            raise SurplusTrial(f"the study already holds its {trials} trials")
        try:
            return objective(trial)
        except catch:
            trial.set_user_attr(CAUGHT_ATTR, True)
            raise

    def after(study, trial) -> None:
        if counts_as_done(trial):
            mine.append(trial.number)
        _fail_stale(study)
        if claimed(study) >= trials:
            study.stop()

    start = time.monotonic()
    while True:
        _fail_stale(study)
        left = trials - claimed(study)
        timeout = None if budget_s is None else budget_s - (time.monotonic() - start)
        if left <= 0 or (timeout is not None and timeout <= 0):
            return len(mine)
        before = len(mine)
        study.optimize(guarded, n_trials=left, timeout=timeout, catch=(*catch, SurplusTrial), callbacks=[after],
                       show_progress_bar=progress, gc_after_trial=False)
        if len(mine) == before:  # nothing counted this round (all surplus or uncaught failures): no loop for ever
            return len(mine)
        # else a dead worker's trial may have been failed mid-round (its place freed): go on for what is left


def _fail_stale(study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class _HeartbeatJournalStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """Optuna's journal storage with the heartbeat its RDB storage has (a system attr per running trial)."""

    def __init__(self, backend, *, heartbeat_s: int, grace_s: int) -> None:
        super().__init__(backend)
        self._heartbeat_s = heartbeat_s
        self._grace_s = grace_s

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, "heartbeat", time.time())
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker already failed it as stale
            pass

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get("heartbeat")
            if beat is None:  # killed before its first beat
                beat = t.datetime_start.timestamp() if t.datetime_start is not None else now
            if now - beat > self._grace_s:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self._heartbeat_s

    def get_heartbeat_stale_trial_callback(self):
        return None
