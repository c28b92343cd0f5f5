"""Acceptance-table lookup (store, shipped files, other dtype), prediction-based choices, predicted profiles."""

from __future__ import annotations

import json
from dataclasses import replace

from autolade.config import SCALED_LOOKUP, LookaheadConfig
from autolade.records.acceptance import AcceptanceRow, AcceptanceTable
from autolade.records.curve import StepCurve
from autolade.records.grid import GREEDY_SETTING, Setting
from autolade.runtime.predict import covered, is_predicted, policy_spec, predicted_settings
from autolade.store.db import ProfileStore
from autolade.store.tables import find_table
from autolade.tuning.table_guidance import predicted_start, prune_reason, tabulated_setting
from autolade.tuning.trials import Candidate
from autolade.tuning.verify import verify_prediction

WINDOW = Setting.of(LookaheadConfig(window=4, ngram=4, guesses=4, prompt_lookup=0))
LOOKUP = Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=2), policy="lookup")
FLAT = StepCurve(points={100: {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0, 16: 10.2, 32: 10.5, 64: 11.0}})
STEEP = StepCurve(points={100: {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0, 16: 40.0, 32: 72.0, 64: 136.0}})
FP = {"name": "m", "config_hash": "h", "dtype": "float32"}


class FakeTokenizer:
    """Just what ``vocab_fingerprint.tokenizer_fingerprint`` reads."""

    special_tokens_map = {"eos_token": "</s>"}
    all_special_ids = [2]

    def __len__(self) -> int:
        return 96

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


def _row(setting: Setting, hist: dict[int, int], tokens: int) -> AcceptanceRow:
    steps = sum(hist.values())
    return AcceptanceRow(
        setting=setting, tokens_per_step_mean=tokens / steps, tokens_per_step_sd=0.0,
        packed_per_step_mean=sum(k * n for k, n in hist.items()) / steps, packed_per_step_sd=0.0,
        packed_hist=hist, steps=steps, tokens=tokens, context_min=50, context_median=100, context_max=200,
    )  # fmt: skip


def synthetic_table(fp=FP, tokenizer="v96:x", *, dtype=None, workload="chat") -> AcceptanceTable:
    """greedy; the lookup policy packing 3 and accepting 1.8 a step; a window packing 25 and accepting 2.0."""
    return AcceptanceTable(
        model_name=fp["name"], model_config_hash=fp["config_hash"], tokenizer_fingerprint=tokenizer, workload=workload,
        dtype=dtype or fp["dtype"], max_new_tokens=128, prompts=10, prompt_set="chat[:10]",
        rows=(_row(GREEDY_SETTING, {1: 100}, 100), _row(LOOKUP, {1: 40, 3: 60}, 180), _row(WINDOW, {25: 100}, 200)),
    )  # fmt: skip


def test_prediction_picks_a_window_on_a_flat_curve_and_lookup_or_greedy_on_a_steep_one():
    best, ranked = predicted_settings(synthetic_table(), FLAT)
    assert best.setting == WINDOW and ranked[0].setting == WINDOW and policy_spec(best.setting) is None
    best, _ = predicted_settings(synthetic_table(), STEEP)
    assert best.setting == LOOKUP and policy_spec(best.setting) == {"name": "lookup"}
    every_token_costs = StepCurve(points={100: {k: 10.0 * k for k in (1, 2, 4, 8, 16, 32)}})
    assert predicted_settings(synthetic_table(), every_token_costs)[0].setting.greedy


