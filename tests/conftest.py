"""Shared fixtures. The real models load once per session from the real user dir
(``$AUTOLADE_HOME`` or ``~/.cache/autolade``), so a machine converts each GGUF only once;
tests of the conversion cache itself use their own temporary ``AUTOLADE_HOME``."""

from __future__ import annotations

import pytest

from autolade.models import load


@pytest.fixture(scope="session")
def smollm2():
    """``(model, tokenizer)``: SmolLM2-135M-Instruct, float32, eval mode. Treat as read-only."""
    return load("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def gemma3():
    """``(model, tokenizer)``: Gemma 3 270M base, float32, eval mode. Treat as read-only."""
    return load("gemma3-270m", dtype="float32")
