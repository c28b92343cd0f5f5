"""The public generate(): contract, validation, stats, stops, settings resolution."""

import pytest
import torch
from tiny import hf_greedy, repetitive_prompt, tiny_llama

import autolade
from autolade import ConfigError, InputError, LookaheadConfig
from autolade.api import generate


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))


def test_sequences_and_stats(llama):
    ids = repetitive_prompt(seed=0)
    res = generate(llama, ids, max_new_tokens=40, window=3, ngram=3, guesses=3)
    assert res.sequences.shape == (1, ids.shape[1] + 40)
    assert torch.equal(res.sequences[:, : ids.shape[1]], ids)
    assert res.sequences[0, ids.shape[1] :].tolist() == hf_greedy(llama, ids, 40)
    st = res.stats
    assert st.new_tokens == 40 and st.steps == len(st.per_step["packed"]) and st.steps <= 39
    assert st.tokens_per_step == pytest.approx(39 / st.steps)
    assert st.settings["window"] == 3 and st.settings_source == "explicit"
    assert st.forward_ms > 0 and st.overhead_ms >= 0 and st.tokens_per_s > 0
    assert "tokens/step" in st.summary()


def test_one_dimensional_input_and_int32(llama):
    ids = repetitive_prompt(seed=1)[0].to(torch.int32)
    res = generate(llama, ids, max_new_tokens=5, config=LookaheadConfig(window=2))
    assert res.sequences.shape == (1, ids.shape[0] + 5) and res.sequences.dtype == torch.long


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros((1, 0), dtype=torch.long), "empty"),
        (torch.zeros((2, 3, 4), dtype=torch.long), "one sequence"),
        (torch.zeros((1, 4)), "integer"),
        (torch.full((1, 4), 10_000), "vocabulary"),
        ([1, 2, 3], "torch.LongTensor"),
    ],
)
def test_bad_input_is_a_clear_error(llama, bad, match):
    with pytest.raises(InputError, match=match):
        generate(llama, bad, max_new_tokens=4, window=1)


def test_over_long_prompt(llama):
    with pytest.raises(InputError, match="exceeds the model's context of 512"):
        generate(llama, torch.ones((1, 500), dtype=torch.long), max_new_tokens=20, window=1)


@pytest.mark.parametrize("kw", [{"window": -1}, {"window": 10**6}, {"guesses": "3"}, {"ngram": 99}])
def test_invalid_wng(llama, kw):
    with pytest.raises(ConfigError):
        generate(llama, repetitive_prompt(), max_new_tokens=4, **kw)


def test_bad_max_new_tokens(llama):
    with pytest.raises(ConfigError, match="max_new_tokens"):
        generate(llama, repetitive_prompt(), max_new_tokens=-3, window=1)


def test_eos_from_generation_config_and_stop_ids(llama):
    ids = repetitive_prompt(seed=0)
    ref = hf_greedy(llama, ids, 30)
    res = generate(llama, ids, max_new_tokens=30, window=2, eos_token_id=[ref[7]])
    assert res.sequences[0, ids.shape[1] :].tolist() == ref[: ref.index(ref[7]) + 1]
    assert res.stats.stop_reason == "eos"
    res = generate(llama, ids, max_new_tokens=30, window=2, stop_token_ids=[ref[5]])
    assert res.stats.stop_reason == "stop" and ref[5] in res.sequences[0, ids.shape[1] :].tolist()


def test_stop_strings_need_a_tokenizer(llama):
    with pytest.raises(ConfigError, match="tokenizer"):
        generate(llama, repetitive_prompt(), max_new_tokens=4, window=1, stop_strings=["x"])


def test_policy_by_name_and_stats_record_it(llama):
    res = generate(llama, repetitive_prompt(seed=2), max_new_tokens=30, config=LookaheadConfig(), policy="adaptive")
    assert res.stats.policy == "adaptive"
    assert len(res.stats.per_step["window"]) == res.stats.steps
    assert 0 < res.stats.policy_ms <= res.stats.overhead_ms  # the policy's calls are timed, inside the overhead
    assert f"policy {res.stats.policy_ms:.1f} ms" in res.stats.summary()
    with pytest.raises(ConfigError, match="unknown policy"):
        generate(llama, repetitive_prompt(), max_new_tokens=4, config=LookaheadConfig(), policy="fastest")