def test_find_table_prefers_the_store_then_shipped_files_then_the_other_dtype(tmp_path):
    shipped = tmp_path / "profiles"
    shipped.mkdir()
    with ProfileStore(":memory:") as store:
        table, why = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                dtype="float32", table_dirs=[shipped])
        assert table is None and "autolade accept --workload chat" in why
        # a shipped table of the other dtype: used, and labelled as such
        (shipped / "acceptance-m-bfloat16-chat.json").write_text(synthetic_table(dtype="bfloat16").to_json())
        (shipped / "not-json.json").write_text("{")  # left to the profile reader, not ours to warn about
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert table.dtype == "bfloat16" and source.startswith("file:") and "measured in bfloat16" in source
        assert "barely depends on the dtype" in source
        # this dtype, shipped: preferred to the other dtype
        (shipped / "acceptance-m-float32-chat.json").write_text(synthetic_table().to_json())
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert table.dtype == "float32" and "measured in" not in source
        # the store's (e.g. started by a tune: one row, few prompts) is merged with the shipped one:
        # every shipped setting stays, and per setting the row counted on more prompts wins
        tuned = replace(synthetic_table(), prompts=3, rows=(_row(LOOKUP, {1: 10, 3: 20}, 60),))
        store.save_acceptance(tuned)
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert source.startswith("store + file:") and source.endswith("acceptance-m-float32-chat.json (chat, float32)")
        assert {r.label for r in table.rows} == {r.label for r in synthetic_table().rows}
        assert table.row(LOOKUP.label).tokens == 180 and table.row_prompts(table.row(LOOKUP.label)) == 10
        # with no shipped table of this dtype the store's stands alone
        (shipped / "acceptance-m-float32-chat.json").unlink()
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert source.startswith("store (chat, float32") and [r.label for r in table.rows] == [LOOKUP.label]


def test_find_table_matches_every_fingerprint_of_the_tokenizer_and_merges_across_them(tmp_path):
    # a store table keyed on the legacy fingerprint (before 2026-12-04) and a shipped one on the current one
    shipped = tmp_path / "profiles"
    shipped.mkdir()
    (shipped / "acceptance-m-float32-chat.json").write_text(synthetic_table(tokenizer="v96:current").to_json())
    fps = ("v96:current", "v96:legacy")
    with ProfileStore(":memory:") as store:
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint=fps, workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert table is not None and source.startswith("file:")
        tuned = replace(synthetic_table(tokenizer="v96:legacy"), prompts=3, rows=(_row(LOOKUP, {1: 10, 3: 20}, 60),))
        store.save_acceptance(tuned)
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint=fps, workload="chat",
                                   dtype="float32", table_dirs=[shipped])
        assert source.startswith("store + file:") and len(table.rows) == 3
        # the current fingerprint alone misses the legacy store table, but still finds the shipped one
        table, source = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:legacy", workload="chat",
                                   dtype="float32", table_dirs=[])
        assert source.startswith("store (chat") and [r.label for r in table.rows] == [LOOKUP.label]
        assert find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:other", workload="chat",
                          dtype="float32", table_dirs=[shipped])[0] is None


def test_find_table_never_returns_another_models_or_tokenizers_table(tmp_path):
    shipped = tmp_path / "profiles"
    shipped.mkdir()
    (shipped / "other-model.json").write_text(synthetic_table({**FP, "config_hash": "zzz"}).to_json())
    (shipped / "other-tok.json").write_text(synthetic_table(tokenizer="v96:y").to_json())
    with ProfileStore(":memory:") as store:
        store.save_acceptance(synthetic_table({**FP, "name": "other"}))
        table, _ = find_table(store, model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                              dtype="float32", table_dirs=[shipped])
    assert table is None


def test_shipped_acceptance_files_do_not_disturb_profile_lookup(tmp_path, recwarn):
    shipped = tmp_path / "profiles"
    shipped.mkdir()
    (shipped / "acceptance-m-float32-chat.json").write_text(synthetic_table().to_json())
    with ProfileStore(":memory:") as store:
        found = store.find_profile(hardware_fingerprint="cpu:x", hardware_class="cpu:x", model_fingerprint=FP,
                                   dtype="float32", workload="chat", profile_dirs=[shipped], include_repo_profiles=False)
    assert found == (None, "default") and not [w for w in recwarn if "skipping" in str(w.message)]


def test_profiles_import_takes_acceptance_tables_and_refuses_corrupt_ones(tmp_path):
    from click.testing import CliRunner

    from autolade.cli.main import cli

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(synthetic_table().to_json())
    data = json.loads(synthetic_table().to_json())
    data["rows"][1]["tokens"] = 10_000  # more than the steps could commit
    bad.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, ["profiles", "import", str(bad)])
    assert result.exit_code != 0 and "rejected" in result.output and "tokens=10000" in result.output
    with ProfileStore() as store:
        assert list(store.db.query("select id from acceptance")) == []
    result = CliRunner().invoke(cli, ["profiles", "import", str(good)])
    assert result.exit_code == 0 and "imported as acceptance #1" in result.output
    again = CliRunner().invoke(cli, ["profiles", "import", str(good)])
    assert "already in the store" in again.output
    with ProfileStore() as store:
        assert store.find_acceptance(model_fingerprint=FP, tokenizer_fingerprint="v96:x", workload="chat",
                                     dtype="float32").rows[2].setting == WINDOW


