"""Counting acceptance on the real engine (tiny model; SmolLM2 when slow): the counts are the engine's stats."""

from __future__ import annotations

import statistics

import pytest
import torch

from autolade import api
from autolade.config import GREEDY, SCALED_LOOKUP, LookaheadConfig
from autolade.errors import ProfileError
from autolade.machine.models import model_fingerprint
from autolade.records.acceptance import AcceptanceTable
from autolade.records.grid import GREEDY_SETTING, Setting
from autolade.tuning.acceptance_measure import measure_acceptance
from tests.tiny import repetitive_prompt, tiny_llama

LOOKUP4 = Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=4, prompt_lookup_drafts=1))
WINDOW = Setting.of(LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=0))


def test_measure_counts_match_the_engine_stats():
    model = tiny_llama()
    prompts = [repetitive_prompt(seed=1), repetitive_prompt(seed=2, length=30)[0].tolist()]
    settings = (GREEDY_SETTING, LOOKUP4, WINDOW, Setting.of(LOOKUP4.config.with_(prompt_lookup=8), policy="lookup"))
    seen, lines = [], []
    t = measure_acceptance(model, prompts, settings, max_new_tokens=24, workload="chat", progress=lines.append,
                           on_row=seen.append)
    assert [len(s.rows) for s in seen] == [1, 2, 3, 4] and seen[-1] == t and len(lines) == 4
    fp = model_fingerprint(model)
    assert (t.model_name, t.model_config_hash, t.dtype) == (fp["name"], fp["config_hash"], "float32")
    assert t.tokenizer_fingerprint == "ids-only:v96" and t.prompts == 2 and t.max_new_tokens == 24
    for setting in settings:
        stats = [api.generate(model, torch.tensor([p]) if isinstance(p, list) else p, max_new_tokens=24,
                              config=setting.config, policy=setting.policy, memory=False).stats for p in prompts]
        r = t.row(setting.label)
        assert r.steps == sum(s.steps for s in stats)
        assert r.tokens == sum(s.new_tokens - 1 for s in stats)
        assert r.tokens_per_step_mean == pytest.approx(statistics.fmean(s.tokens_per_step for s in stats))
        assert r.tokens_per_step == pytest.approx(r.tokens / r.steps)
        packed = [k for s in stats for k in s.per_step["packed"]]
        assert r.packed_hist == {k: packed.count(k) for k in set(packed)}
        assert r.packed_mean == pytest.approx(statistics.fmean(packed))
        assert r.context_min == 46  # the shorter prompt (30 + 2 x 8 motif tokens): its first step's KV length
        assert 46 < r.context_median < r.context_max <= 56 + 22  # the longer prompt + all but its last step's tokens
    assert t.row("greedy").tokens == t.row("greedy").steps and t.row("greedy").packed_hist == {1: t.row("greedy").steps}
    assert t.row(LOOKUP4.label).tokens_per_step > 1.0  # the repetitive prompts give prompt lookup something to find
    assert AcceptanceTable.from_json(t.to_json()) == t


def test_a_priced_row_counts_what_a_machine_of_that_price_packs():
    model = tiny_llama()
    prompts = [repetitive_prompt(seed=1), repetitive_prompt(seed=2, length=30)]
    recycle = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)
    settings = (Setting.of(recycle), Setting.of(recycle, token_cost=0.5))
    t = measure_acceptance(model, prompts, settings, max_new_tokens=24, workload="chat")
    full, dear = (t.row(s.label) for s in settings)
    stats = [api.generate(model, p, max_new_tokens=24, config=recycle, memory=False, price_drafts=0.5).stats for p in prompts]
    assert dear.steps == sum(s.steps for s in stats) and dear.packed_hist == {
        k: sum(s.per_step["packed"].count(k) for s in stats) for k in {k for s in stats for k in s.per_step["packed"]}}
    assert dear.packed_mean < full.packed_mean  # the price cut the recycled tree


def test_an_interrupted_measurement_keeps_its_complete_rows():
    saved = []

    def save(t):
        saved.append(t)
        if len(t.rows) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure_acceptance(tiny_llama(), [repetitive_prompt()], (GREEDY_SETTING, LOOKUP4, WINDOW), max_new_tokens=12,
                           workload="code", on_row=save)
    assert [r.label for r in saved[-1].rows] == ["greedy", LOOKUP4.label]
    # resuming measures only what is missing and keeps the interrupted run's rows as they were
    lines = []
    done = measure_acceptance(tiny_llama(), [repetitive_prompt()], (GREEDY_SETTING, LOOKUP4, WINDOW), max_new_tokens=12,
                              workload="code", resume_from=saved[-1], progress=lines.append)
    assert [r.label for r in done.rows] == ["greedy", LOOKUP4.label, WINDOW.label]
    assert done.rows[:2] == saved[-1].rows and done.created == saved[-1].created
    assert sum("measured before (resumed)" in line for line in lines) == 2
    # a table of another measurement (other length) is not resumed from: everything is measured again
    other = measure_acceptance(tiny_llama(), [repetitive_prompt()], (GREEDY_SETTING,), max_new_tokens=10,
                               workload="code", resume_from=saved[-1])
    assert [r.label for r in other.rows] == ["greedy"] and other.max_new_tokens == 10


