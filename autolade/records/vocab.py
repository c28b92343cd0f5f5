"""Which vocabulary a table was measured with: ``v<size>:<hash>`` of the tokenizer's id -> string map.

What a draft source accepts depends on the token ids, so an acceptance table is keyed on the model
and on this fingerprint; a lookup matches the current fingerprint and the legacy one (before
2026-12-04, which also hashed the special-token labels) so older stores and files keep working.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from autolade.errors import ProfileError


def tokenizer_fingerprint(tokenizer: Any, *, vocab_size: int | None = None) -> str:
    """``v<size>:<hash>``: the tokenizer's length and a hash of the strings of a spread of ids (the
    vocabulary: which string each id is, what acceptance depends on). ``tokenizer=None`` (prompts
    given as ids) is ``ids-only:v<vocab_size>``.

    The special-token *labels* are left out: libraries fill them in differently for the same vocabulary
    (measured: transformers 5.17's GGUF conversion of SmolLM2 labels ``<|im_start|>`` its eos and has no
    pad token; 5.25's labels ``<|im_end|>``), and a table must travel between such machines. The
    special tokens' strings are still hashed, as pieces of the vocabulary."""
    if tokenizer is None:
        if vocab_size is None:
            raise ProfileError("tokenizer_fingerprint needs a tokenizer or vocab_size")
        return f"ids-only:v{int(vocab_size)}"
    return _fingerprint(len(tokenizer), ["vocab", _sample_pieces(tokenizer)])


def legacy_tokenizer_fingerprint(tokenizer: Any, *, pieces: list[Any] | None = None) -> str:
    """The fingerprint tables were keyed on before 2026-12-04: the vocabulary sample *and* the
    special-token labels and ids. Still matched on lookup, so older stores and files keep working.
    ``pieces``: ``_sample_pieces(tokenizer)`` when the caller has it already."""
    specials = sorted((str(k), str(v)) for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items())
    special_ids = sorted(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []))
    return _fingerprint(len(tokenizer), [specials, special_ids, _sample_pieces(tokenizer) if pieces is None else pieces])


def tokenizer_fingerprints(tokenizer: Any, *, vocab_size: int | None = None) -> tuple[str, ...]:
    """Every fingerprint a table for this tokenizer may carry: the current one first, then the legacy one."""
    if tokenizer is None:
        return (tokenizer_fingerprint(None, vocab_size=vocab_size),)
    pieces = _sample_pieces(tokenizer)  # the expensive part, shared by both
    current = _fingerprint(len(tokenizer), ["vocab", pieces])
    legacy = legacy_tokenizer_fingerprint(tokenizer, pieces=pieces)
    return (current,) if legacy == current else (current, legacy)


def as_fingerprints(tokenizer_fingerprint: str | Sequence[str]) -> tuple[str, ...]:
    """One tokenizer fingerprint or several (``tokenizer_fingerprints``) as a tuple, the current one first."""
    return (tokenizer_fingerprint,) if isinstance(tokenizer_fingerprint, str) else tuple(tokenizer_fingerprint)


def _sample_pieces(tokenizer: Any) -> list[Any]:
    """The strings of a spread of ids: the first 64 and about 256 more across the vocabulary."""
    size = len(tokenizer)
    sample = list(range(min(size, 64))) + list(range(64, size, max(size // 256, 1)))
    return tokenizer.convert_ids_to_tokens(sample)


def _fingerprint(size: int, hashed: list[Any]) -> str:
    return f"v{size}:{hashlib.sha256(json.dumps(hashed, default=str).encode()).hexdigest()[:12]}"


def model_tokenizer_fingerprint(model: Any, tokenizer: Any = None) -> str:
    """``tokenizer_fingerprint`` of a model's tokenizer, with the vocabulary size from its config:
    what a new table is keyed on."""
    return tokenizer_fingerprint(tokenizer, vocab_size=_config_vocab_size(model))


def model_tokenizer_fingerprints(model: Any, tokenizer: Any = None) -> tuple[str, ...]:
    """``tokenizer_fingerprints`` of a model's tokenizer: what a lookup matches."""
    return tokenizer_fingerprints(tokenizer, vocab_size=_config_vocab_size(model))


def _config_vocab_size(model: Any) -> int | None:
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    return getattr(cfg, "vocab_size", None)
