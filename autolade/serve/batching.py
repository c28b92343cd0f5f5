"""Continuous batching for the server: one thread owns the model and a ``BatchDecoder``; requests join
the batch at the next step boundary and leave when they finish or their client goes away.

A request thread calls ``BatchLoop.submit`` and waits on the returned ``Job``; the loop admits waiting
jobs (prefilled together, then joined), runs one forward for every row in flight, hands each row's
new tokens to its job's ``on_tokens`` and completes the jobs whose rows ended. A row never waits for
another to finish: a long request costs the others one row's width per step, not its whole length.
Each row's tokens are those of ``generate`` on its prompt alone (``engine/batch.py``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from autolade.engine.batch import BatchDecoder, Row, RowRequest
from autolade.engine.batch_prefill import PrefillChoice
from autolade.engine.decode import ModelRunner
from autolade.serve.turns import Cancelled


@dataclass(eq=False)
class Job:
    """One request in the loop: its engine request, a cancel test polled every step, and the outcome."""

    request: RowRequest
    cancelled: Callable[[], bool] = lambda: False
    done: threading.Event = field(default_factory=threading.Event)
    row: Row | None = None  # the finished row (its tokens and log)
    error: BaseException | None = None

    def wait(self) -> Row:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.row is not None
        return self.row


class BatchLoop:
    """Decodes every submitted job in one batch, ``max_rows`` rows at most (the rest wait their turn)."""

    def __init__(self, model: torch.nn.Module, *, max_rows: int = 8, start: bool = True,
                 step_cost: Callable[[float], float] | None = None, prefill_choice: PrefillChoice | None = None,
                 runner: ModelRunner | None = None) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.model = model
        self.max_rows = max_rows
        self.step_cost = step_cost  # the machine's step curve c(k): each step's packed width follows it
        # rows admitted together: one padded prefill or one each, learned from their times; outlives the decoders
        self.prefill_choice = prefill_choice or PrefillChoice.for_device(next(model.parameters()).device)
        self.runner = runner  # whose forwards run the steps (a compiled batch runner keeps its graph); None: eager
        self.decoder = BatchDecoder(model, step_cost=step_cost, prefill_choice=self.prefill_choice, runner=runner)
        self.jobs: dict[int, Job] = {}  # row key -> job, for the rows in flight
        self.waiting: deque[Job] = deque()
        self.steps = 0  # batched forwards so far
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="autolade-batch", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Start decoding (``start=False`` lets a caller queue jobs first, to see them admitted together)."""
        self._thread.start()

    def submit(self, request: RowRequest, *, cancelled: Callable[[], bool] = lambda: False) -> Job:
        job = Job(request=request, cancelled=cancelled)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch loop is closed")
            self.waiting.append(job)
            self._cond.notify()
        return job

    @property
    def in_flight(self) -> int:
        return len(self.jobs)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self.waiting or self.jobs)
                if self._closed:
                    break
                self._drop_waiting_cancelled()
                admit = [self.waiting.popleft() for _ in range(min(len(self.waiting), self.max_rows - len(self.jobs)))]
            if admit:
                self._admit(admit)
            self._drop_cancelled()
            if not self.decoder.rows:
                continue
            try:
                self.decoder.step()
                self.steps += 1
            except Exception as exc:  # a fault in the forward: every row in flight fails, the loop goes on
                self._fail_all(exc)
                continue
            self._complete()
        self._fail_all(RuntimeError("the server is shutting down"))
        for job in self.waiting:
            job.error = RuntimeError("the server is shutting down")
            job.done.set()
        self.decoder.close()

    def _admit(self, jobs: list[Job]) -> None:
        """Prefill the jobs together (``BatchDecoder.add_many``: keys in request order, from ``next_key``).
        If a group's forward fails, the groups before it are in; its jobs and the rest retry alone, so that
        only a job at fault gets an error."""
        first = self.decoder.next_key
        try:
            self.decoder.add_many([job.request for job in jobs])
        except Exception:  # the jobs it left out retry alone below, each getting its own error
            pass
        admitted = {row.key for row in self.decoder.rows} | set(self.decoder.finished)
        for key, job in enumerate(jobs, start=first):
            if key not in admitted:
                try:
                    key = self.decoder.add(job.request)
                except Exception as exc:
                    job.error = exc
                    job.done.set()
                    continue
            self.jobs[key] = job
        self._complete()  # a row may end at its first token

    def _drop_waiting_cancelled(self) -> None:
        """Jobs whose client went away before they got a row: never admitted (called under the lock)."""
        for job in [j for j in self.waiting if j.cancelled()]:
            self.waiting.remove(job)
            job.error = Cancelled()
            job.done.set()

    def _drop_cancelled(self) -> None:
        for key, job in list(self.jobs.items()):
            if key in self.decoder.finished or not job.cancelled():
                continue
            self.decoder.cancel(key)
            del self.jobs[key]
            job.error = Cancelled()
            job.done.set()

    def _complete(self) -> None:
        for key in [k for k in self.decoder.finished if k in self.jobs]:
            job = self.jobs.pop(key)
            job.row = self.decoder.finished.pop(key)
            job.done.set()

    def _fail_all(self, exc: BaseException) -> None:
        for job in list(self.jobs.values()):
            job.error = exc
            job.done.set()
        self.jobs.clear()
        self.decoder.close()
        self.decoder = BatchDecoder(self.model, step_cost=self.step_cost, prefill_choice=self.prefill_choice,
                                    runner=self.runner)  # a fresh cache: the failed step may have left it half written