def test_no_settings_uses_default_and_says_so(llama):
    res = generate(llama, repetitive_prompt(seed=2), max_new_tokens=8)
    assert res.stats.settings_source.startswith("default")
    assert res.sequences[0, -8:].tolist() == hf_greedy(llama, repetitive_prompt(seed=2), 8)


def test_the_memory_carries_the_token_recycling_table_from_call_to_call(llama):
    """With the memory on, a recycling config drafts from the table earlier calls taught (per model and
    workload, this process only); "read" uses a copy; off or a caller's table leaves the bank's alone."""
    from autolade.engine.recycle import NextTokenTable
    from autolade.machine.models import model_fingerprint
    from autolade.records.profile import model_key
    from autolade.store.memory import memory_bank, memory_path

    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)  # recycling is the only source
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:30].add(3).unsqueeze(0)
    ref = hf_greedy(llama, ids, 60)
    off = generate(llama, ids, max_new_tokens=60, config=cfg, memory=False)
    first = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True)
    bank, _ = memory_bank(str(memory_path())).recycled(model_key=model_key(model_fingerprint(llama)), workload="chat",
                                                       vocab_size=llama.config.vocab_size)
    known, seen = bank.known, bank.hits.seen
    second = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True)
    for res in (off, first, second):
        assert res.sequences[0, ids.shape[1] :].tolist() == ref
    assert "token recycling" not in off.stats.memory
    assert "token recycling table carried over (0 tokens known)" in first.stats.memory
    assert f"token recycling table carried over ({known} tokens known)" in second.stats.memory and known > 30
    assert first.stats.steps == off.stats.steps  # an empty table is a fresh one
    assert second.stats.steps < first.stats.steps  # the first answer's predictions draft the second
    assert bank.hits.seen > seen  # and the second call taught the bank's table
    # "read": a copy drafts, the bank's table stays as it was
    known, seen = bank.known, bank.hits.seen
    read = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory="read")
    assert read.stats.steps == second.stats.steps and (bank.known, bank.hits.seen) == (known, seen)
    # another workload has its own table; a config that does not recycle carries none
    code = generate(llama, ids, max_new_tokens=60, config=cfg, workload="code", memory=True)
    assert "(0 tokens known)" in code.stats.memory
    plain = generate(llama, ids, max_new_tokens=60, config=cfg.with_(recycle=0), workload="chat", memory=True)
    assert "token recycling" not in plain.stats.memory and (bank.known, bank.hits.seen) == (known, seen)
    # the caller's own table is drafted from and taught, the bank's left alone
    mine = NextTokenTable()
    generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True, recycled=mine)
    assert mine.known > 30 and (bank.known, bank.hits.seen) == (known, seen)


def test_the_next_process_drafts_from_the_saved_recycling_table(llama):
    """The table is saved beside the memory after each remembered answer: a new process (a new bank on the
    same file) starts from it, as a one-shot `autolade generate` does; "read" reads it and saves nothing."""
    from autolade.store.memory import memory_bank, open_memory_store, recycling_summary

    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:30].add(3).unsqueeze(0)
    ref = hf_greedy(llama, ids, 60)
    first = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True)
    with open_memory_store() as store:
        (saved,) = recycling_summary(store)
    assert saved["workload"] == "chat" and saved["known"] > 30
    memory_bank.cache_clear()  # what a new process sees
    read = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory="read")
    assert f"({saved['known']} tokens known, {saved['known']} of them saved by earlier runs)" in read.stats.memory
    assert read.stats.steps < first.stats.steps
    with open_memory_store() as store:
        assert recycling_summary(store) == [saved]  # read only: nothing saved
    memory_bank.cache_clear()
    second = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True)
    assert second.stats.steps == read.stats.steps
    for res in (first, read, second):
        assert res.sequences[0, ids.shape[1] :].tolist() == ref
    with open_memory_store() as store:
        (after,) = recycling_summary(store)
    assert after["known"] >= saved["known"] and after["updated"] >= saved["updated"]
    with pytest.raises(ConfigError, match="NextTokenTable"):
        generate(llama, ids, max_new_tokens=8, config=cfg, recycled={})


