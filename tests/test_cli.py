"""`autolade generate` through click's runner, on the real SmolLM2 (slow), and the CLI's parsing helpers."""

import pytest
from click.testing import CliRunner

from autolade.cli.main import cli
from autolade.cli.tune import parse_duration

# conftest's temporary AUTOLADE_HOME shares the real converted-model cache. Explicit W/N/G, so no
# stored profile is consulted.


@pytest.mark.slow
def test_generate_streams_text_and_prints_stats(tmp_path):
    res = CliRunner().invoke(cli, ["generate", "Say hello.", "-n", "12", "--stats", "--policy", "adaptive",
                                   "-W", "2", "-N", "3", "-G", "2", "--plot", str(tmp_path / "s.png")])
    assert res.exit_code == 0, res.output
    assert "tokens/step" in res.output and "policy adaptive" in res.output
    assert (tmp_path / "s.png").stat().st_size > 1000
    text = res.output.split("tokens in")[0]
    assert len(text.strip()) > 0


@pytest.mark.slow
def test_generate_bad_settings_are_clean_errors():
    res = CliRunner().invoke(cli, ["generate", "Hi", "-W", "1000000"])
    assert res.exit_code == 1 and "window=1000000 is beyond the supported maximum" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["generate", "Hi", "--model", "no-such-model"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["generate", "   "])
    assert res.exit_code == 1 and "empty" in res.output


def test_parse_duration():
    assert parse_duration("20m") == 1200 and parse_duration("1.5h") == 5400 and parse_duration("90") == 90
    assert parse_duration(None) is None


