"""The compiled batched step (engine/batch_compiled.py): one graph of dynamic rows, width and length runs
every step of a batch, and every row's tokens stay greedy decoding's on that row alone, in fp32, token for
token, on tiny Llama, Qwen2 and Gemma 3 models (sliding window 16). Graphs are counted: a recompile fails."""

import pytest
import torch
from test_batch import CONFIGS, MODELS, prompts, reference

from autolade.config import LookaheadConfig
from autolade.engine.batch import BatchDecoder, RowRequest, decode_batch
from autolade.engine.batch_compiled import CompiledBatchRunner
from autolade.engine.batch_prefill import PrefillChoice
from autolade.engine.compiled import widen_mask
from autolade.engine.decode import ModelRunner

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)  # one token a row a step: a padding column


@pytest.mark.parametrize("arch", list(MODELS))
def test_batches_that_change_shape_every_step_run_exact_on_one_graph(arch):
    """Rows of different lengths and stops (4 rows down to a lone one), a row joining mid-way into a cache
    too small to hold it, and one-token steps: all one graph, all equal to greedy alone."""
    model = MODELS[arch]()
    runner = CompiledBatchRunner(model)
    rows, budgets = prompts(40, 6, 70, 20), [30, 45, 12, 40]
    requests = [RowRequest(prompt=p, config=CONFIGS["W3N3G3+lookup"], max_new_tokens=n) for p, n in zip(rows, budgets)]
    done, log = decode_batch(model, requests, prefill_choice=PrefillChoice(prior=True, learn=False), runner=runner)
    for b, (p, n, row) in enumerate(zip(rows, budgets, done)):
        assert row.out == reference(model, p, n), f"row {b}"
    assert sum(s.accepted for row in done for s in row.log.steps) > 10, "drafts must be accepted, else the test proves little"
    assert [s.rows for s in log.steps][0] == 4 and log.steps[-1].rows == 1, "a lone row ran (on the spare row)"
    assert len({s.width for s in log.steps}) > 3
    steps = len(log.steps)

    first, second, late = prompts(20, 50, 90)
    decoder = BatchDecoder(model, capacity=16, runner=runner)  # far too small: the cache grows, the graph stays
    decoder.add(RowRequest(prompt=first, config=CONFIGS["lookup+recycle"], max_new_tokens=40))
    decoder.add(RowRequest(prompt=second, config=GREEDY, max_new_tokens=10))
    for _ in range(3):
        decoder.step()
    joined = decoder.add(RowRequest(prompt=late, config=CONFIGS["W3N3G3+lookup"], max_new_tokens=30))
    out = decoder.run()
    steps += len(decoder.log.steps)
    assert out[0].out == reference(model, first, 40) and out[1].out == reference(model, second, 10)
    assert out[joined].out == reference(model, late, 30)

    done, log = decode_batch(model, [RowRequest(prompt=p, config=GREEDY, max_new_tokens=n) for p, n in zip(rows, budgets)],
                             runner=runner)
    assert [row.out for row in done] == [reference(model, p, n) for p, n in zip(rows, budgets)]
    assert {s.width for s in log.steps} == {1}, "one-token steps (run two wide: a padding column)"
    assert runner.log.compiles == 1, runner.log.graphs
    assert runner.log.calls == {0: steps + len(log.steps)}, "every step of the three batches ran compiled"
    assert runner.log.warmup_s[0] > 0


def test_a_padding_column_sees_only_itself():
    mask = torch.zeros((2, 1, 1, 4))  # two rows, one token each, 3 columns before it
    mask[1, 0, 0, 0] = torch.finfo(mask.dtype).min  # row 1 does not see column 0 (a hole)
    wide = widen_mask(mask, 3)
    low = torch.finfo(mask.dtype).min
    assert wide.shape == (2, 1, 3, 6)
    assert torch.equal(wide[:, :, :1, :4], mask) and (wide[:, :, :1, 4:] == low).all(), "real rows never see padding"
    for j in (1, 2):
        assert (wide[:, 0, j] == 0).nonzero()[:, 1].tolist() == [3 + j, 3 + j], "padding column j sees only itself"


def test_the_step_budget_is_told_the_shape_that_runs():
    """Narrow steps run padded to two columns and two rows (one graph for every shape); the eager runner
    computes what it is given."""
    model = MODELS["llama"]()
    compiled = CompiledBatchRunner(model)
    assert compiled.step_tokens(1, 1) == 4
    assert compiled.step_tokens(4, 1) == 8
    assert compiled.step_tokens(4, 3) == 12
    assert ModelRunner(model).step_tokens(4, 1) == 4
