"""Lint is part of the test command: `ruff check` (rules in pyproject.toml) must be clean."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    try:
        out = subprocess.run([*cmd, "check", "autolade", "tests", "tools"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    except FileNotFoundError:
        pytest.fail("ruff is not installed: run `bash tools/setup.sh` (it installs the test extra, which has ruff)")
    assert out.returncode == 0, f"ruff found lint errors (fix them, or `ruff check --fix`):\n{out.stdout}{out.stderr}"
