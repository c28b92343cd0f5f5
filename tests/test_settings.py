"""Settings resolution: stored profiles by workload under any of its names, the clear error when one
is missing, curve and built-in defaults, resolving once per model and store state, held-out sets."""

from __future__ import annotations

import pytest
import torch
from tiny import repetitive_prompt, tiny_llama

from autolade.bench import load_sets
from autolade.config import LookaheadConfig
from autolade.errors import ConfigError
from autolade.machine.hardware import probe_hardware
from autolade.machine.models import model_fingerprint
from autolade.records.profile import Profile
from autolade.runtime.defaults import CPU_DEFAULT, builtin_default
from autolade.runtime.settings import SettingsResolver, default_resolver, resolve_settings, stored_profile
from autolade.store.db import ProfileStore
from autolade.workloads import load_workload, split_workload, workload_tag

CHAT = LookaheadConfig(window=0, guesses=0, prompt_lookup=8, prompt_lookup_ngram=3)
CODE = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=3, prompt_lookup_scaled=True,
                       prompt_lookup_ngram=4)


@pytest.fixture
def llama(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    return tiny_llama()


def save_profile(model, workload: str, settings: LookaheadConfig, policy: dict | None, *, compiled: bool | None = None) -> int:
    """A profile in this AUTOLADE_HOME's store, keyed as tune keys the winner it saves."""
    hw = probe_hardware(device="cpu", measure=False)
    fp = model_fingerprint(model)
    tag = workload_tag(workload)
    prof = Profile(
        hardware_fingerprint=hw.fingerprint, hardware_class=hw.hardware_class,
        hardware_summary="test", model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=fp["dtype"],
        workload=tag, settings=settings, policy=policy, speedup=1.2, tokens_per_s=12.0,
        baseline_tokens_per_s=10.0, prompt_set=f"{tag}[held-out 3]", compiled=compiled,
    )
    with ProfileStore() as store:
        return store.save(prof)


def test_stored_profile_by_workload_and_missing_one_names_the_fix(llama):
    with pytest.raises(ConfigError, match="autolade tune --workload code"):
        stored_profile(llama, "code")
    pid = save_profile(llama, "code", CODE, {"name": "lookup"})
    prof, source = stored_profile(llama, "humaneval")  # the built-in workload's other name
    assert prof.settings == CODE and prof.policy == {"name": "lookup"} and source == f"store:exact:#{pid}"
    with pytest.raises(ConfigError, match="'chat' profile"):
        stored_profile(llama, "chat")
    # generate() with no settings: the named workload, else another workload's profile, and says which
    config, source, policy = resolve_settings(llama, workload="chat")
    assert config == CODE and "no 'chat' profile" in source


@pytest.mark.slow
def test_heldout_sets_are_the_tuners_holdout_split():
    held = load_sets(["code"], heldout=True)["code"]
    tune_split, hold_split = split_workload(load_workload("code"))
    assert [p.id for p in held] == [p.id for p in hold_split]
    assert not {p.id for p in held} & {p.id for p in tune_split}
    assert len(held) == round(0.3 * 164)
    assert [p.id for p in load_sets(["code"], heldout=True, limit=4)["code"]] == [p.id for p in hold_split[:4]]


def test_builtin_defaults_by_device():
    config, policy = builtin_default("cpu")
    assert config == CPU_DEFAULT and policy is None and not config.lookahead and config.prompt_lookup_scaled
    config, policy = builtin_default("cuda")
    assert (config.window, config.ngram, config.guesses) == (15, 5, 15) and policy["name"] == "adaptive"


def test_no_profile_falls_back_to_the_builtin_default_and_says_so(llama):
    config, source, policy = resolve_settings(llama, workload="code")
    assert config == CPU_DEFAULT and policy is None and source.startswith("default (built-in")


def _save_curve(model, points, *, compiled: bool = False, warmup_s: float | None = None):
    from autolade.records.curve import StepCurve

    hw = probe_hardware(device="cpu", measure=False)
    fp = model_fingerprint(model)
    with ProfileStore() as store:
        store.save_curve(StepCurve(points=points, compiled=compiled, warmup_s=warmup_s), hardware_fingerprint=hw.fingerprint, hardware_class=hw.hardware_class,
                         hardware_summary="test", model_fingerprint=fp, dtype=fp["dtype"])


def test_a_stored_cpu_curve_gives_cost_aware_scaled_lookup(llama):
    # the fp32 curve of DESIGN.md: a packed step costs ~2x a one-token step; no window pays
    _save_curve(llama, {300: {1: 58.0, 2: 117.0, 4: 115.0, 8: 102.0, 16: 124.0, 32: 152.0, 64: 228.0}})
    for workload in ("chat", "code"):
        config, source, policy = resolve_settings(llama, workload=workload)
        assert config == CPU_DEFAULT and policy == {"name": "cost-aware"} and "step-latency curve" in source


def test_a_stored_curve_where_two_tokens_cost_less_than_one_pads_lone_steps(llama):
    from autolade.runtime.settings import stored_pads_single

    assert not stored_pads_single(llama)  # no curve: no claim
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4}})
    assert not stored_pads_single(llama)
    _save_curve(llama, {128: {1: 224.4, 2: 196.3, 4: 213.6, 8: 233.5, 16: 306.9}})  # the 1.5B Qwen, bf16, this EPYC
    assert stored_pads_single(llama)


