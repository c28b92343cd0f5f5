"""autolade: exact lookahead decoding for stock Hugging Face causal LMs, tuned to the machine."""

from .api import GenerateResult, GenerateStats, generate, load
from .config import GREEDY, LookaheadConfig
from .errors import AutoladeError, ConfigError, InputError, ModelNotFoundError, ProfileError, StoreError

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
