"""Settings resolution: stored profiles by workload, the clear error when one is missing, held-out sets."""

from __future__ import annotations

import pytest
import torch

from autolade.bench import load_sets
from autolade.config import LookaheadConfig
from autolade.errors import ConfigError
from autolade.lookup import CPU_DEFAULT, ProfileLookup, builtin_default, infer_workload, resolve_profile, stored_profile
from autolade.models import model_fingerprint
from autolade.profile_format import Profile
from autolade.prompts import load_workload, split_workload

from tiny import tiny_llama


@pytest.fixture
def llama(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    return tiny_llama()


def save_profile(model, workload: str, settings: LookaheadConfig, policy: dict | None) -> int:
    here = ProfileLookup(model)
    fp = model_fingerprint(model)
    prof = Profile(
        hardware_fingerprint=here.hardware.fingerprint, hardware_class=here.hardware.hardware_class,
        hardware_summary="test", model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=fp["dtype"],
        workload=workload, settings=settings, policy=policy, speedup=1.2, tokens_per_s=12.0,
        baseline_tokens_per_s=10.0, prompt_set=f"{workload}[held-out 3]",
    )
    return here.store.save(prof)


def test_stored_profile_by_workload_and_missing_one_names_the_fix(llama):
    with pytest.raises(ConfigError, match="autolade tune --workload code"):
        stored_profile(llama, "code")
    code = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=3, prompt_lookup_scaled=True,
                           prompt_lookup_ngram=4)
    pid = save_profile(llama, "code", code, {"name": "lookup"})
    prof, source = stored_profile(llama, "humaneval")  # the built-in workload's other name
    assert prof.settings == code and prof.policy == {"name": "lookup"} and source == f"store:exact:#{pid}"
    with pytest.raises(ConfigError, match="'chat' profile"):
        stored_profile(llama, "chat")
    # generate() with no settings: the named workload, else another workload's profile, and says which
    config, source, policy = resolve_profile(llama, workload="chat")
    assert config == code and "no 'chat' profile" in source


@pytest.mark.slow
def test_heldout_sets_are_the_tuners_holdout_split():
    held = load_sets(["code"], heldout=True)["code"]
    tune_split, hold_split = split_workload(load_workload("code"))
    assert [p.id for p in held] == [p.id for p in hold_split]
    assert not {p.id for p in held} & {p.id for p in tune_split}
    assert len(held) == round(0.3 * 164)
    assert [p.id for p in load_sets(["code"], heldout=True, limit=4)["code"]] == [p.id for p in hold_split[:4]]


def test_builtin_defaults_by_device():
    for dtype in (torch.float32, torch.bfloat16):
        config, policy = builtin_default(dtype, "cpu")
        assert config == CPU_DEFAULT and policy is None and not config.lookahead and config.prompt_lookup_scaled
    config, policy = builtin_default(torch.bfloat16, "cuda")
    assert (config.window, config.ngram, config.guesses) == (15, 5, 15) and policy["name"] == "adaptive"


def test_no_profile_falls_back_to_the_builtin_default_and_says_so(llama):
    config, source, policy = resolve_profile(llama, workload="code")
    assert config == CPU_DEFAULT and policy is None and source.startswith("default (built-in")


def _save_curve(model, points):
    from autolade.curve import StepCurve

    here = ProfileLookup(model)
    fp = model_fingerprint(model)
    here.store.save_curve(StepCurve(points=points), hardware_fingerprint=here.hardware.fingerprint,
                          hardware_class=here.hardware.hardware_class, hardware_summary="test",
                          model_fingerprint=fp, dtype=fp["dtype"])


def test_a_stored_cpu_curve_gives_cost_aware_scaled_lookup(llama):
    # the fp32 curve of DESIGN.md: a packed step costs ~2x a one-token step; no window pays
    _save_curve(llama, {300: {1: 58.0, 2: 117.0, 4: 115.0, 8: 102.0, 16: 124.0, 32: 152.0, 64: 228.0}})
    for workload in ("chat", "code"):
        config, source, policy = resolve_profile(llama, workload=workload)
        assert config == CPU_DEFAULT and policy == {"name": "cost-aware"} and "step-latency curve" in source


def test_a_smooth_cpu_curve_gives_static_scaled_lookup(llama):
    # the bf16 curve measured here: 2-6 packed tokens cost ~1.1x one, wider steps much more
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6, 32: 42.5, 64: 62.7, 128: 101.3}})
    config, source, policy = resolve_profile(llama, workload="chat")
    assert config == CPU_DEFAULT and policy is None and "step-latency curve" in source


def test_a_flat_curve_gives_the_curve_default_with_a_window(llama):
    _save_curve(llama, {300: {1: 10.0, 8: 10.0, 32: 10.2, 128: 10.5}})  # a GPU: packed tokens are free
    config, source, policy = resolve_profile(llama, workload="chat")
    assert config.lookahead and config.window >= 2 and policy is None and "step-latency curve" in source


def test_generate_with_the_cost_aware_policy_uses_the_stored_curve(llama):
    from autolade import generate
    from autolade.curve import StepCurve
    from tiny import hf_greedy, repetitive_prompt

    ids = repetitive_prompt(seed=1)
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=3, prompt_lookup_ngram=4)
    with pytest.raises(ConfigError, match="autolade profile"):
        generate(llama, ids, max_new_tokens=8, config=cfg, policy="cost-aware")
    here = ProfileLookup(llama)
    fp = model_fingerprint(llama)
    here.store.save_curve(StepCurve(points={256: {1: 10.0, 4: 10.5, 16: 12.0, 32: 15.0}}),
                          hardware_fingerprint=here.hardware.fingerprint, model_fingerprint=fp, dtype=fp["dtype"])
    res = generate(llama, ids, max_new_tokens=48, config=cfg, policy="cost-aware")
    assert res.sequences[0, ids.shape[1]:].tolist() == hf_greedy(llama, ids, 48)
    assert res.stats.policy == "cost-aware" and res.stats.tokens_per_step > 1.0


@pytest.mark.parametrize("text, workload", [
    ("def f(x):\n    return x + 1\n", "code"),
    ("Write a Python function that checks whether a number is prime.", "code"),
    ("Please fix this SQL query: select * form t", "code"),
    ("Explain recursion to a child.", "chat"),
    ("Write a persuasive essay about city parks.", "chat"),
])
def test_infer_workload_from_the_prompt(text, workload):
    assert infer_workload(text) == workload
