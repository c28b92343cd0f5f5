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