def test_tune_a_hub_alias_end_to_end_offline(tmp_path, monkeypatch):
    """`autolade tune --model codellama-7b-instruct` with the alias's id in an offline hub cache (a tiny
    model saved in the hub's layout): the whole command, a real 2-trial study and a saved profile."""
    import json

    from tiny import hub_snapshot_dir, tiny_llama_dir, word_tokenizer

    from autolade.machine.registry import HUB_MODELS

    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = HUB_MODELS["codellama-7b-instruct"]
    tiny_llama_dir(hub_snapshot_dir(tmp_path / "hf" / "hub", hub.repo_id), word_tokenizer())
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{3 + (i + j) % 9}" for j in range(24))})
                               + "\n" for i in range(3)))
    res = CliRunner().invoke(cli, ["tune", "--model", "codellama-7b-instruct", "--workload", str(prompts),
                                   "--trials", "2", "--max-new-tokens", "8", "--tune-prompts", "1",
                                   "--holdout-prompts", "1", "--no-paper", "--storage", f"sqlite:///{tmp_path / 'o.db'}",
                                   "--report", str(tmp_path / "r.png")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "loading codellama-7b-instruct" in res.output and "profile #" in res.output
    assert "study 'codellama-CodeLlama-7b-Instruct-hf-float32-" in res.output  # named after the hub id
    listed = CliRunner().invoke(cli, ["profiles", "list"])
    assert "codellama/CodeLlama-7b" in listed.output, listed.output  # the model column (22 characters)
    assert (tmp_path / "r.png").stat().st_size > 1000
    # --memory with nothing remembered yet: said, and the trials run without it, in their own study
    res = CliRunner().invoke(cli, ["tune", "--model", "codellama-7b-instruct", "--workload", str(prompts),
                                   "--trials", "1", "--max-new-tokens", "8", "--tune-prompts", "1", "--memory",
                                   "--holdout-prompts", "1", "--no-paper", "--storage", f"sqlite:///{tmp_path / 'o.db'}",
                                   "--report", str(tmp_path / "r2.png")])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "memory: empty; trials run without it" in res.output and "-memory-" in res.output


# --- bad arguments are refused before the model loads (issue 35) ------------------------------


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails loudly: an error that comes after it would show "loaded"."""
    import autolade.machine.models

    def load(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(autolade.machine.models, "load", load)


def _refused(args: list[str], expected: str) -> str:
    res = CliRunner().invoke(cli, args)
    assert not isinstance(res.exception, AssertionError), f"the model was loaded first: {res.output}"
    assert res.exit_code in (1, 2), res.output + repr(res.exception)
    assert expected in res.output and "Traceback" not in res.output and "loading " not in res.output, res.output
    return res.output


@pytest.mark.parametrize("args, expected", [
    (["-n", "-1"], "max_new_tokens must be an integer >= 0, got -1"),
    (["-W", "1000000"], "window=1000000 is beyond the supported maximum"),
    (["-N", "1"], "lookahead needs N >= 2"),
    (["-N", "0", "-W", "3"], "lookahead needs N >= 2"),
    (["-G", "-1"], "guesses (G) must be >= 0"),
    (["--sample", "--temperature", "-1"], "temperature must be a number > 0"),
    (["--sample", "--top-p", "1.5"], "top_p must be a number in"),
    (["--sample", "--top-p", "-0.1"], "top_p must be a number in"),
    (["--sample", "--top-k", "-2"], "top_k must be an integer >= 0"),
    (["--temperature", "0.7"], "only applies when sampling"),
    (["--policy", "fastest"], "unknown policy 'fastest'"),
])
def test_generate_refuses_bad_arguments_before_loading(no_loading, args, expected):
    _refused(["generate", "Hi", *args], expected)


def test_generate_refuses_an_empty_prompt_before_loading(no_loading):
    _refused(["generate", "   "], "the prompt is empty")


@pytest.mark.parametrize("args, expected", [
    (["--workload", "no-such-workload"], "no workload named 'no-such-workload'"),
    (["-n", "-1"], "--max-new-tokens must be at least 1"),
    (["--prompts", "0"], "--prompts must be at least 1"),
])
def test_accept_refuses_bad_arguments_before_loading(no_loading, args, expected):
    _refused(["accept", *args], expected)


@pytest.mark.parametrize("args, expected", [
    (["--storage", "bogus://x"], "--storage 'bogus://x' is not a storage autolade knows"),
    (["--storage", "postgresql+nosuchdriver://u@h/db"], "--storage 'postgresql+nosuchdriver://u@h/db'"),
    (["--workload", "no-such-workload"], "no workload named 'no-such-workload'"),
])
def test_tune_refuses_bad_arguments_before_loading(no_loading, args, expected, tmp_path):
    _refused(["tune", "--trials", "1", "--report", str(tmp_path / "r.png"), *args], expected)
    assert not (tmp_path / "r.png").exists()


def test_generate_notes_a_workload_new_to_the_model(tmp_path):
    """An unknown --workload starts a new memory bucket: said on stderr with the known ones, unless
    --new-workload says it is meant (or the memory is off, so that nothing is started)."""
    from tiny import tiny_llama_dir, word_tokenizer

    tiny_llama_dir(tmp_path / "m", word_tokenizer())
    base = ["generate", "w3 w4 w5 w6 w3 w4", "-m", str(tmp_path / "m"), "-n", "4", "-W", "2"]

    def run(*more: str) -> str:
        res = CliRunner().invoke(cli, [*base, *more])
        assert res.exit_code == 0, res.output + repr(res.exception)
        return res.output

    assert "new for this model" not in run("--workload", "chat")
    out = run("--workload", "poems")
    assert "note: workload 'poems' is new for this model" in out and "known: chat, code, general" in out
    assert "--new-workload" in out
    assert "new for this model" not in run("--workload", "poems")  # remembered now: a known workload
    assert "known: chat, code, general, poems" in run("--workload", "essays")
    assert "new for this model" not in run("--workload", "sonnets", "--new-workload")
    assert "new for this model" not in run("--workload", "limericks", "--no-memory")  # nothing is started


def test_generate_notes_bf16_on_a_cpu_without_bf16_instructions(tmp_path):
    """bf16 on a CPU whose flags show neither avx512_bf16 nor AMX: a note names the commands that compare the
    dtypes; never in fp32, and never where the chip has them (whichever this machine is)."""
    from autolade.machine.hardware import probe_hardware

    model = _tiny_model_dir(tmp_path)
    flags = set(probe_hardware(measure=False).cpu_flags)
    outputs = {}
    for dtype in ("bfloat16", "float32"):
        res = CliRunner().invoke(cli, ["generate", "w3 w4 w5 w6 w3 w4", "-m", model, "-n", "4", "-W", "2", "--raw",
                                       "--no-memory", "--dtype", dtype])
        assert res.exit_code == 0, res.output + repr(res.exception)
        outputs[dtype] = res.output
    assert ("no bf16 matmul instructions" in outputs["bfloat16"]) == (not {"avx512_bf16", "amx_bf16"} & flags)
    assert "no bf16 matmul instructions" not in outputs["float32"]


def _tiny_model_dir(root) -> str:
    """A tiny random Llama with a word tokenizer, saved as a Hugging Face directory under ``root``."""
    from tiny import tiny_llama_dir, word_tokenizer

    tiny_llama_dir(root / "m", word_tokenizer())
    return str(root / "m")


def test_generate_in_a_read_only_home_decodes(monkeypatch):
    import warnings

    from readonly import read_only, readable_home

    from autolade.store.db import ProfileStore

    with readable_home(monkeypatch) as home:
        model = _tiny_model_dir(home)
        ProfileStore().close()
        before = (home / "autolade.db").read_bytes()
        with read_only(home), warnings.catch_warnings(record=True):
            res = CliRunner().invoke(cli, ["generate", "w5 w6 w7 w5 w6", "-m", model, "-n", "4", "--no-memory", "--raw",
                                           "--stats"])
        assert (home / "autolade.db").read_bytes() == before
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert "tokens/step" in res.output


@pytest.mark.parametrize("settings", [["-W", "2", "-N", "3", "-G", "2"], []])
def test_generate_with_a_corrupt_store_decodes_and_leaves_it_alone(tmp_path, settings):
    import os

    from autolade.errors import StoreWarning
    from autolade.paths import user_dir

    model = _tiny_model_dir(tmp_path)
    db = user_dir() / "autolade.db"
    db.write_bytes(b"\x00" + os.urandom(4095))
    before = db.read_bytes()
    with pytest.warns(StoreWarning, match="untouched"):
        res = CliRunner().invoke(cli, ["generate", "w5 w6 w7 w5 w6", "-m", model, "-n", "4", "--no-memory", "--raw",
                                       "--stats", *settings])
    assert res.exit_code == 0, res.output + repr(res.exception)
    assert db.read_bytes() == before and sorted(p.name for p in db.parent.iterdir() if p.is_file()) == ["autolade.db"]
    assert ("could not be read" in res.output) == (not settings), res.output


def test_accept_recounts_named_rows_on_more_prompts(tmp_path):
    """`autolade accept --recount LABEL -p M`: the named rows of the table already made (the -o file) counted
    again on M prompts, the others kept; refused before any counting without a table, with a grid, or for a
    row the table lacks."""
    import json

    from autolade.records.acceptance import read_acceptance_file

    model = _tiny_model_dir(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{3 + (i * j) % 9}" for j in range(24))})
                               + "\n" for i in range(8)))
    table, base = tmp_path / "t.json", ["accept", "--model", model, "--workload", str(prompts), "-o", str(tmp_path / "t.json")]
    missing = CliRunner().invoke(cli, [*base, "--recount", "W2 N3 G2"])
    assert missing.exit_code != 0 and "no acceptance table to re-count rows of" in missing.output
    made = CliRunner().invoke(cli, [*base, "-p", "1", "-n", "12", "--grid", "compact", "--replay-prompts", "5"])
    assert made.exit_code == 0, made.output
    before = read_acceptance_file(table)
    res = CliRunner().invoke(cli, [*base, "-p", "3", "--recount", "W2 N3 G2"])
    assert res.exit_code == 0, res.output
    assert "re-counting 1 rows on 3 prompts x 12 tokens" in res.output and "over 3 prompts (was" in res.output
    assert "refreshing the sample scales against the 5 replayed prompts" in res.output
    after = read_acceptance_file(table)
    assert after.row_prompts(after.row("W2 N3 G2")) == 3 and after.row("W2 N3 G2").steps > before.row("W2 N3 G2").steps
    # the rest as they were (the replay of the table's own settings makes their 1-prompt scale again, the same)
    assert [r for r in after.rows if r.label != "W2 N3 G2"] == [r for r in before.rows if r.label != "W2 N3 G2"]
    assert "W2 N3 G2" in res.output.split("refreshing")[1] and "counted on 3 prompts" in res.output
    for args, expected in ((["--recount", "W9 N9 G9"], "no row 'W9 N9 G9'"),
                           (["--recount", "W2 N3 G2", "--grid", "full"], "drop --grid and --replay-prompts"),
                           (["--recount", "W2 N3 G2", "-n", "20"], "the table counts 12 new tokens per prompt: pass -n 12")):
        bad = CliRunner().invoke(cli, [*base, "-p", "4", *args])
        assert bad.exit_code != 0 and expected in bad.output and "Traceback" not in bad.output, bad.output
    assert read_acceptance_file(table) == after