def test_verify_stores_greedy_when_the_prediction_loses():
    best, _ = predicted_settings(synthetic_table(), FLAT)
    lose = lambda *a, **k: (0.9, 0.8)
    win = lambda *a, **k: (1.4, 1.1)
    assert verify_prediction(None, None, workload="chat", prediction=best, prompts=2, measure_fn=lose) == (False, 0.9, 0.8)
    assert verify_prediction(None, None, workload="chat", prediction=best, prompts=2, measure_fn=win)[0]


# --- the tuner's helpers -----------------------------------------------------------------


def test_tuner_enqueues_the_prediction_first():
    assert predicted_start(None, FLAT) is None and predicted_start(synthetic_table(), None) is None
    assert predicted_start(synthetic_table(), FLAT) == {"window": 4, "prompt_lookup": 0, "recycle": 0, "ngram": 4, "guesses": 4,
                                                         "policy": "static"}
    start = predicted_start(synthetic_table(), STEEP)
    assert start["policy"] == "lookup" and start["lookup_sizing"] == "length" and start["prompt_lookup"] == 10


def test_tuner_prunes_tabulated_settings_the_curve_makes_hopeless():
    window = Candidate(WINDOW.config, None)
    reason = prune_reason(window, synthetic_table(), STEEP)
    assert reason is not None and "predicts 0." in reason and "< 0.8" in reason
    assert prune_reason(window, synthetic_table(), FLAT) is None  # predicted to win
    other = Candidate(LookaheadConfig(window=3, ngram=3, guesses=3, prompt_lookup=0), None)
    assert prune_reason(other, synthetic_table(), STEEP) is None  # not in the table: it may be timed
    tuned_lookup = Candidate(LOOKUP.config, {"name": "lookup", "max_draft": 16})
    assert covered(synthetic_table(), LOOKUP.config, {"name": "lookup"}) == LOOKUP
    assert covered(synthetic_table(), tuned_lookup.config, tuned_lookup.policy) is None


def test_only_tabulated_trials_are_written_back():
    assert tabulated_setting(Candidate(WINDOW.config, None)) == WINDOW
    assert tabulated_setting(Candidate(LOOKUP.config, {"name": "lookup"})) == LOOKUP
    assert tabulated_setting(Candidate(SCALED_LOOKUP, {"name": "cost-aware"})) is None
    assert tabulated_setting(Candidate(WINDOW.config, {"name": "adaptive", "max_window": 4})) is None
    assert tabulated_setting(Candidate(LOOKUP.config, {"name": "lookup", "max_draft": 16})) is None


def test_record_trial_adds_a_row_to_the_store_table():
    import torch
    from tiny import tiny_llama

    from autolade.api import generate
    from autolade.machine.models import model_fingerprint
    from autolade.records.vocab import model_tokenizer_fingerprint
    from autolade.runtime.policies import make_policy
    from autolade.tuning.table_guidance import record_trial

    model = tiny_llama()
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])

    def runs(cand):  # what the tuner's timed runs hand over: (prompt length, res.stats) per prompt
        res = generate(model, prompt, max_new_tokens=8, config=cand.config, policy=make_policy(cand.policy, cand.config))
        return [(prompt.shape[1], res.stats)]

    cost_aware = Candidate(SCALED_LOOKUP, {"name": "cost-aware"})
    window, lookup = Candidate(WINDOW.config, None), Candidate(LOOKUP.config, {"name": "lookup"})
    with ProfileStore() as store:
        assert record_trial(store, model, None, [], cost_aware, workload="chat", max_new_tokens=8) is None
        first = record_trial(store, model, None, runs(window), window, workload="chat", max_new_tokens=8)
        record_trial(store, model, None, runs(lookup), lookup, workload="chat", max_new_tokens=8)
        fp = model_fingerprint(model)
        table = store.find_acceptance(model_fingerprint=fp, tokenizer_fingerprint=model_tokenizer_fingerprint(model),
                                      workload="chat", dtype=fp["dtype"])
    assert first is not None and [r.setting for r in table.rows] == [WINDOW, LOOKUP] and table.rows[0].steps >= 1


