"""The measurement harness on a tiny random-weight Llama: timing (CUDA sync order), the pad rule, the
three methods, the reference and its top-2 gaps, divergences, labels."""

from __future__ import annotations

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

from autolade.config import LookaheadConfig, parse_config
from autolade.tuning.harness import (
    PLD_TOKENS,
    HFSteps,
    Timer,
    divergence,
    first_divergence,
    greedy_reference,
    hf_kwargs,
    noise_gap,
    rotate,
    run_autolade,
    run_greedy,
    run_pld,
    setting_label,
)

N_NEW = 12


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def ids():
    return repetitive_prompt(seed=4)


@pytest.fixture(scope="module")
def reference(model, ids):
    return greedy_reference(model, ids, max_new_tokens=N_NEW, keep_logits=True)


def _recording_timer(log: list[str]) -> Timer:
    ticks = iter([10.0, 10.25])

    def now() -> float:
        log.append("now")
        return next(ticks)

    return Timer(now=now, sync=lambda device: log.append(f"sync {device}"))


def test_timer_synchronises_cuda_before_each_clock_reading():
    log: list[str] = []
    out, secs = _recording_timer(log)(torch.device("cuda:0"), lambda: log.append("call") or "result")
    assert out == "result" and secs == pytest.approx(0.25)
    assert log == ["sync cuda:0", "now", "call", "sync cuda:0", "now"]


def test_timer_never_synchronises_on_cpu():
    log: list[str] = []
    _, secs = _recording_timer(log)(torch.device("cpu"), lambda: log.append("call"))
    assert log == ["now", "call", "now"] and secs == pytest.approx(0.25)


def test_methods_use_the_given_timer(model, ids):
    for run in (run_greedy, run_pld):
        log: list[str] = []
        assert run(model, ids, max_new_tokens=2, timer=_recording_timer(log)).seconds == pytest.approx(0.25)
        assert log == ["now", "now"]
    log = []
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0)
    assert run_autolade(model, ids, max_new_tokens=2, config=cfg, timer=_recording_timer(log)).seconds == pytest.approx(0.25)
    assert log == ["now", "now"]


def test_pad_rule():
    m = tiny_llama()  # no EOS, no pad token
    ids = torch.tensor([[5, 6, 7]])
    kw = hf_kwargs(m, ids, max_new_tokens=3)
    assert (kw["pad_token_id"], kw["eos_token_id"], kw["do_sample"], kw["max_new_tokens"]) == (0, None, False, 3)
    assert torch.equal(kw["attention_mask"], torch.ones_like(ids))
    kw = hf_kwargs(m, ids, max_new_tokens=3, eos=[9, 4])
    assert (kw["pad_token_id"], kw["eos_token_id"]) == (9, [9, 4])  # no pad token: the first EOS
    m.generation_config.eos_token_id = 8
    assert hf_kwargs(m, ids, max_new_tokens=3)["eos_token_id"] == [8]  # the model's own EOS when none is given
    m.generation_config.pad_token_id = 2
    assert hf_kwargs(m, ids, max_new_tokens=3, eos=[9])["pad_token_id"] == 2  # the model's pad token first


def test_three_methods_give_greedy_tokens(model, ids):
    want = hf_greedy(model, ids, N_NEW)
    greedy = run_greedy(model, ids, max_new_tokens=N_NEW, count_steps=True)
    assert greedy.tokens == want and greedy.seconds > 0
    assert isinstance(greedy.stats, HFSteps) and greedy.stats.packed[0] == ids.shape[1]
    assert greedy.stats.steps == N_NEW - 1 and set(greedy.stats.packed[1:]) == {1}
    assert run_greedy(model, ids, max_new_tokens=N_NEW).stats is None  # no hook unless asked
    pld = run_pld(model, ids, max_new_tokens=N_NEW, count_steps=True)
    assert pld.tokens == want
    assert 1 <= max(pld.stats.packed[1:]) <= PLD_TOKENS + 1  # drafts of at most PLD_TOKENS after the last token
    ours = run_autolade(model, ids, max_new_tokens=N_NEW, config=LookaheadConfig(window=2, ngram=3, guesses=2))
    assert ours.tokens == want and ours.stats.steps >= 1


