"""`autolade profile` and `autolade profiles ...` through click's CliRunner, in a temporary AUTOLADE_HOME."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from tiny import tiny_llama_dir
from transformers import PreTrainedTokenizerFast

from autolade.cli.main import cli
from autolade.config import LookaheadConfig
from autolade.store.db import Profile, ProfileStore, profile_to_json


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def sample(**changes) -> Profile:
    base = dict(
        hardware_fingerprint="cpu:AMD-EPYC:t2:avx512_bf16",
        hardware_class="cpu:AuthenticAMD:f26:avx512_bf16",
        model_name="smollm2-135m",
        model_config_hash="0123456789ab",
        dtype="bfloat16",
        workload="code",
        settings=LookaheadConfig(window=2, ngram=3, guesses=2),
        speedup=1.37,
        tokens_per_s=33.5,
        created="2026-01-02T03:04:05+00:00",
    )
    base.update(changes)
    return Profile(**base)


def test_list_show_export_rm(home, tmp_path):
    assert "no profiles in" in run("profiles", "list").output
    with ProfileStore() as store:
        first = store.save(sample())
        store.save(sample(workload="chat", speedup=1.05))
    out = run("profiles", "list").output
    assert "smollm2-135m" in out and "1.37x" in out and "2/3/2/10" in out and "chat" in out
    assert "chat" not in run("profiles", "list", "--workload", "code").output

    shown = run("profiles", "show", str(first))
    assert shown.exit_code == 0 and f"profile #{first}" in shown.output and "W=2 N=3 G=2" in shown.output
    as_json = json.loads(run("profiles", "show", str(first), "--json").output)
    assert as_json["format"] == "autolade-profile"

    target = tmp_path / "profiles" / "cpu-smollm2-code.json"
    result = run("profiles", "export", str(first), "-o", str(target))
    assert result.exit_code == 0 and target.exists()
    assert json.loads(target.read_text())["measured"]["speedup"] == 1.37

    assert run("profiles", "rm", str(first)).output.strip() == f"removed #{first}"
    missing = run("profiles", "rm", str(first))
    assert missing.exit_code == 1 and f"no profile #{first}" in missing.output and "Traceback" not in missing.output
    assert run("profiles", "show", "999").exit_code == 1


def test_import_validates_and_reports_each_file(home, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(profile_to_json(sample()))
    bad = json.loads(profile_to_json(sample()))
    bad["settings"]["window"] = 10**6
    bad_path = tmp_path / "bad.json"
    bad_path.write_text(json.dumps(bad))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")

    result = run("profiles", "import", str(good), str(bad_path), str(broken))
    assert result.exit_code == 1
    assert "good.json: imported as #1" in result.output
    assert "bad.json" in result.output and "window=1000000" in result.output
    assert "broken.json" in result.output and "not valid JSON" in result.output
    assert "2 of 3 file(s) rejected" in result.output

    again = run("profiles", "import", str(good))
    assert again.exit_code == 0 and "already in the store as #1" in again.output
    with ProfileStore() as store:
        assert len(store.list()) == 1


def test_corrupt_store_is_a_clean_error(home):
    home.mkdir(parents=True)
    db = home / "autolade.db"
    db.write_bytes(b"garbage" * 100)
    result = run("profiles", "list")
    assert result.exit_code == 1 and "is not an SQLite database" in result.output and "Traceback" not in result.output
    assert db.read_bytes() == b"garbage" * 100


def tiny_model_dir(path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 32)}}
    raw = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    tiny_llama_dir(path, tokenizer, vocab=32, bos_token_id=1, eos_token_id=2)
    return path




def test_profile_command_on_a_tiny_model(home, tmp_path, one_thread):
    model_dir = tiny_model_dir(tmp_path / "tiny-llama")
    plot = tmp_path / "curve.png"
    result = run("profile", "--model", str(model_dir), "--quick", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "fingerprint cpu:" in out and "spare compute: k=" in out
    # no acceptance table for this model: said so per workload, nothing predicted
    assert "chat: no acceptance table for tiny-llama" in out and "code: no acceptance table" in out
    assert "built-in default" in out
    assert "step latency" in out and "saved step curve #1" in out
    assert "compiled steps: not measured this run; `autolade profile --compile`" in out  # how to get them
    assert plot.read_bytes()[:4] == b"\x89PNG"
    if not torch.cuda.is_available():
        assert "NVML not available" in out
    with ProfileStore() as store:
        rows = list(store.db.query("select model_name, dtype from curves"))
    assert rows == [{"model_name": "tiny-llama", "dtype": "float32"}]
    assert "dtype: no bfloat16 step curve of this model on this machine yet" in out
    bf16 = run("profile", "--model", str(model_dir), "--quick", "--dtype", "bfloat16")
    assert bf16.exit_code == 0, bf16.output
    assert " recommended: step curves predict " in bf16.output and "ms/token" in bf16.output


def test_profile_stores_a_predicted_profile_that_generate_reports(home, tmp_path, one_thread):
    from test_tables import synthetic_table

    from autolade import api
    from autolade.machine.models import model_fingerprint
    from autolade.records.vocab import model_tokenizer_fingerprint

    model_dir = tiny_model_dir(tmp_path / "tiny-llama")
    mdl, tok = api.load(str(model_dir))
    fp = model_fingerprint(mdl)
    with ProfileStore() as store:  # a table whose window accepts 2 a step at 25 packed, lookup 1.8 at ~2.2
        store.save_acceptance(synthetic_table(fp, model_tokenizer_fingerprint(mdl, tok)))
    result = run("profile", "--model", str(model_dir), "--quick")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "chat: predicted speedup from acceptance table store (chat, float32)" in out
    assert "greedy" in out and "code: no acceptance table" in out
    assert "chat: stored predicted profile #1" in out
    with ProfileStore() as store:
        prof = store.get(1)
    assert prof.notes.startswith("predicted") and "acceptance table store (chat" in prof.notes and prof.workload == "chat"
    res = api.generate(mdl, tok("hello world", return_tensors="pt").input_ids, max_new_tokens=4, workload="chat")
    assert res.stats.settings_source.startswith("predicted (store:exact:#1")
    assert res.stats.settings["window"] == prof.settings.window


def test_list_and_import_in_a_read_only_home(monkeypatch):
    import warnings

    from readonly import read_only, readable_home

    with readable_home(monkeypatch) as home:
        with read_only(home), warnings.catch_warnings(record=True):  # nothing stored yet, and nothing can be
            empty = run("profiles", "list")
        assert empty.exit_code == 0 and "no profiles in" in empty.output, empty.output
        with ProfileStore() as store:
            store.save(sample())
        f = home / "chat.json"
        f.write_text(profile_to_json(sample(workload="chat")))
        before = (home / "autolade.db").read_bytes()
        with read_only(home), warnings.catch_warnings(record=True):
            listed = run("profiles", "list")
            imported = CliRunner().invoke(cli, ["profiles", "import", str(f)])
        assert (home / "autolade.db").read_bytes() == before
    assert listed.exit_code == 0 and "smollm2-135m" in listed.output and "1.37x" in listed.output, listed.output
    assert imported.exit_code == 1 and "Traceback" not in imported.output, imported.output
    assert "read-only" in imported.output and "AUTOLADE_HOME" in imported.output


def test_profile_compile_measures_and_stores_the_compiled_curve(home, tmp_path, one_thread):
    """`profile --compile` times the compiled step at its buckets, stores that curve apart and says whether
    generate() will compile here; `generate --compile/--no-compile` overrides it."""
    import json

    model_dir = tiny_model_dir(tmp_path / "tiny-llama")
    result = run("profile", "--model", str(model_dir), "--quick", "--compile")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "compiled step latency" in out and "saved the compiled step curve #2" in out
    assert "compiled steps: on for generate()" in out or "compiled steps: off for generate()" in out
    assert "k=1: " in out and "x eager" in out and "warm-up" in out
    with ProfileStore() as store:
        curves = [json.loads(r["curve"]) for r in store.db.query("select curve from curves order by id")]
    assert [c["compiled"] for c in curves] == [False, True] and "64" in curves[1]["points"]["128"]
    assert curves[1]["warmup_s"] > 0 and curves[0]["warmup_s"] is None  # what a one-shot run weighs compiling against
    on = run("generate", "w3 w4 w5 w3 w4", "--model", str(model_dir), "-n", "6", "--compile", "--stats", "--no-memory")
    assert on.exit_code == 0, on.output
    assert "compiled steps (one graph of dynamic width, padded to buckets [" in on.output  # a CPU: one frozen graph
    off = run("generate", "w3 w4 w5 w3 w4", "--model", str(model_dir), "-n", "6", "--no-compile", "--stats", "--no-memory")
    assert off.exit_code == 0 and "compiled steps" not in off.output
    assert off.output.split("\n")[0] == on.output.split("\n")[0]  # the same text
    # no flag: 6 tokens never win back seconds of warm-up, so a one-shot run stays eager, and says so where the
    # curves alone would have compiled
    default = run("generate", "w3 w4 w5 w3 w4", "--model", str(model_dir), "-n", "6", "--stats", "--no-memory")
    assert default.exit_code == 0 and "compiled steps (" not in default.output, default.output
    assert ("is won back only after about" in default.output) == ("compiled steps: on for generate()" in out)
