"""The server's batch loop: requests decoded together, joining and leaving at step boundaries."""

import threading

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

from autolade.config import LookaheadConfig
from autolade.engine.batch import RowRequest
from autolade.engine.batch_prefill import PrefillChoice
from autolade.serve.batching import BatchLoop
from autolade.serve.turns import Cancelled

pytestmark = pytest.mark.usefixtures("one_thread")
CONFIG = LookaheadConfig(window=3, ngram=3, guesses=3)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def prompts(n: int) -> list[list[int]]:
    return [repetitive_prompt(length=12 + 9 * i, seed=i)[0].tolist() for i in range(n)]


def test_jobs_queued_together_share_every_forward_and_stay_exact(model):
    loop = BatchLoop(model, max_rows=8, start=False, prefill_choice=PrefillChoice(prior=True, learn=False))
    rows = [repetitive_prompt(length=20 + 2 * i, seed=i)[0].tolist() for i in range(3)]  # close enough to pad together
    jobs = [loop.submit(RowRequest(prompt=p, config=CONFIG, max_new_tokens=20)) for p in rows]
    loop.start()
    try:
        for p, job in zip(rows, jobs):
            assert job.wait().out == hf_greedy(model, torch.tensor([p]), 20)
        assert loop.decoder.log.steps[0].rows == 3
        assert loop.decoder.log.prefills == 1  # admitted together: one padded forward
        assert loop.steps < sum(len(job.row.log.steps) for job in jobs)  # shared forwards
    finally:
        loop.close()


def test_beyond_max_rows_a_job_waits_for_a_free_row(model):
    loop = BatchLoop(model, max_rows=2, start=False)
    rows = prompts(3)
    budgets = [6, 30, 12]
    jobs = [loop.submit(RowRequest(prompt=p, config=CONFIG, max_new_tokens=n)) for p, n in zip(rows, budgets)]
    loop.start()
    try:
        for p, n, job in zip(rows, budgets, jobs):
            assert job.wait().out == hf_greedy(model, torch.tensor([p]), n)
        assert max(s.rows for s in loop.decoder.log.steps) == 2
    finally:
        loop.close()


def test_a_cancelled_job_leaves_and_a_failing_one_does_not_stop_the_loop(model):
    loop = BatchLoop(model, max_rows=4, start=False, prefill_choice=PrefillChoice(prior=True, learn=False))
    rows = prompts(2)
    gone = threading.Event()
    seen: list[int] = []

    def on_tokens(tokens: list[int]) -> None:
        seen.extend(tokens)
        if len(seen) >= 4:
            gone.set()

    cancelled = loop.submit(RowRequest(prompt=rows[0], config=CONFIG, max_new_tokens=400, on_tokens=on_tokens),
                            cancelled=gone.is_set)
    # beyond the vocabulary, and as long as the kept prompt: both are prefilled in one forward, which fails
    broken = loop.submit(RowRequest(prompt=[10_000] * len(rows[1]), config=CONFIG, max_new_tokens=5))
    kept = loop.submit(RowRequest(prompt=rows[1], config=CONFIG, max_new_tokens=24))
    loop.start()
    try:
        with pytest.raises(Cancelled):
            cancelled.wait()
        with pytest.raises(IndexError):
            broken.wait()
        assert kept.wait().out == hf_greedy(model, torch.tensor([rows[1]]), 24)
        assert len(seen) < 400 and loop.in_flight == 0
    finally:
        loop.close()


def test_a_job_whose_client_left_while_it_waited_never_gets_a_row(model):
    loop = BatchLoop(model, max_rows=1, start=False)
    rows = prompts(2)
    running = loop.submit(RowRequest(prompt=rows[0], config=CONFIG, max_new_tokens=300))
    left = loop.submit(RowRequest(prompt=rows[1], config=CONFIG, max_new_tokens=40), cancelled=lambda: True)
    loop.start()
    try:
        with pytest.raises(Cancelled):
            left.wait()
        assert not running.done.is_set(), "the waiting job was dropped at once, not after it got the one row"
        assert running.wait().out == hf_greedy(model, torch.tensor([rows[0]]), 300)
        assert left.row is None and max(s.rows for s in loop.decoder.log.steps) == 1
    finally:
        loop.close()


def test_a_compiled_loop_keeps_one_graph_as_jobs_join_and_leave(model):
    from autolade.engine.batch_compiled import CompiledBatchRunner

    runner = CompiledBatchRunner(model)
    loop = BatchLoop(model, max_rows=2, start=False, runner=runner)  # a third job waits, then joins mid-way
    rows, budgets = prompts(3), [6, 30, 12]
    jobs = [loop.submit(RowRequest(prompt=p, config=CONFIG, max_new_tokens=n)) for p, n in zip(rows, budgets)]
    loop.start()
    try:
        for p, n, job in zip(rows, budgets, jobs):
            assert job.wait().out == hf_greedy(model, torch.tensor([p]), n)
        assert runner.log.compiles == 1 and runner.log.calls[0] == loop.steps
    finally:
        loop.close()
