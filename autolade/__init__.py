"""autolade: exact lookahead decoding for stock Hugging Face causal LMs, tuned to the machine."""

from autolade.api import generate, load
from autolade.config import GREEDY, LookaheadConfig
from autolade.errors import AutoladeError, ConfigError, InputError, ModelNotFoundError, ProfileError, StoreError
from autolade.prepare import GenerateResult, GenerateStats

__all__ = [
    "AutoladeError",
    "ConfigError",
    "GREEDY",
    "GenerateResult",
    "GenerateStats",
    "InputError",
    "LookaheadConfig",
    "ModelNotFoundError",
    "ProfileError",
    "StoreError",
    "generate",
    "load",
]


def __getattr__(name: str):
    """``autolade.hf`` (the model.generate drop-in) loads on first use: it imports transformers' generation code."""
    if name == "hf":
        import importlib

        return importlib.import_module(".hf", __name__)
    raise AttributeError(f"module 'autolade' has no attribute {name!r}")
