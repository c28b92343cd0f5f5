"""Attention implementation per step kind: the pure plan, and the switch on a tiny model (CPU stand-ins)."""

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_gemma3, tiny_llama

from autolade.config import LookaheadConfig
from autolade.engine.attention import (
    FLASH,
    AttentionPlan,
    AttentionSwitch,
    flash_attn_installed,
    flash_usable,
    load_implementation,
    model_plan,
    plan_attention,
)
from autolade.engine.decode import lookahead_decode


def test_cpu_plan_is_the_loaded_implementation_everywhere():
    for dtype in (torch.float32, torch.bfloat16):
        for loaded in ("sdpa", "eager"):
            plan = plan_attention(device_type="cpu", dtype=dtype, flash_installed=True, loaded=loaded)
            assert (plan.prefill, plan.single, plan.packed) == (loaded, loaded, loaded)
            assert not plan.switches
    assert load_implementation(device_type="cpu", dtype=torch.bfloat16, flash_installed=True) is None


def test_cuda_flash_model_runs_packed_steps_through_sdpa():
    plan = plan_attention(device_type="cuda", dtype=torch.bfloat16, flash_installed=True, loaded=FLASH)
    assert (plan.prefill, plan.single, plan.packed) == (FLASH, FLASH, "sdpa")
    assert plan.switches and plan.for_step("packed") == "sdpa"
    with pytest.raises(ValueError, match="prefill, single, packed"):
        plan.for_step("decode")


def test_cuda_sdpa_model_is_not_upgraded_but_told_how():
    plan = plan_attention(device_type="cuda", dtype=torch.float16, flash_installed=True, loaded="sdpa")
    assert not plan.switches and plan.packed == "sdpa"
    assert "attn_implementation='flash_attention_2'" in plan.reason


@pytest.mark.parametrize(
    ("device", "dtype", "installed", "cc", "expected", "why"),
    [
        ("cuda", torch.bfloat16, True, (9, 0), FLASH, "half precision"),
        ("cuda", torch.float16, True, None, FLASH, "half precision"),
        ("cuda", torch.float32, True, (9, 0), None, "float16 / bfloat16 only"),
        ("cuda", torch.bfloat16, False, (9, 0), None, 'pip install -e ".[gpu]"'),
        ("cuda", torch.bfloat16, True, (7, 5), None, "compute capability >= 8.0"),
        ("cpu", torch.bfloat16, True, None, None, "only on CUDA"),
    ],
)
def test_load_implementation_picks_flash_only_where_it_runs(device, dtype, installed, cc, expected, why):
    assert load_implementation(device_type=device, dtype=dtype, flash_installed=installed, compute_capability=cc) == expected
    ok, reason = flash_usable(device_type=device, dtype=dtype, flash_installed=installed, compute_capability=cc)
    assert ok == (expected is not None) and why in reason


def test_flash_detection_looks_up_without_importing():
    asked = []
    assert flash_attn_installed(lambda name: asked.append(name) or object()) is True
    assert flash_attn_installed(lambda name: None) is False
    assert asked == ["flash_attn"]

    def broken(name):
        raise ValueError("flash_attn.__spec__ is None")

    assert flash_attn_installed(broken) is False


def test_switch_changes_only_when_the_kind_needs_another_implementation():
    model = tiny_llama(attn_implementation="eager")
    plan = AttentionPlan(prefill="eager", single="eager", packed="sdpa")
    switch = AttentionSwitch.for_model(model, plan=plan)
    assert switch.current == "eager"
    for kind in ("prefill", "single", "single", "packed", "packed", "single", "packed"):
        switch.use(kind)
        assert model.config._attn_implementation == plan.for_step(kind)
        assert model.model.layers[0].self_attn.config._attn_implementation == plan.for_step(kind)
    assert switch.switched == 3  # eager->sdpa, sdpa->eager, eager->sdpa: only where the kind changes


def _record_implementations(model):
    seen = []

    def hook(_module, _args, kwargs):
        seen.append((int(kwargs["input_ids"].shape[-1]), kwargs.get("attention_mask") is None,
                     model.config._attn_implementation))

    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3"])
def test_decode_runs_each_kind_on_its_plan_and_restores_the_model(make):
    """A CPU stand-in for flash: eager for the causal forwards, sdpa for the packed ones."""
    model = make() if make is tiny_gemma3 else make(attn_implementation="eager")
    model.set_attn_implementation("eager")
    ids = repetitive_prompt(seed=1)
    ref = hf_greedy(model, ids, 40)
    plan = AttentionPlan(prefill="eager", single="eager", packed="sdpa")
    seen, handle = _record_implementations(model)
    try:
        cfg = LookaheadConfig(window=3, ngram=3, guesses=3, prompt_lookup=8)
        out, log = lookahead_decode(model, ids, config=cfg, max_new_tokens=40, attention=plan)
    finally:
        handle.remove()
    assert out == ref  # fp32: eager and sdpa agree far inside the noise on a tiny model
    assert seen[0] == (ids.shape[1], True, "eager")  # the prefill: causal, no mask
    for length, no_mask, implementation in seen[1:]:
        assert implementation == ("eager" if length == 1 else "sdpa")
        assert no_mask == (length == 1)
    assert any(length > 1 for length, _, _ in seen[1:])
    assert model.config._attn_implementation == "eager"  # restored for the caller's generate()


def test_default_cpu_decode_never_switches():
    model = tiny_llama()
    assert not model_plan(model).switches
    seen, handle = _record_implementations(model)
    try:
        lookahead_decode(model, repetitive_prompt(seed=0), config=LookaheadConfig(window=3, ngram=3, guesses=3),
                         max_new_tokens=24)
    finally:
        handle.remove()
    assert {implementation for _, _, implementation in seen} == {"sdpa"}