def test_reference_gaps_are_the_models_own(model, ids, reference):
    assert reference.tokens == hf_greedy(model, ids, N_NEW)
    assert reference.logits.shape == (N_NEW, model.config.vocab_size)
    with torch.inference_mode():
        full = torch.cat([ids, torch.tensor([reference.tokens])], dim=1)
        logits = model(full).logits[0, ids.shape[1] - 1 : -1].float()
    top = logits.topk(2, dim=-1).values
    assert reference.gaps == pytest.approx((top[:, 0] - top[:, 1]).tolist(), abs=1e-4)
    assert greedy_reference(model, ids, max_new_tokens=N_NEW).logits is None  # not kept unless asked


def test_divergence_at_the_first_differing_token(reference):
    ref = reference.tokens
    assert divergence(ref, list(ref), reference) is None
    got = ref[:3] + [(ref[3] + 1) % 96] + ref[4:]
    div = divergence(ref, got, reference)
    assert (div.index, div.ref_token, div.got_token) == (3, ref[3], (ref[3] + 1) % 96)
    assert div.gap_top2 == pytest.approx(reference.gaps[3])
    row = reference.logits[3]
    assert div.gap_chosen == pytest.approx(float(row[ref[3]] - row[got[3]]))
    assert div.gap_chosen >= div.gap_top2 - 1e-6  # the reference token was the argmax
    assert div.within_noise(div.gap_top2 + 1e-3) and not div.within_noise(div.gap_top2)
    # without the reference's logits: where and what, but no gaps
    bare = divergence(ref, got)
    assert (bare.index, bare.gap_top2, bare.gap_chosen) == (3, None, None) and not bare.within_noise(1e9)


def test_an_output_of_another_length_is_never_noise(reference):
    ref = reference.tokens
    short = divergence(ref, ref[:5], reference)
    assert (short.index, short.ref_token, short.got_token) == (5, ref[5], None)
    assert short.gap_top2 == pytest.approx(reference.gaps[5]) and not short.within_noise(1e9)
    assert first_divergence(ref, ref + [1]) == len(ref) and first_divergence([], []) is None


def test_noise_gap_per_dtype():
    assert noise_gap(torch.float32) == 1e-4 and noise_gap(torch.bfloat16) == 1.0 and noise_gap(torch.float16) == 0.1
    assert noise_gap(torch.float64) == 1e-4  # unknown dtypes: fp32's


def test_setting_label():
    assert setting_label(parse_config("0,0,0,0")) == "greedy"
    assert setting_label(parse_config("0,4,0,10")) == "lookup10"
    assert setting_label(parse_config("4,4,4,10")) == "W4N4G4+L10"
    assert setting_label(parse_config("2,3,2,0,recycle=16")) == "W2N3G2+R16"
    assert setting_label(parse_config("0,0,0,0,recycle=8")) == "recycle8"
    assert setting_label(parse_config("0,4,0,10,recycle=8")) == "lookup10+R8"
    assert setting_label(parse_config("0,4,0,10,recycle=8"), "cost-aware") == "lookup10 cost-aware"
    assert setting_label(parse_config("4,4,4,0"), "adaptive") == "W4N4G4 adaptive"
    assert setting_label(parse_config("4,4,4,0"), "static") == setting_label(parse_config("4,4,4,0"), None) == "W4N4G4"
    scaled = parse_config("2,3,2,16,drafts=3,scaled=1")
    assert setting_label(scaled, {"name": "adaptive", "margin": 1.1}) == "W2N3G2+L16x3s adaptive"
    assert setting_label(scaled, "policies/adaptive-cpu.json") == "W2N3G2+L16x3s adaptive-cpu"
    # policies that run no window drop W/N/G; cost-aware sizes drafts itself, so no "s" either
    assert setting_label(scaled, {"name": "lookup", "max_draft": 16}) == "lookup16x3s lookup"
    assert setting_label(scaled, {"name": "cost-aware"}) == "lookup16x3 cost-aware"


def test_rotate():
    assert rotate("abc", 0) == ["a", "b", "c"] and rotate("abc", 4) == ["b", "c", "a"] and rotate([], 3) == []