def test_compile_is_chosen_by_the_stored_curves(llama):
    from autolade.runtime.settings import stored_compile

    assert not stored_compile(llama)  # nothing measured: eager
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6}})
    _save_curve(llama, {256: {1: 24.0, 8: 31.0, 16: 34.0}}, compiled=True)
    assert not stored_compile(llama)  # compiled, but no cheaper: eager
    _save_curve(llama, {256: {1: 8.0, 8: 10.0, 16: 12.0}}, compiled=True)
    assert stored_compile(llama)


def test_a_run_compiles_only_where_its_tokens_win_back_the_warm_up(llama):
    from autolade.runtime.settings import compile_for_run

    assert compile_for_run(llama, new_tokens=10**6) == (False, "")  # nothing measured: eager, nothing to say
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6}})
    _save_curve(llama, {256: {1: 8.0, 8: 10.0, 16: 12.0}}, compiled=True)
    assert compile_for_run(llama, new_tokens=1) == (True, "")  # no warm-up recorded: the curves decide
    _save_curve(llama, {256: {1: 8.0, 8: 10.0, 16: 12.0}}, compiled=True, warmup_s=43.2)
    # k=16 saves the most (21.6 ms a step): 43.2 s back after 2,000 steps, so at least 2,000 tokens
    compiled, why = compile_for_run(llama, new_tokens=128)
    assert not compiled and "warm-up (43 s" in why and "about 2,000 new tokens, not 128" in why and "--compile" in why
    assert compile_for_run(llama, new_tokens=2000) == (True, "")
    _save_curve(llama, {256: {1: 24.0, 8: 31.0, 16: 34.0}}, compiled=True, warmup_s=1.0)
    assert compile_for_run(llama, new_tokens=10**6) == (False, "")  # no cheaper compiled: eager, as before


def test_a_compiled_decode_is_priced_on_the_compiled_steps(llama):
    from autolade.runtime.settings import stored_buckets, stored_cost, stored_token_cost

    _save_curve(llama, {256: {1: 20.0, 2: 22.0, 4: 24.0, 8: 30.0, 16: 36.0, 32: 50.0}})
    assert stored_buckets(llama) is None and stored_cost(llama, compiled=True)(8) == 30.0  # none measured: eager
    _save_curve(llama, {256: {1: 21.0, 8: 16.0, 16: 20.0, 32: 31.0}}, compiled=True)
    assert stored_buckets(llama) == (8, 16, 32)
    assert stored_cost(llama, compiled=True)(1) == 16.0 and stored_cost(llama, compiled=True)(12) == 20.0
    assert stored_cost(llama)(1) == 20.0  # the eager curve is still the eager decode's
    assert stored_token_cost(llama, compiled=True) == pytest.approx((31.0 - 16.0) / (31 * 16.0))
    assert stored_token_cost(llama) == pytest.approx((50.0 - 20.0) / (31 * 20.0))