def test_price_drafts_takes_a_price_of_a_packed_token_and_says_which_it_used(llama):
    """A number prices recycled drafts as a machine whose packed token costs that much of a step would
    (what ``autolade accept`` counts a table's priced rows at); the output stays greedy's."""
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:30].add(3).unsqueeze(0)
    ref = hf_greedy(llama, ids, 60)
    unpriced, free, dear = (generate(llama, ids, max_new_tokens=60, config=cfg, memory=False, price_drafts=price)
                            for price in (False, 0.0, 0.5))
    for res in (unpriced, free, dear):
        assert res.sequences[0, ids.shape[1] :].tolist() == ref
    assert (unpriced.stats.draft_price, free.stats.draft_price, dear.stats.draft_price) == (None, 0.0, 0.5)
    assert free.stats.per_step["packed"] == unpriced.stats.per_step["packed"]  # a zero price cuts nothing
    # no recycled node is 50% sure at first: the dear price packs less
    assert sum(dear.stats.per_step["packed"]) < sum(free.stats.per_step["packed"])
    # without recycling or a memory nothing is priced, whatever the number
    plain = generate(llama, ids, max_new_tokens=8, config=cfg.with_(recycle=0), memory=False, price_drafts=0.3)
    assert plain.stats.draft_price is None
    for bad in (-0.1, 1.5, float("nan"), "0.1", None):
        with pytest.raises(ConfigError, match="price_drafts"):
            generate(llama, ids, max_new_tokens=8, config=cfg, memory=False, price_drafts=bad)


def test_pad_single_follows_the_stored_curve_unless_given_and_keeps_the_output(llama):
    """Where this machine's curve has c(2) < c(1), a drafting call's lone steps pack a filler draft; plain
    greedy keeps HF's one-token steps; True / False force it; anything else is refused."""
    from test_settings import _save_curve

    ids = repetitive_prompt(seed=3)
    ref = hf_greedy(llama, ids, 30)
    lookup, greedy = LookaheadConfig(window=0, prompt_lookup=4), LookaheadConfig(window=0, guesses=0, prompt_lookup=0)
    before = generate(llama, ids, max_new_tokens=30, config=lookup, memory=False)
    assert not before.stats.padded and "padded" not in before.stats.summary()
    _save_curve(llama, {128: {1: 224.4, 2: 196.3, 4: 213.6, 8: 233.5, 16: 306.9}})
    padded = generate(llama, ids, max_new_tokens=30, config=lookup, memory=False)
    plain = generate(llama, ids, max_new_tokens=30, config=greedy, memory=False)
    forced = generate(llama, ids, max_new_tokens=30, config=greedy, memory=False, pad_single=True)
    off = generate(llama, ids, max_new_tokens=30, config=lookup, memory=False, pad_single=False)
    for res in (before, padded, plain, forced, off):
        assert res.sequences[0, ids.shape[1] :].tolist() == ref
    assert padded.stats.padded and "lone steps padded" in padded.stats.summary()
    assert min(padded.stats.per_step["packed"]) >= 2 and min(before.stats.per_step["packed"]) == 1
    assert not plain.stats.padded and set(plain.stats.per_step["packed"]) == {1}
    assert forced.stats.padded and min(forced.stats.per_step["packed"]) == 2
    assert not off.stats.padded and off.stats.per_step["packed"] == before.stats.per_step["packed"]
    for bad in (1, "yes"):
        with pytest.raises(ConfigError, match="pad_single"):
            generate(llama, ids, max_new_tokens=4, config=lookup, memory=False, pad_single=bad)


def test_package_exports():
    assert autolade.generate is generate and autolade.LookaheadConfig is LookaheadConfig