def test_measure_refuses_bad_arguments():
    model = tiny_llama()
    with pytest.raises(ProfileError, match="prompt"):
        measure_acceptance(model, [], (GREEDY_SETTING,), max_new_tokens=8, workload="chat")
    with pytest.raises(ProfileError, match="max_new_tokens"):
        measure_acceptance(model, [repetitive_prompt()], (GREEDY_SETTING,), max_new_tokens=1, workload="chat")
    with pytest.raises(ProfileError, match="Setting"):
        measure_acceptance(model, [repetitive_prompt()], (GREEDY,), max_new_tokens=8, workload="chat")


@pytest.mark.slow
def test_measure_smollm2_two_prompts(smollm2):
    from autolade.workloads import encode_prompt, load_workload

    model, tok = smollm2
    prompts = [encode_prompt(tok, p.text, kind=p.kind) for p in load_workload("code", limit=2)]
    settings = (GREEDY_SETTING, Setting.of(SCALED_LOOKUP), Setting.of(LookaheadConfig(window=4, ngram=4, guesses=4, prompt_lookup=0)))
    t = measure_acceptance(model, prompts, settings, max_new_tokens=32, workload="code", tokenizer=tok)
    assert t.tokenizer_fingerprint.startswith(f"v{len(tok)}:")
    assert t.row("greedy").tokens_per_step == 1.0
    assert t.row("lookup 16x3 scaled").tokens_per_step > 1.0
    assert t.row("W4 N4 G4").tokens_per_step >= 1.0
    assert t.row("W4 N4 G4").packed_mean > 1.0
    assert AcceptanceTable.from_json(t.to_json()) == t


def test_a_recount_counts_named_rows_on_more_prompts_and_keeps_the_rest():
    """`autolade accept --recount`: the named rows counted again on more prompts (each row keeps its own prompt
    count), the others untouched; run again it keeps what it counted; a name the table lacks is refused."""
    from autolade.tuning.acceptance_measure import measure_row, recount_rows

    model = tiny_llama()
    first, more = [repetitive_prompt(seed=1)], [repetitive_prompt(seed=s) for s in (1, 2, 3)]
    table = measure_acceptance(model, first, (GREEDY_SETTING, LOOKUP4, WINDOW), max_new_tokens=16, workload="chat")
    saved, lines = [], []
    again = recount_rows(model, more, table, [WINDOW.label], progress=lines.append, on_row=saved.append)
    assert len(saved) == 1 and saved[0] == again and "over 3 prompts (was" in lines[0]
    assert again.row_prompts(again.row(WINDOW.label)) == 3 and again.prompts == 1
    engine = measure_row(model, more, WINDOW, max_new_tokens=16)
    got = again.row(WINDOW.label)
    assert (got.steps, got.tokens, got.packed_hist) == (engine.steps, engine.tokens, engine.packed_hist)
    assert got.steps > table.row(WINDOW.label).steps  # three prompts' steps, not one's
    assert [again.row(label) for label in ("greedy", LOOKUP4.label)] == [table.row("greedy"), table.row(LOOKUP4.label)]
    assert AcceptanceTable.from_json(again.to_json()).row(WINDOW.label).prompts == 3
    lines = []
    assert recount_rows(model, more, again, [WINDOW.label], progress=lines.append) == again
    assert "counted on 3 prompts already: kept" in lines[0]
    # a table with re-counted rows still resumes a plain run over its first prompts
    resumed = measure_acceptance(model, first, (GREEDY_SETTING, LOOKUP4, WINDOW), max_new_tokens=16, workload="chat",
                                 resume_from=again)
    assert resumed.rows == again.rows
    with pytest.raises(ProfileError, match="no row 'W9 N9 G9'.*greedy"):
        recount_rows(model, more, table, ["W9 N9 G9"])
    with pytest.raises(ProfileError, match="at least one prompt"):
        recount_rows(model, [], table, [WINDOW.label])


def test_counts_do_not_follow_this_machines_curve():
    """A stored curve with c(2) < c(1) pads a drafting call's lone steps on this machine; a table is
    hardware-free, so its counts stay those of the unpadded engine (the prediction prices lone steps at c(2))."""
    from test_settings import _save_curve

    from autolade.tuning.acceptance_measure import measure_row

    model, prompts = tiny_llama(), [repetitive_prompt(seed=3)]
    lookup = Setting.of(LookaheadConfig(window=0, prompt_lookup=4))
    before = measure_row(model, prompts, lookup, max_new_tokens=30)
    _save_curve(model, {128: {1: 224.4, 2: 196.3, 4: 213.6, 8: 233.5, 16: 306.9}})
    assert api.generate(model, prompts[0], max_new_tokens=30, config=lookup.config, memory=False).stats.padded
    after = measure_row(model, prompts, lookup, max_new_tokens=30)
    assert 1 in after.packed_hist and (after.packed_hist, after.steps) == (before.packed_hist, before.steps)
