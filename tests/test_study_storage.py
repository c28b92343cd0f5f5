"""Several tuning workers sharing one Optuna study: two real processes drive the code path ``tune()``
uses (open_storage -> open_study with warm starts -> run_trials) on SQLite, Optuna's journal file and
a real PostgreSQL server, with a cheap objective in place of a model."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState
from postgres_server import postgres_url  # noqa: F401  (session fixture)

from autolade.errors import ConfigError
from autolade.tuning.study_storage import (
    CAUGHT_ATTR,
    _HeartbeatJournalStorage,
    check_storage,
    claimed,
    counts_as_done,
    done_trials,
    open_storage,
    open_study,
    run_trials,
)

WARM = [{"x": 0, "c": "a", "f": 0.5}, {"x": 5, "c": "b", "f": 0.25}, {"x": 9, "c": "c", "f": 0.75}, {"x": 2, "c": "a", "f": 0.125}]
TRIALS = 12


class Diverged(Exception):
    """Stands for tune's ExactnessError: caught, and the trial counts as done."""


def _study(url: str, name: str, *, heartbeat_s: int = 20, grace_s: int = 120):
    """The study as tune() opens it (same sampler and pruner settings)."""
    return open_study(storage=open_storage(url, heartbeat_s=heartbeat_s, grace_s=grace_s), study_name=name,
                      warm_starts=lambda: WARM, sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=8),
                      pruner=optuna.pruners.MedianPruner(n_startup_trials=6, n_warmup_steps=1))


def _objective(trial, *, sleep_s: float = 0.05) -> float:
    x = trial.suggest_int("x", 0, 10)
    c = trial.suggest_categorical("c", ["a", "b", "c"])
    f = trial.suggest_float("f", 0.0, 1.0)
    trial.set_user_attr("worker", os.getpid())
    time.sleep(sleep_s)
    if x == 10:
        raise Diverged("x=10 stands for a diverged output")
    return -((x - 3) ** 2) + f + (c == "b")


def _worker(url: str, name: str, barrier, hang: bool) -> None:
    """One `autolade tune` worker: waits for the other, then opens the study and runs trials."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    barrier.wait() if barrier is not None else None
    study = _study(url, name, heartbeat_s=1, grace_s=2)
    if hang:  # a worker killed mid-trial: its trial stays RUNNING
        run_trials(study, lambda t: time.sleep(600) or 0.0, trials=TRIALS)
    run_trials(study, _objective, trials=TRIALS, catch=(Diverged,))


def _spawn(url: str, name: str, *, n: int, hang: bool = False) -> tuple[list, object]:
    """Started worker processes, and the barrier they meet at (keep it alive until they have started)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n) if n > 1 else None
    procs = [ctx.Process(target=_worker, args=(url, name, barrier, hang)) for _ in range(n)]
    for p in procs:
        p.start()
    return procs, barrier


def _join(procs, timeout: float = 120) -> None:
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"worker exited with {p.exitcode}"


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def storage_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}"
    if request.param == "journal":
        return f"journal:{tmp_path / 'optuna.log'}"
    return request.getfixturevalue("postgres_url")


def test_two_workers_share_one_study(storage_url, request):
    name = f"two-workers-{request.node.callspec.id}"
    procs, _barrier = _spawn(storage_url, name, n=2)
    _join(procs)
    study = optuna.load_study(study_name=name, storage=open_storage(storage_url))
    trials = study.get_trials()
    done = [t for t in trials if counts_as_done(t)]
    assert len(done) == TRIALS  # --trials counts the whole study, not each worker
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert Counter(t.user_attrs["worker"] for t in done).keys().__len__() == 2  # both workers ran trials
    fixed = Counter(repr(sorted(t.system_attrs["fixed_params"].items())) for t in trials if "fixed_params" in t.system_attrs)
    assert sorted(fixed.values()) == [1] * len(WARM)  # each warm start enqueued and run exactly once
    assert all(counts_as_done(t) for t in trials if "fixed_params" in t.system_attrs)
    sampled = [t.params["f"] for t in done if "fixed_params" not in t.system_attrs]
    assert len(set(sampled)) == len(sampled)  # the joining worker reseeded: no point drawn twice