def test_memory_remembers_answers_and_drafts_from_them_without_changing_the_output(llama):
    """The second request for the same prompt finds the first answer in the store's memory: memory
    drafts are accepted, fewer steps are taken, and the tokens are still greedy's."""
    # prompt lookup on, but a prompt with no repeats: what lookup finds is only in the new tokens
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=8, prompt_lookup_drafts=1)
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(3))[:30].add(3).unsqueeze(0)
    ref = hf_greedy(llama, ids, 60)
    off = generate(llama, ids, max_new_tokens=60, config=cfg, memory=False)
    first = generate(llama, ids, max_new_tokens=60, config=cfg, workload="code", memory=True)
    second = generate(llama, ids, max_new_tokens=60, config=cfg, workload="humaneval", memory=True)
    for res in (off, first, second):
        assert res.sequences[0, ids.shape[1] :].tolist() == ref
    assert off.stats.memory == "off" and "memory" not in off.stats.accepted_by
    assert first.stats.memory.startswith("0 answers")
    assert second.stats.memory.startswith("1 answers") and "code" in second.stats.memory
    assert second.stats.accepted_by.get("memory", 0) > 0
    assert second.stats.steps < first.stats.steps
    assert "memory" in second.stats.per_step["source"]
    # another workload is another memory
    chat = generate(llama, ids, max_new_tokens=60, config=cfg, workload="chat", memory=True)
    assert chat.stats.memory.startswith("0 answers")


def test_a_read_only_home_decodes_and_drafts_from_the_memory_it_cannot_write(llama, monkeypatch):
    """memory.db and autolade.db in a home this process cannot write: the memory is opened read-only and
    drafted from, the stats say read only, nothing is written, and each file is warned about once."""
    import warnings

    from readonly import read_only, readable_home

    from autolade.errors import StoreWarning
    from autolade.store.db import ProfileStore

    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=8, prompt_lookup_drafts=1)
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(3))[:30].add(3).unsqueeze(0)
    with readable_home(monkeypatch) as home:
        first = generate(llama, ids, max_new_tokens=40, config=cfg, workload="code", memory=True)
        ProfileStore().close()
        before = sorted((p.name, p.read_bytes()) for p in home.iterdir() if p.is_file())
        with read_only(home), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs = [generate(llama, ids, max_new_tokens=40, config=cfg, workload="code", memory=True) for _ in range(2)]
            plain = generate(llama, ids, max_new_tokens=4, workload="code")  # no settings given: the store is read
        after = sorted((p.name, p.read_bytes()) for p in home.iterdir() if p.is_file())
    assert after == before
    for res in runs:
        assert res.sequences.tolist() == first.sequences.tolist()
        assert res.stats.memory.startswith("1 answers") and "read only" in res.stats.memory, res.stats.memory
        assert "could not" not in res.stats.memory and "not remembered" not in res.stats.memory
        assert res.stats.accepted_by.get("memory", 0) > 0
    assert plain.sequences.shape[1] == ids.shape[1] + 4 and "read only" in plain.stats.memory
    said = [str(w.message) for w in caught if issubclass(w.category, StoreWarning)]
    assert len(said) == 2 and any("memory.db" in s for s in said) and any("autolade.db" in s for s in said), said


def test_check_arguments_refuses_without_a_model(llama):
    """What the CLI checks before it loads a model: the same refusals generate() makes."""
    from autolade.api import check_arguments

    check_arguments(max_new_tokens=8, window=2, ngram=3, guesses=2, policy="adaptive", do_sample=True, top_p=0.9)
    for kw, match in [({"max_new_tokens": -1}, "max_new_tokens"), ({"ngram": 1}, "lookahead needs N >= 2"),
                      ({"guesses": -1}, r"guesses \(G\)"), ({"do_sample": True, "temperature": -1.0}, "temperature"),
                      ({"top_p": 0.5}, "only applies when sampling"), ({"policy": "fastest"}, "unknown policy")]:
        with pytest.raises(ConfigError, match=match):
            check_arguments(**kw)
    with pytest.raises(ConfigError, match="lookahead needs N >= 2"):  # generate() itself: a window needs N >= 2
        generate(llama, repetitive_prompt(), max_new_tokens=4, window=3, ngram=1)
