"""The compiled step (torch.compile at fixed widths on a static cache) against transformers' greedy decoding,
token for token, on tiny Llama, Qwen2 and Gemma 3 models; graphs are counted, so a recompile is a failure.

Each test uses one or two buckets: a graph costs seconds of inductor warm-up on CPU."""

import pytest
import torch
from tiny import ARCHS, hf_greedy, repetitive_prompt, tiny_gemma3

from autolade.config import LookaheadConfig
from autolade.engine.compiled import CompiledRunner, bucket_of, buckets_for, compile_options
from autolade.engine.decode import lookahead_decode

LOOKAHEAD = LookaheadConfig(window=2, ngram=3, guesses=2)  # packs up to 29 tokens: one bucket of 32
GREEDY = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)  # one token a step: the single-token mask


def test_buckets():
    assert bucket_of(1, (1, 8, 16)) == 1 and bucket_of(9, (1, 8, 16)) == 16
    with pytest.raises(ValueError, match="largest bucket 16"):
        bucket_of(17, (1, 8, 16))
    assert buckets_for(29, (16, 1, 8)) == (1, 8, 16, 32)  # a setting wider than the buckets gets one more
    assert buckets_for(12, (1, 8, 16)) == (1, 8, 16)


def test_weights_are_frozen_into_a_cpu_graph_only():
    assert compile_options(torch.device("cpu"), "default", "inductor") == {"freezing": True}
    assert compile_options(torch.device("cuda"), "reduce-overhead", "inductor") is None  # CUDA graphs, weights as inputs
    assert compile_options(torch.device("cpu"), "default", "eager") is None  # only inductor freezes
    runner = CompiledRunner(ARCHS["llama"](), capacity=64, buckets=(8,))
    assert runner.options == {"freezing": True}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_compiled_lookahead_matches_hf_greedy_without_recompiling(arch):
    model = ARCHS[arch]()
    runner = CompiledRunner(model, capacity=256, buckets=(32,))
    for seed, length in ((0, 40), (1, 57)):  # a second prompt of another length reuses the graph
        ids = repetitive_prompt(seed=seed, length=length)
        out, log = lookahead_decode(model, ids, config=LOOKAHEAD, max_new_tokens=40, runner=runner)
        assert out == hf_greedy(model, ids, 40)
        assert any(s.accepted > 0 for s in log.steps)  # drafts were verified through the compiled step
    assert runner.log.compiles == 1, runner.log.graphs
    assert set(runner.log.calls) == {32} and runner.log.calls[32] >= 20
    assert runner.log.warmup_s[32] > 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_gemma3_sliding_window_compiled_matches_hf(dynamic):
    """Context beyond the 16-token sliding window, one-token steps and packed steps through the same runner: a
    graph per bucket (as CUDA graphs run), or one graph of dynamic width (a CPU's), where a lone token runs as 2."""
    model = tiny_gemma3(sliding_window=16)
    runner = CompiledRunner(model, capacity=256, buckets=(1, 32), dynamic=dynamic)
    ids = repetitive_prompt(seed=3)
    for config in (GREEDY, LOOKAHEAD):
        out, _ = lookahead_decode(model, ids, config=config, max_new_tokens=50, runner=runner)
        assert out == hf_greedy(model, ids, 50)
    if dynamic:
        assert runner.log.compiles == 1 and set(runner.log.calls) == {2, 32}
    else:
        assert runner.log.compiles == 2 and set(runner.log.calls) == {1, 32}


def test_a_cpu_runner_has_one_graph_of_dynamic_width_by_default():
    model = ARCHS["qwen2"]()
    runner = CompiledRunner(model, capacity=256)
    assert runner.dynamic and runner.buckets[0] == 2  # the CPU widths: a lone token is padded to 2
    assert runner.ruler  # attention over the prefix and the step, not the whole capacity
    ids = repetitive_prompt(seed=5, length=30)
    out, log = lookahead_decode(model, ids, config=LOOKAHEAD, max_new_tokens=30, runner=runner)
    assert out == hf_greedy(model, ids, 30)
    assert runner.log.compiles == 1 and len(runner.log.calls) > 1  # several widths, one graph


def test_a_decode_beyond_the_capacity_is_refused():
    model = ARCHS["llama"]()
    runner = CompiledRunner(model, capacity=64, buckets=(32,))
    with pytest.raises(ValueError, match="holds 64 tokens"):
        lookahead_decode(model, repetitive_prompt(), config=LOOKAHEAD, max_new_tokens=40, runner=runner)
    assert runner.log.compiles == 0


@pytest.mark.parametrize("ruler", [False, True])
def test_padding_rows_see_only_themselves(ruler):
    """Over the whole capacity (CUDA graphs' one shape), or up to the step's end (a dynamic graph's ruler)."""
    model = ARCHS["llama"]()
    runner = CompiledRunner(model, capacity=16, buckets=(8,), ruler=ruler)
    eager = torch.zeros((1, 1, 3, 5 + 3))  # a 3-token step on 5 cached tokens, every column visible
    full = runner.static_mask(eager, base=5, positions=torch.arange(5, 8).unsqueeze(0), width=8)
    assert full.shape == (1, 1, 8, 5 + 8 if ruler else 16)
    visible = (full[0, 0] == 0).nonzero().tolist()
    assert [c for r, c in visible if r == 0] == list(range(8))  # the step's own columns, nothing past them
    assert [c for r, c in visible if r == 5] == [10]  # padding row 5 is written at 5 + 5 and sees that alone