def test_killed_worker_is_replaced_on_resume(storage_url, request):
    name = f"killed-{request.node.callspec.id}"
    (proc,), _ = _spawn(storage_url, name, n=1, hang=True)
    storage = open_storage(storage_url, heartbeat_s=1, grace_s=2)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait for the worker's trial to start, then kill the worker mid-trial
        try:
            study = optuna.load_study(study_name=name, storage=storage)
            if any(t.state == TrialState.RUNNING for t in study.get_trials()):
                break
        except KeyError:  # not created yet
            pass
        time.sleep(0.2)
    proc.kill()
    proc.join()
    study = _study(storage_url, name, heartbeat_s=1, grace_s=2)
    assert claimed(study) == 1  # within the grace period the dead worker's trial still holds its place
    time.sleep(3.5)
    ran = run_trials(study, _objective, trials=TRIALS, catch=(Diverged,))
    trials = study.get_trials()
    assert ran == TRIALS and len(done_trials(study)) == TRIALS  # the dead trial does not count as done
    killed = [t for t in trials if not counts_as_done(t)]
    assert [t.state for t in killed] == [TrialState.FAIL] and killed[0].number == 0
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def test_resume_runs_only_the_missing_trials_and_counts_caught_failures(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = _study(url, "resume")

    def diverge_at_x10(trial):
        trial.suggest_int("x", 0, 10)  # the first trial is the first warm start (x=0)
        if trial.number == 1:
            raise Diverged("stands for ExactnessError")
        return 1.0

    assert run_trials(study, diverge_at_x10, trials=3, catch=(Diverged,)) == 3
    caught = [t for t in study.get_trials() if t.user_attrs.get(CAUGHT_ATTR)]
    assert [(t.number, t.state) for t in caught] == [(1, TrialState.FAIL)]
    again = _study(url, "resume")  # joins: enqueues nothing more
    assert run_trials(again, diverge_at_x10, trials=3) == 0
    assert run_trials(again, diverge_at_x10, trials=5) == 2
    assert len(done_trials(again)) == 5 and len(again.get_trials()) == 5


def test_storage_forms(tmp_path):
    assert isinstance(open_storage(f"sqlite:///{tmp_path / 'a' / 'o.db'}"), optuna.storages.RDBStorage)
    assert isinstance(open_storage(f"journal:{tmp_path / 'j.log'}"), _HeartbeatJournalStorage)
    assert isinstance(open_storage(str(tmp_path / "plain.log")), _HeartbeatJournalStorage)
    with pytest.raises(ConfigError, match="sqlite:///PATH, journal:PATH"):
        open_storage("redis://localhost/0")
    with pytest.raises(ConfigError, match="sqlite:///PATH"):
        open_storage(str(tmp_path / "optuna.db"))  # a bare path that is not a journal


def test_check_storage_refuses_without_opening_anything(tmp_path):
    """What `autolade tune` checks before it loads the model: the same refusals, nothing created."""
    for good in (None, f"sqlite:///{tmp_path / 'a' / 'o.db'}", f"journal:{tmp_path / 'b' / 'j.log'}", str(tmp_path / "c.log")):
        check_storage(good)
    for bad, match in (("bogus://x", "is not a storage autolade knows"), ("journal:", "name the journal file"),
                       ("", "is empty"), ("postgresql+nosuchdriver://u@h/db", "postgresql://USER")):
        with pytest.raises(ConfigError, match=match):
            check_storage(bad)
    assert list(tmp_path.iterdir()) == []


def test_only_the_creator_enqueues_warm_starts(tmp_path):
    url = f"journal:{tmp_path / 'o.log'}"
    first, second = _study(url, "s"), _study(url, "s")
    assert len(first.get_trials()) == len(WARM) == len(second.get_trials())
