"""LookaheadConfig's validation and the setting-spec parser: every refusal names the fix."""

import pytest

from autolade.config import LookaheadConfig, parse_config, parse_method
from autolade.errors import ConfigError


@pytest.mark.parametrize("ngram", [0, 1])
def test_a_window_needs_n_of_at_least_two(ngram):
    with pytest.raises(ConfigError, match=r"lookahead needs N >= 2.*window=0"):
        LookaheadConfig(window=4, ngram=ngram)
    with pytest.raises(ConfigError, match="lookahead needs N >= 2"):
        parse_config(f"4,{ngram},4,0")
    assert not LookaheadConfig(window=0, ngram=ngram).lookahead  # no window: N is not used, so any N is fine


def test_a_negative_g_says_what_g_is():
    with pytest.raises(ConfigError) as err:
        LookaheadConfig(guesses=-1)
    message = str(err.value)
    assert "guesses (G) must be >= 0, got -1" in message and "how many pool n-grams are verified per step" in message
    assert "window=0" not in message  # W has nothing to do with a bad G


def test_an_unknown_spec_key_lists_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        parse_config("2,3,2,0,foo=7")
    message = str(err.value)
    assert "unknown key 'foo'" in message and "TypeError" not in message and "unexpected keyword" not in message
    for key in ("recycle", "drafts", "lookup_ngram", "pool", "scaled", "seed", "prompt_lookup_drafts"):
        assert key in message
    assert "carry" not in message
    with pytest.raises(ConfigError) as err:  # keys a caller takes out of the spec first are named too
        parse_method("2,3,2,0,foo=7", also=("carry", "pad", "pairs"))
    assert all(f"{key}," in str(err.value) for key in ("carry", "pad", "pairs"))
