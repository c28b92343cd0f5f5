"""Acceptance tables: validation, JSON, the store, rows counted by replay (measuring: test_acceptance_measure.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from autolade.cli.main import cli
from autolade.config import LookaheadConfig
from autolade.errors import ProfileError, StoreError
from autolade.records.acceptance import (
    FORMAT,
    AcceptanceRow,
    AcceptanceTable,
    import_acceptance,
    read_acceptance_file,
    write_acceptance_file,
)
from autolade.records.grid import GREEDY_SETTING, Setting, lookup_grid
from autolade.records.vocab import legacy_tokenizer_fingerprint, tokenizer_fingerprint
from autolade.store.db import ProfileStore

LOOKUP4 = Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=4, prompt_lookup_drafts=1))
WINDOW = Setting.of(LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=0))


def row(setting: Setting = LOOKUP4, *, hist=None, tokens=150, **changes) -> AcceptanceRow:
    hist = {1: 20, 5: 80} if hist is None else hist
    steps = sum(hist.values())
    args = {"setting": setting, "tokens_per_step_mean": tokens / steps, "tokens_per_step_sd": 0.2,
                "packed_per_step_mean": sum(k * n for k, n in hist.items()) / steps, "packed_per_step_sd": 0.5,
                "packed_hist": hist, "steps": steps, "tokens": tokens, "context_min": 40, "context_median": 90, "context_max": 160}
    args.update(changes)
    return AcceptanceRow(**args)


def table(*rows: AcceptanceRow, **changes) -> AcceptanceTable:
    args = {"model_name": "smollm2-135m", "model_config_hash": "abc123", "tokenizer_fingerprint": "v49152:feed",
                "workload": "chat", "dtype": "float32", "max_new_tokens": 128, "prompts": 10,
                "rows": rows or (row(GREEDY_SETTING, hist={1: 100}, tokens=100), row()),
                "prompt_set": "chat[:10]", "measured_on": "box"}
    args.update(changes)
    return AcceptanceTable(**args)


# --- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokens": 90}, "impossible"),  # fewer tokens than steps
        ({"tokens": 421}, "impossible"),  # more than the 20 x 1 + 80 x 5 = 420 tokens packed
        ({"steps": 99}, "counts 100 steps"),
        ({"steps": -1}, "positive integer"),
        ({"tokens_per_step_mean": math.nan}, "tokens_per_step_mean"),
        ({"tokens_per_step_mean": 0.5}, "tokens_per_step_mean"),
        ({"tokens_per_step_mean": 6.0}, "tokens_per_step_mean"),  # above the largest packed size
        ({"packed_per_step_sd": -0.1}, "packed_per_step_sd"),
        ({"packed_hist": {0: 100}}, "packed size"),
        ({"packed_hist": {1: 20, 5: 80.0}}, "step count"),
        ({"packed_hist": {}}, "non-empty"),
        ({"context_min": 200}, "min <= median <= max"),
        ({"tokens": 150.0}, "positive integer"),
    ],
)
def test_absurd_rows_are_refused(changes, message):
    with pytest.raises(ProfileError, match=message):
        row(**changes)


def test_greedy_row_must_pack_one_token():
    with pytest.raises(ProfileError, match="greedy setting packs 1"):
        row(GREEDY_SETTING, hist={1: 50, 3: 50}, tokens=100)


def test_table_refuses_duplicates_bad_tags_and_too_many_tokens():
    with pytest.raises(ProfileError, match="unique"):
        table(row(), row())
    with pytest.raises(ProfileError, match="workload"):
        table(workload="chat and code")
    with pytest.raises(ProfileError, match="dtype"):
        table(dtype="int8")
    with pytest.raises(ProfileError, match="exceeds"):
        table(prompts=1)  # 150 tokens cannot come from 1 prompt x 127 decoded tokens


def test_check_for_names_model_tokenizer_and_dtype():
    t = table()
    t.check_for(model_fingerprint={"name": "smollm2-135m", "config_hash": "abc123"}, tokenizer_fingerprint="v49152:feed")
    with pytest.raises(ProfileError, match="model smollm2-135m:abc123, not other:abc123"):
        t.check_for(model_fingerprint="other:abc123", tokenizer_fingerprint="v49152:feed")
    with pytest.raises(ProfileError, match="tokenizer"):
        t.check_for(model_fingerprint="smollm2-135m:abc123", tokenizer_fingerprint="v32000:beef")
    # any of the tokenizer's fingerprints (current, legacy) will do
    t.check_for(model_fingerprint="smollm2-135m:abc123", tokenizer_fingerprint=("v49152:new0", "v49152:feed"))
    with pytest.raises(ProfileError, match="tokenizer v49152:feed, not v49152:new0"):
        t.check_for(model_fingerprint="smollm2-135m:abc123", tokenizer_fingerprint=("v49152:new0", "v49152:old0"))
    with pytest.raises(ProfileError, match="bfloat16"):
        t.check_for(model_fingerprint="smollm2-135m:abc123", tokenizer_fingerprint="v49152:feed", dtype="bfloat16")


# --- JSON ------------------------------------------------------------------------------------


def test_json_round_trip(tmp_path):
    t = table()
    back = AcceptanceTable.from_json(t.to_json())
    assert back == t
    data = json.loads(t.to_json())
    assert data["format"] == FORMAT and data["rows"][1]["packed_hist"] == {"1": 20, "5": 80}
    path = write_acceptance_file(t, tmp_path / "shared" / "t.json")
    assert read_acceptance_file(path) == t
    assert not list(path.parent.glob(".*.tmp"))  # the temporary file was renamed into place


def test_a_priced_row_round_trips_and_a_bad_price_in_a_file_is_refused():
    recycle = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    t = table(rows=(row(GREEDY_SETTING, hist={1: 100}, tokens=100), row(Setting.of(recycle)),
                    row(Setting.of(recycle, token_cost=0.05))))
    back = AcceptanceTable.from_json(t.to_json())
    assert back == t and back.rows[2].setting.token_cost == 0.05
    data = json.loads(t.to_json())
    data["rows"][2]["token_cost"] = "cheap"
    with pytest.raises(ProfileError, match="token_cost' must be number"):
        AcceptanceTable.from_json(json.dumps(data))
    data["rows"][2]["token_cost"] = 2
    with pytest.raises(ProfileError, match="token_cost must be a number in"):
        AcceptanceTable.from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="autolade-profile"), "format"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.pop("tokenizer"), "missing field 'tokenizer'"),
        (lambda d: d["rows"][1].update(steps="100"), "rows\\[1\\].steps' must be int"),
        (lambda d: d["rows"][1]["packed_hist"].update(x=3), "integer packed sizes"),
        (lambda d: d["rows"][1].update(policy="adaptive"), "cannot be tabulated"),
        (lambda d: d["rows"][1]["settings"].update(window=-1), "settings"),
        (lambda d: d["rows"][1]["tokens_per_step"].update(mean=None), "missing field"),
        (lambda d: d.update(rows=[]), "at least one"),
    ],
)
def test_bad_json_is_a_clear_error(mutate, message):
    data = json.loads(table().to_json())
    mutate(data)
    with pytest.raises(ProfileError, match=message):
        AcceptanceTable.from_json(json.dumps(data), source="shared.json")


def test_truncated_json_says_so():
    text = table().to_json()
    with pytest.raises(ProfileError, match="shared.json: not valid JSON.*truncated"):
        AcceptanceTable.from_json(text[: len(text) // 2], source="shared.json")


# --- store -----------------------------------------------------------------------------------


def test_store_saves_finds_and_replaces_a_growing_run(tmp_path):
    t = table(rows=(row(GREEDY_SETTING, hist={1: 100}, tokens=100),))
    key = {"model_fingerprint": "smollm2-135m:abc123", "tokenizer_fingerprint": "v49152:feed", "workload": "chat", "dtype": "float32"}
    with ProfileStore(tmp_path / "a.db") as store:
        assert store.find_acceptance(**key) is None
        first = store.save_acceptance(t)
        grown = t.with_row(row())
        assert store.save_acceptance(grown) == first  # same run, saved again with one more row
        assert store.db["acceptance"].count == 1
        assert store.find_acceptance(**key) == grown
        later = store.save_acceptance(table(created="2099-01-01T00:00:00+00:00"))
        assert later != first and store.find_acceptance(**key).created.startswith("2099")
        assert store.find_acceptance(**{**key, "tokenizer_fingerprint": "v1:x"}) is None
        assert store.find_acceptance(**{**key, "dtype": "bfloat16"}) is None


def test_import_refuses_other_model_tokenizer_and_bad_files_leaving_the_store_untouched(tmp_path):
    good = write_acceptance_file(table(), tmp_path / "good.json")
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:200])
    absurd = tmp_path / "absurd.json"
    data = json.loads(good.read_text())
    data["rows"][1]["tokens"] = 10_000
    absurd.write_text(json.dumps(data))
    ours = {"model_fingerprint": "smollm2-135m:abc123", "tokenizer_fingerprint": "v49152:feed"}
    with ProfileStore(tmp_path / "a.db") as store:
        with pytest.raises(ProfileError, match="model"):
            import_acceptance(good, store, model_fingerprint="gemma3-270m:fff", tokenizer_fingerprint="v49152:feed")
        with pytest.raises(ProfileError, match="tokenizer"):
            import_acceptance(good, store, model_fingerprint=ours["model_fingerprint"], tokenizer_fingerprint="v2:x")
        with pytest.raises(ProfileError, match="truncated.json: not valid JSON"):
            import_acceptance(truncated, store, **ours)
        with pytest.raises(ProfileError, match="absurd.json.*impossible"):
            import_acceptance(absurd, store, **ours)
        assert store.db["acceptance"].count == 0
        assert import_acceptance(good, store, **ours) >= 1
        assert store.db["acceptance"].count == 1


def test_store_refuses_a_corrupted_stored_table(tmp_path):
    with ProfileStore(tmp_path / "a.db") as store:
        id_ = store.save_acceptance(table())
        store.db.execute("update acceptance set acceptance_table = '{\"format\": 1' where id = ?", [id_])
        with pytest.raises(StoreError, match=f"stored acceptance table #{id_}"):
            store.find_acceptance(model_fingerprint="smollm2-135m:abc123", tokenizer_fingerprint="v49152:feed",
                                  workload="chat", dtype="float32")


def test_cli_accept_refuses_zero_prompts():
    res = CliRunner().invoke(cli, ["accept", "--prompts", "0"])
    assert res.exit_code != 0 and "--prompts must be at least 1" in res.output


# --- rows counted by replay ----------------------------------------------------------------


def test_replayed_rows_round_trip_and_only_lookup_rows_may_be_replayed(tmp_path):
    t = table(row(GREEDY_SETTING, hist={1: 100}, tokens=100), row(prompts=40, counted_by="replay", tokens=4000,
                                                                   hist={1: 1000, 5: 1000}), prompts=10)
    back = AcceptanceTable.from_json(t.to_json())
    assert back == t and back.row(LOOKUP4.label).prompts == 40
    assert "counted_by" not in json.dumps(t.to_dict()["rows"][0])  # old files' shape when nothing is new
    with pytest.raises(ProfileError, match="only prompt-lookup settings"):
        row(WINDOW, counted_by="replay")
    with pytest.raises(ProfileError, match="counted_by"):
        row(counted_by="guess")
    with pytest.raises(ProfileError, match="exceeds 10 prompts"):
        table(row(GREEDY_SETTING, hist={1: 100}, tokens=100), row(tokens=4000, hist={1: 1000, 5: 1000}))


def test_merge_keeps_every_setting_and_the_row_on_more_prompts():
    few = table(row(tokens=120), prompts=2, rows=(row(tokens=120),))
    many = table(row(GREEDY_SETTING, hist={1: 100}, tokens=100), row(tokens=150), prompts=10)
    merged = few.merged(many)
    assert {r.label for r in merged.rows} == {GREEDY_SETTING.label, LOOKUP4.label}
    assert merged.row(LOOKUP4.label).tokens == 150 and merged.prompts == 10
    with pytest.raises(ProfileError, match="same model"):
        few.merged(table(workload="code"))


def _tiny_model_and_prompts(tmp_path):
    """A tiny model saved as a directory, a prompts file of 12 repetitive prompts, and where a table goes."""
    from tests.tiny import tiny_llama_dir, word_tokenizer

    model_dir = tmp_path / "tiny"
    tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    motif = " ".join(f"w{i}" for i in range(10, 18))
    prompts = tmp_path / "mine.txt"
    prompts.write_text("\n\n".join(f"w{3 + k} {motif} w{40 + k} {motif}" for k in range(12)) + "\n")
    return model_dir, prompts, tmp_path / "table.json"


def test_cli_accept_run_again_on_a_replayed_table_measures_nothing_twice(tmp_path):
    """The same `accept --grid compact --replay-prompts M -o FILE` run again (a grid that grew, an
    interrupted run): every row is kept, no engine run and no greedy pass is made again, and the
    prompt set is not repeated."""
    model_dir, prompts, out = _tiny_model_and_prompts(tmp_path)
    args = ["accept", "--model", str(model_dir), "--workload", str(prompts), "--prompts", "1", "--grid", "compact",
            "--replay-prompts", "3", "-n", "12", "-o", str(out)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    table = read_acceptance_file(out)
    assert table.prompts == 3 and table.prompt_set == "mine tuning split[:1]; prompt lookup replayed on mine tuning split[:3]"
    engine = [r for r in table.rows if r.counted_by == "engine"]
    assert len(engine) == 26 and all(table.row_prompts(r) == 1 for r in engine)  # 31 compact, 5 replayed
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    assert again.output.count("measured before (resumed)") == 26 and "greedy output 1/3" in first.output
    assert "greedy output 1/" not in again.output and "replayed on 3 prompts before: kept" in again.output
    assert read_acceptance_file(out) == table


def test_cli_accept_lookup_grid_counts_by_replay_alone(tmp_path):
    """`--grid lookup --replay-prompts M`: no engine run, every row replayed on M prompts, saved and written."""
    model_dir, prompts, out = _tiny_model_and_prompts(tmp_path)
    res = CliRunner().invoke(cli, ["accept", "--model", str(model_dir), "--workload", str(prompts), "--prompts", "1",
                                   "--grid", "lookup", "--replay-prompts", "4", "-n", "16", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "measuring 0 settings" in res.output and "by replay on 4" in res.output
    table = read_acceptance_file(out)
    assert table.workload == "mine" and table.prompts == 4 and len(table.rows) == len(lookup_grid())
    assert all(r.counted_by == "replay" and r.prompts == 4 for r in table.rows)
    # a table keyed on the legacy tokenizer fingerprint (before 2026-12-04) resumes, re-keyed to the current one
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert table.tokenizer_fingerprint == tokenizer_fingerprint(tok) != legacy_tokenizer_fingerprint(tok)
    write_acceptance_file(replace(table, tokenizer_fingerprint=legacy_tokenizer_fingerprint(tok)), out)
    res = CliRunner().invoke(cli, ["accept", "--model", str(model_dir), "--workload", str(prompts), "--prompts", "1",
                                   "--grid", "lookup", "--replay-prompts", "4", "-n", "16", "-o", str(out)])
    assert res.exit_code == 0, res.output
    resumed = read_acceptance_file(out)
    assert resumed.tokenizer_fingerprint == tokenizer_fingerprint(tok) and resumed.created == table.created