def test_a_recycling_trial_is_recorded_at_the_price_its_drafts_were_cut_at():
    """The tuner's timed runs price recycled drafts by this machine's curve: the row says which price, so it
    is read beside the table's rows at other prices, never as the full-budget count."""
    import torch
    from tiny import tiny_llama

    from autolade.api import generate
    from autolade.machine.models import model_fingerprint
    from autolade.records.vocab import model_tokenizer_fingerprint
    from autolade.runtime.predict import predict_setting
    from autolade.tuning.table_guidance import record_trial

    model = tiny_llama()
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    config = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    cand = Candidate(config, None)

    def runs(price):
        return [(prompt.shape[1], generate(model, prompt, max_new_tokens=8, config=config, memory=False,
                                           price_drafts=price).stats)]

    with ProfileStore() as store:
        record_trial(store, model, None, runs(0.03), cand, workload="chat", max_new_tokens=8)
        assert record_trial(store, model, None, runs(0.03) + runs(0.05), cand, workload="chat", max_new_tokens=8) is None
        record_trial(store, model, None, runs(False), cand, workload="chat", max_new_tokens=8)
        fp = model_fingerprint(model)
        table = store.find_acceptance(model_fingerprint=fp, tokenizer_fingerprint=model_tokenizer_fingerprint(model),
                                      workload="chat", dtype=fp["dtype"])
    assert [r.setting for r in table.rows] == [Setting.of(config, token_cost=0.03), Setting.of(config)]
    assert covered(table, config, None) == Setting.of(config)
    assert predict_setting(table, Setting.of(config), STEEP).price == STEEP.token_cost()


def test_a_tuned_profile_beats_a_predicted_one_on_the_same_hardware_and_a_predicted_one_beats_the_class():
    from autolade.records.profile import Profile

    def prof(hw, notes, settings):
        return Profile(hardware_fingerprint=hw, hardware_class="cpu:c", model_name="m", model_config_hash="h",
                       dtype="float32", workload="chat", settings=settings, notes=notes)

    with ProfileStore(":memory:") as store:
        store.save(prof("cpu:other", "tuned by autolade tune", SCALED_LOOKUP))
        predicted = store.save(prof("cpu:here", "predicted by autolade profile from ...", WINDOW.config))
        key = dict(hardware_fingerprint="cpu:here", hardware_class="cpu:c", model_fingerprint=FP, dtype="float32",
                   workload="chat", include_repo_profiles=False)
        found, source = store.find_profile(**key)
        assert found.id == predicted and is_predicted(found) and source == f"store:exact:#{predicted}"
        tuned = store.save(prof("cpu:here", "tuned by autolade tune", LOOKUP.config))
        store.save(prof("cpu:here", "predicted by autolade profile, later", WINDOW.config))
        found, _ = store.find_profile(**key)
        assert found.id == tuned and not is_predicted(found)


def test_a_shipped_tuned_profile_of_this_hardware_beats_a_stored_prediction(tmp_path):
    from autolade.records.profile import Profile
    from autolade.store.db import profile_to_json

    def prof(notes, settings):
        return Profile(hardware_fingerprint="cpu:here", hardware_class="cpu:c", model_name="m", model_config_hash="h",
                       dtype="float32", workload="chat", settings=settings, notes=notes)

    shared = tmp_path / "shared"
    shared.mkdir()
    key = dict(hardware_fingerprint="cpu:here", hardware_class="cpu:c", model_fingerprint=FP, dtype="float32",
               workload="chat", include_repo_profiles=False, profile_dirs=[shared])
    with ProfileStore(":memory:") as store:
        predicted = store.save(prof("predicted by autolade profile from ...", WINDOW.config))
        found, source = store.find_profile(**key)
        assert found.id == predicted and source == f"store:exact:#{predicted}"  # no shared file yet
        (shared / "tuned.json").write_text(profile_to_json(prof("tuned by autolade tune", LOOKUP.config)))
        found, source = store.find_profile(**key)
        assert not is_predicted(found) and found.settings == LOOKUP.config and source.startswith("file:")
        (shared / "tuned.json").write_text(profile_to_json(prof("predicted elsewhere", SCALED_LOOKUP)))
        found, source = store.find_profile(**key)  # predicted vs predicted: the store's
        assert found.id == predicted
