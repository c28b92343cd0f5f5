"""Shared fixtures.

Every test runs in its own temporary ``AUTOLADE_HOME`` (profile store, Optuna studies, reports),
so no test reads or writes the user's. Its ``models/`` folder is a link to the real user dir's
converted-model cache (``$AUTOLADE_HOME/models`` or ``~/.cache/autolade/models`` as the session
found it), so a machine converts each GGUF only once; tests of the conversion cache itself set
their own ``AUTOLADE_HOME``. The real models load once per session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autolade.machine.models import load
from autolade.paths import ENV_VAR

# the converted-model cache the session started with, shared by every test's temporary home
MODEL_CACHE = (Path(os.environ[ENV_VAR]).expanduser() if os.environ.get(ENV_VAR) else Path.home() / ".cache" / "autolade") / "models"


@pytest.fixture(autouse=True)
def autolade_home(tmp_path_factory, monkeypatch) -> Path:
    """A fresh ``AUTOLADE_HOME`` for this test, sharing the session's converted-model cache."""
    home = tmp_path_factory.mktemp("autolade-home")
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    monkeypatch.setenv(ENV_VAR, str(home))
    return home


@pytest.fixture
def foreign_backend():
    """matplotlib switched to a backend other than Agg for the test, and back after: a plot must leave it."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg", force=True)
    yield "svg"
    matplotlib.use(before, force=True)


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)``: SmolLM2-135M-Instruct, float32, eval mode. Treat as read-only."""
    return load("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def gemma3():
    """``(model, tokenizer)``: Gemma 3 270M base, float32, eval mode. Treat as read-only."""
    return load("gemma3-270m", dtype="float32")


@pytest.fixture(scope="session")
def qwen05():
    """``(model, tokenizer)``: Qwen2.5-Coder-0.5B-Instruct, float32, eval mode; skipped unless installed
    (``bash tools/setup.sh --qwen``) or already converted. Treat as read-only."""
    from autolade.errors import ModelNotFoundError

    try:
        return load("qwen2.5-coder-0.5b", dtype="float32")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def one_thread():
    """One torch thread: a tiny model is all op overhead, and with 2 threads on a busy 2-core box each
    op can wait a scheduler tick (10x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
