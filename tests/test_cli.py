"""`autolade generate` through click's runner, on the real SmolLM2 (slow), and the CLI's parsing helpers."""

import pytest
from click.testing import CliRunner

from autolade.cli import cli, parse_duration

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