def test_a_greedy_profile_of_eager_steps_gives_way_to_a_prediction_on_the_compiled_ones(llama):
    from test_tables import WINDOW, FakeTokenizer, synthetic_table

    from autolade.config import GREEDY
    from autolade.records.vocab import model_tokenizer_fingerprint

    tok = FakeTokenizer()
    fp = model_fingerprint(llama)
    with ProfileStore() as store:
        store.save_acceptance(synthetic_table(fp, model_tokenizer_fingerprint(llama, tok)))
    _save_curve(llama, {300: {1: 10.0, 8: 30.0, 32: 90.0, 128: 400.0}})  # eager: packed tokens cost, greedy won
    _save_curve(llama, {300: {1: 5.0, 8: 5.0, 32: 5.1, 128: 5.3}}, compiled=True)  # compiled: they are free
    pid = save_profile(llama, "chat", GREEDY, None)  # tuned before compiled steps: not recorded, so eager
    config, source, _ = resolve_settings(llama, workload="chat", tokenizer=tok)  # eager steps: the profile holds
    assert config == GREEDY and source == f"store:exact:#{pid} (chat)"
    for compiled in (True, None):  # compiled, asked or as the stored curves say
        config, source, policy = resolve_settings(llama, workload="chat", tokenizer=tok, compiled=compiled)
        assert config == WINDOW.config and "compiled step-latency curve" in source
        assert f"store:exact:#{pid} (chat) passed over: greedy best on eager steps" in source
    with ProfileStore() as store:
        store.remove(pid)
    pid = save_profile(llama, "chat", GREEDY, None, compiled=True)  # tuned on compiled steps: it holds there
    assert resolve_settings(llama, workload="chat", tokenizer=tok, compiled=True)[1] == f"store:exact:#{pid} (chat)"
    pid = save_profile(llama, "chat", CHAT, None)  # a profile that drafts keeps its measured setting on either
    assert resolve_settings(llama, workload="chat", tokenizer=tok, compiled=True)[:2] == (CHAT, f"store:exact:#{pid} (chat)")
    config, source, _ = resolve_settings(llama, workload="code", compiled=True)  # no table for code: the profile after all
    assert config == CHAT and "passed over" not in source


def test_a_greedy_profile_of_eager_steps_stays_where_no_prediction_can_replace_it(llama):
    from autolade.config import GREEDY

    _save_curve(llama, {300: {1: 5.0, 8: 5.0, 32: 5.1}}, compiled=True)
    _save_curve(llama, {300: {1: 10.0, 8: 30.0, 32: 90.0}})
    pid = save_profile(llama, "chat", GREEDY, None, compiled=False)
    config, source, _ = resolve_settings(llama, workload="chat", compiled=True)  # no tokenizer: no table, no prediction
    assert config == GREEDY and source == f"store:exact:#{pid} (chat; measured on eager steps)"


def test_a_smooth_cpu_curve_without_a_table_gives_the_builtin_default(llama):
    # the bf16 curve measured here: 2-6 packed tokens cost ~1.1x one, wider steps much more
    _save_curve(llama, {256: {1: 23.3, 2: 25.5, 4: 25.7, 8: 30.4, 16: 33.6, 32: 42.5, 64: 62.7, 128: 101.3}})
    config, source, policy = resolve_settings(llama, workload="chat")
    assert config == CPU_DEFAULT and policy is None and "built-in" in source and "acceptance table" in source


def test_a_flat_curve_and_a_table_whose_window_accepts_give_the_predicted_window(llama):
    from test_tables import WINDOW, FakeTokenizer, synthetic_table

    from autolade.records.vocab import model_tokenizer_fingerprint

    _save_curve(llama, {300: {1: 10.0, 8: 10.0, 32: 10.2, 128: 10.5}})  # a GPU: packed tokens are free
    tok = FakeTokenizer()
    fp = model_fingerprint(llama)
    with ProfileStore() as store:
        store.save_acceptance(synthetic_table(fp, model_tokenizer_fingerprint(llama, tok)))
    config, source, policy = resolve_settings(llama, workload="chat", tokenizer=tok)
    assert config == WINDOW.config and policy is None and source.startswith("predicted (") and "store (chat" in source
    # no tokenizer: no table can be matched, and the source says so
    config, source, _ = resolve_settings(llama, workload="chat")
    assert config != WINDOW.config and "no tokenizer" in source


