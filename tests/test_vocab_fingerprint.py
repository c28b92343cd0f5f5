"""The vocabulary fingerprint acceptance tables are keyed on: the id -> string map, not the labels."""

import pytest

from autolade.errors import ProfileError
from autolade.records.vocab import legacy_tokenizer_fingerprint, tokenizer_fingerprint, tokenizer_fingerprints


class FakeTokenizer:
    """The four tokenizer attributes the fingerprint reads (a plain stand-in, not a transformers class)."""

    def __init__(self, size: int, eos: str = "</s>", prefix: str = "t", special_ids: tuple[int, ...] = (0,)) -> None:
        self.size = size
        self.prefix = prefix
        self.special_tokens_map = {"eos_token": eos}
        self.all_special_ids = list(special_ids)

    def __len__(self) -> int:
        return self.size

    def convert_ids_to_tokens(self, ids):
        return [f"{self.prefix}{i}" for i in ids]


def test_tokenizer_fingerprint_is_the_vocabulary_not_the_special_token_labels():
    a = FakeTokenizer(1000)
    # the same vocabulary labelled differently, as two transformers versions convert one GGUF (measured:
    # 5.17 labels SmolLM2's eos <|im_start|> with special ids [0, 1]; 5.25 <|im_end|> with [0, 1, 2])
    relabelled = FakeTokenizer(1000, eos="<|im_end|>", special_ids=(0, 1))
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(FakeTokenizer(1000))
    assert tokenizer_fingerprint(a).startswith("v1000:")
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(relabelled)
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(FakeTokenizer(1001))
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(FakeTokenizer(1000, prefix="u"))  # other strings
    # tables keyed before 2026-12-04 carry the legacy fingerprint, which told these apart: lookups match both
    assert legacy_tokenizer_fingerprint(a) != legacy_tokenizer_fingerprint(relabelled)
    assert tokenizer_fingerprints(a) == (tokenizer_fingerprint(a), legacy_tokenizer_fingerprint(a))
    assert tokenizer_fingerprints(None, vocab_size=96) == ("ids-only:v96",)
    assert tokenizer_fingerprint(None, vocab_size=96) == "ids-only:v96"
    with pytest.raises(ProfileError):
        tokenizer_fingerprint(None)
