"""`autolade memory` through the click runner, against the test's own AUTOLADE_HOME store."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autolade.cli.main import cli
from autolade.store.memory import add_answers, open_memory_store, summary

KEY = "tiny-llama:abc123"


def _seed() -> None:
    with open_memory_store() as store:
        add_answers(store, model_key=KEY, workload="code", answers=[[1, 2, 3], [4, 5]], source="t")
        add_answers(store, model_key=KEY, workload="chat", answers=[[6]], source="t")


def test_list_says_where_the_memory_lives_and_what_it_holds():
    runner = CliRunner()
    empty = runner.invoke(cli, ["memory", "list"])
    assert empty.exit_code == 0 and "memory.db" in empty.output and "nothing remembered" in empty.output
    _seed()
    out = runner.invoke(cli, ["memory", "list"]).output
    assert "tiny-llama:abc123" in out and "code" in out and "chat" in out


def test_export_then_clear_then_import_restores_it(tmp_path):
    _seed()
    runner = CliRunner()
    f = tmp_path / "code.json"
    res = runner.invoke(cli, ["memory", "export", "--model", "tiny-llama", "--workload", "humaneval", "-o", str(f)])
    assert res.exit_code == 0, res.output
    assert json.loads(f.read_text())["answers"] == [[1, 2, 3], [4, 5]]
    res = runner.invoke(cli, ["memory", "clear", "--workload", "code", "--yes"])
    assert res.exit_code == 0 and "deleted 2" in res.output
    with open_memory_store() as store:
        assert [r["workload"] for r in summary(store)] == ["chat"]
    res = runner.invoke(cli, ["memory", "import", str(f)])
    assert res.exit_code == 0 and "imported 2" in res.output
    with open_memory_store() as store:
        assert {r["workload"]: r["answers"] for r in summary(store)} == {"chat": 1, "code": 2}


def test_list_shows_the_saved_recycling_tables_and_clear_deletes_them():
    import torch

    from autolade.store.memory import MemoryBank, memory_path, recycling_summary

    _seed()
    bank = MemoryBank(memory_path())
    table, _ = bank.recycled(model_key=KEY, workload="code", vocab_size=50)
    table.observe([1, 2, 3], torch.randn(3, 50, generator=torch.Generator().manual_seed(0)))
    assert bank.save_recycled(model_key=KEY, workload="code", vocab_size=50) is None
    runner = CliRunner()
    out = runner.invoke(cli, ["memory", "list"]).output
    assert "token recycling tables" in out and "3 tokens known" in out
    res = runner.invoke(cli, ["memory", "clear", "--model", "tiny-llama", "--workload", "code", "--yes"])
    assert res.exit_code == 0 and "deleted 2 remembered answers and their token recycling tables" in res.output
    with open_memory_store() as store:
        assert recycling_summary(store) == [] and [r["workload"] for r in summary(store)] == ["chat"]
    assert "token recycling tables" not in runner.invoke(cli, ["memory", "list"]).output


def test_clear_asks_first_and_keeps_everything_on_no():
    _seed()
    res = CliRunner().invoke(cli, ["memory", "clear"], input="n\n")
    assert res.exit_code != 0
    with open_memory_store() as store:
        assert sum(r["answers"] for r in summary(store)) == 3


def test_bad_import_is_one_clean_line(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text('{"format": "autolade-memory", "version": 1, "model": "m", "workload": "c", "answers": [[1, 2')
    res = CliRunner().invoke(cli, ["memory", "import", str(f)])
    assert res.exit_code == 1 and "truncated" in res.output and "Traceback" not in res.output


def test_export_of_an_unknown_model_names_the_fix(tmp_path):
    res = CliRunner().invoke(cli, ["memory", "export", "--model", "nope", "--workload", "code", "-o", str(tmp_path / "x")])
    assert res.exit_code == 1 and "autolade memory list" in res.output


def test_importing_a_file_twice_adds_nothing_the_second_time(tmp_path):
    _seed()
    f = tmp_path / "code.json"
    assert CliRunner().invoke(cli, ["memory", "export", "--model", "tiny-llama", "--workload", "code", "-o", str(f)]).exit_code == 0
    res = CliRunner().invoke(cli, ["memory", "import", str(f)])
    assert res.exit_code == 0 and "imported 0 new answers" in res.output and "2 already in the memory" in res.output
    with open_memory_store() as store:
        assert {r["workload"]: r["answers"] for r in summary(store)} == {"chat": 1, "code": 2}


def test_import_into_a_read_only_home_says_what_to_do(monkeypatch):
    import warnings

    from readonly import read_only, readable_home

    with readable_home(monkeypatch) as home:
        _seed()
        f = home / "code.json"
        assert CliRunner().invoke(cli, ["memory", "export", "--model", KEY, "--workload", "code", "-o", str(f)]).exit_code == 0
        with read_only(home), warnings.catch_warnings(record=True):
            listed = CliRunner().invoke(cli, ["memory", "list"])
            res = CliRunner().invoke(cli, ["memory", "import", str(f)])
    assert listed.exit_code == 0 and KEY in listed.output, listed.output
    assert res.exit_code == 1 and "read-only" in res.output and "AUTOLADE_HOME" in res.output, res.output
    assert "Traceback" not in res.output