def test_generate_with_the_cost_aware_policy_uses_the_stored_curve(llama):
    from tiny import hf_greedy

    from autolade import generate

    ids = repetitive_prompt(seed=1)
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=16, prompt_lookup_drafts=3, prompt_lookup_ngram=4)
    with pytest.raises(ConfigError, match="autolade profile"):
        generate(llama, ids, max_new_tokens=8, config=cfg, policy="cost-aware")
    # a curve where any packed step costs 50x a plain one: it never drafts (the steps it measures
    # are all plain ones, so nothing corrects the packed sizes' cost), whatever the drafts would get
    _save_curve(llama, {256: {1: 10.0, 2: 500.0, 16: 520.0, 32: 550.0}})
    res = generate(llama, ids, max_new_tokens=48, config=cfg, policy="cost-aware")
    assert res.sequences[0, ids.shape[1]:].tolist() == hf_greedy(llama, ids, 48)
    assert res.stats.policy == "cost-aware" and res.stats.tokens_per_step == 1.0
    # a nearly flat curve (the latest one is read): the output is the same (whether it drafts here
    # depends on what this machine's steps measure; test_decode drives it with a fixed clock)
    _save_curve(llama, {256: {1: 10.0, 4: 10.5, 16: 12.0, 32: 15.0}})
    res = generate(llama, ids, max_new_tokens=48, config=cfg, policy="cost-aware")
    assert res.sequences[0, ids.shape[1]:].tolist() == hf_greedy(llama, ids, 48)


def test_generate_finds_a_workload_by_any_of_its_names(llama):
    # humaneval is the code workload: its profile, not the chat one tried before it in the fallback order
    save_profile(llama, "chat", CHAT, None)
    save_profile(llama, "code", CODE, None)
    from autolade import generate

    for name in ("humaneval", "human-eval", "Code"):
        res = generate(llama, repetitive_prompt(), max_new_tokens=4, workload=name)
        assert res.stats.settings == CODE.to_dict() and res.stats.settings_source.endswith("(code)")
    res = generate(llama, repetitive_prompt(), max_new_tokens=4, workload="mt_bench")
    assert res.stats.settings == CHAT.to_dict() and res.stats.settings_source.endswith("(chat)")


def test_a_profile_tuned_on_mtbench_is_the_chat_profile(llama):
    save_profile(llama, "code", CODE, None)
    save_profile(llama, "mtbench", CHAT, None)  # `autolade tune --workload mtbench` saves under workload_tag
    from autolade import generate

    res = generate(llama, repetitive_prompt(), max_new_tokens=4, workload="chat")
    assert res.stats.settings == CHAT.to_dict() and res.stats.settings_source.endswith("(chat)")
    prof, _ = stored_profile(llama, "mt-bench")
    assert prof.workload == "chat" and prof.settings == CHAT


def test_generate_resolves_once_and_sees_a_profile_saved_since(llama, tmp_path):
    from autolade import generate

    ids = repetitive_prompt()
    before = default_resolver().cache_info()
    # memory off: a remembered answer would also read the step curve (one more cache hit) to price its drafts;
    # each call reads it once (a hit) to decide whether lone steps are padded (pad_single), once whether to compile
    first = generate(llama, ids, max_new_tokens=4, workload="code", memory=False)
    second = generate(llama, ids, max_new_tokens=4, workload="code", memory=False)
    after = default_resolver().cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 5)
    assert first.stats.settings_source == second.stats.settings_source and "built-in" in first.stats.settings_source
    assert not (tmp_path / "home" / "autolade.db").exists()  # reading settings creates no store
    pid = save_profile(llama, "code", CODE, None)
    third = generate(llama, ids, max_new_tokens=4, workload="code", memory=False)
    assert third.stats.settings_source == f"store:exact:#{pid} (code)" and third.stats.settings == CODE.to_dict()
    assert default_resolver().cache_info().misses == after.misses + 1


def test_the_resolver_probes_hardware_once_per_device(llama):
    probed = []

    def probe(device):
        probed.append(device)
        return probe_hardware(device=device, measure=False)

    resolver = SettingsResolver(probe=probe)
    for workload in ("chat", "code", "data/my-set.jsonl", "my-set", "chat"):
        assert resolver.resolve(llama, workload=workload)[1].startswith("default (built-in")
    info = resolver.cache_info()
    assert probed == ["cpu"] and info.probes == 1
    # chat reads general, chat and code at once; my-set is read once, under either of its names
    assert (info.misses, info.hits) == (2, 3)
    pid = save_profile(llama, "general", CHAT, None)
    assert resolver.resolve(llama)[1] == f"store:exact:#{pid} (general)" and probed == ["cpu"]


def test_the_fingerprint_follows_the_model_dtype(llama):
    resolver = SettingsResolver()
    assert resolver.fingerprint(llama) == model_fingerprint(llama)
    half = tiny_llama(dtype=torch.bfloat16)
    assert resolver.fingerprint(half)["dtype"] == "bfloat16" and resolver.fingerprint(llama)["dtype"] == "float32"


def test_memory_drafts_are_priced_by_the_stored_curve(llama):
    from autolade import generate

    ids = repetitive_prompt(seed=2)
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=4, prompt_lookup_drafts=1)
    first = generate(llama, ids, max_new_tokens=24, config=cfg, workload="code", memory=True)
    assert "drafts" not in first.stats.memory  # an empty memory drafts nothing: nothing to price
    unpriced = generate(llama, ids, max_new_tokens=24, config=cfg, workload="code", memory=True)
    assert "cut below a 5% chance (no step curve stored)" in unpriced.stats.memory
    _save_curve(llama, {300: {1: 10.0, 32: 10.0 + 31 * 0.3}})  # each packed token costs 3% of a step
    priced = generate(llama, ids, max_new_tokens=24, config=cfg, workload="code", memory=True)
    assert "priced by the step curve (a packed token costs 0.030 of a step)" in priced.stats.memory
    assert priced.sequences.tolist() == unpriced.sequences.tolist() == first.sequences.tolist()


@pytest.mark.parametrize("damage", ["random", "truncated"])
def test_a_corrupt_store_is_left_alone_and_decoding_goes_on(llama, damage):
    """4 KiB of random bytes, or a real store cut after its header: settings resolution and generate()
    go on without it (explicit settings, else the built-in default), say so once, and leave the file as it was."""
    import os
    import warnings

    from autolade import generate
    from autolade.errors import StoreWarning
    from autolade.paths import user_dir

    db = user_dir() / "autolade.db"
    if damage == "truncated":
        save_profile(llama, "chat", CHAT, None)
        db.write_bytes(db.read_bytes()[:1500])
    else:
        db.write_bytes(b"\x00" + os.urandom(4095))  # never the SQLite header
    before = sorted((p.name, p.read_bytes()) for p in db.parent.iterdir() if p.is_file())
    ids = repetitive_prompt()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, source, policy = resolve_settings(llama, workload="chat")
        explicit = generate(llama, ids, max_new_tokens=6, window=2, ngram=3, guesses=2, memory=False)
        default = generate(llama, ids, max_new_tokens=6, workload="chat", memory=False)
    assert (config, policy) == builtin_default("cpu")
    assert "profile store" in source and "could not be read" in source and "untouched" in source
    assert explicit.stats.settings_source == "explicit" and explicit.sequences.shape[1] == ids.shape[1] + 6
    assert default.stats.settings_source == source and default.sequences.shape[1] == ids.shape[1] + 6
    said = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert len(said) == 1 and str(db) in said[0] and "untouched" in said[0], said
    assert sorted((p.name, p.read_bytes()) for p in db.parent.iterdir() if p.is_file()) == before
