"""autolade.tuning.acceptance_replay: rows counted by replaying greedy outputs, and the sample scale of the rest."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autolade.config import SCALED_LOOKUP, LookaheadConfig
from autolade.errors import ProfileError
from autolade.records.acceptance import AcceptanceTable
from autolade.records.grid import GREEDY_SETTING, Setting
from autolade.tuning.acceptance_measure import empty_table, measure_acceptance, measure_row
from autolade.tuning.acceptance_replay import add_replayed_rows
from tests.test_acceptance import LOOKUP4, WINDOW, row
from tests.tiny import repetitive_prompt, tiny_llama


def test_a_replayed_row_counts_exactly_what_the_engine_counts():
    """fp32 tiny model: replaying HF greedy outputs gives the engine's own steps, packed sizes and tokens."""
    model = tiny_llama()
    prompts = [repetitive_prompt(seed=s) for s in range(3)]
    settings = [Setting.of(SCALED_LOOKUP), LOOKUP4, GREEDY_SETTING,
                Setting.of(LookaheadConfig(window=0, guesses=0, prompt_lookup=10, prompt_lookup_drafts=2), policy="lookup")]
    empty = empty_table(model, workload="chat", max_new_tokens=40, prompts=1)
    replayed = add_replayed_rows(empty, model, prompts, settings + [WINDOW])
    assert [r.label for r in replayed.rows] == [s.label for s in settings]  # the window is not replayable
    assert replayed.prompts == 3
    for setting in settings:
        engine = measure_row(model, prompts, setting, max_new_tokens=40)
        got = replayed.row(setting.label)
        assert got.counted_by == "replay" and got.prompts == 3
        assert (got.steps, got.tokens, got.packed_hist) == (engine.steps, engine.tokens, engine.packed_hist)
        assert got.tokens_per_step_mean == pytest.approx(engine.tokens_per_step_mean)


def test_rows_counted_on_fewer_prompts_carry_the_samples_bias():
    """A window row counted by the engine on the first prompt only gets the factor by which the replayed
    settings accepted more (or less) on all prompts than on that one; prediction applies it."""
    from autolade.records.curve import StepCurve
    from autolade.runtime.predict import predict_row

    model = tiny_llama()
    easy = repetitive_prompt(seed=0)
    hard = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:40].add(3)
    base = measure_acceptance(model, [easy], [WINDOW, GREEDY_SETTING], max_new_tokens=40, workload="chat")
    grown = add_replayed_rows(base, model, [easy, hard, hard.flip(0)], [Setting.of(SCALED_LOOKUP), LOOKUP4, GREEDY_SETTING])
    win = grown.row(WINDOW.label)
    assert grown.row_prompts(win) == 1 and win.counted_by == "engine" and grown.prompts == 3
    assert win.sample_scale < 1.0  # the first prompt was the easy one
    assert grown.row(GREEDY_SETTING.label).sample_scale == 1.0 and grown.row(GREEDY_SETTING.label).prompts == 3
    flat = StepCurve(points={256: {k: 10.0 for k in (1, 2, 4, 8, 16, 32, 64)}})
    # the scale measures how much more the whole sample copies: it carries a row that drafts by prompt lookup,
    # while one without lookup (this window) is read as counted
    assert predict_row(win, flat, context=100).tokens_per_step == pytest.approx(win.tokens_per_step)
    with_lookup = dataclasses.replace(win, setting=Setting.of(dataclasses.replace(WINDOW.config, prompt_lookup=4)))
    assert predict_row(with_lookup, flat, context=100).tokens_per_step == pytest.approx(win.tokens_per_step * win.sample_scale)
    back = AcceptanceTable.from_json(grown.to_json())
    assert back.row(WINDOW.label).sample_scale == win.sample_scale
    with pytest.raises(ProfileError, match="sample_scale"):
        row(sample_scale=50.0)


def test_a_table_grown_by_replay_resumes_measuring_only_the_new_settings():
    """`autolade accept` run again with a grid that grew: the rows counted before are kept, the engine
    counts only the new setting on the same prompts, and its sample scale comes from the rows counted on
    those prompts before, with no greedy pass made again."""
    from dataclasses import replace

    from autolade.records.acceptance import REPLAYED_ON

    model = tiny_llama()
    easy = repetitive_prompt(seed=0)
    hard = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:40].add(3)
    prompts, lookups = [easy, hard, hard.flip(0)], [Setting.of(SCALED_LOOKUP), LOOKUP4, GREEDY_SETTING]
    base = measure_acceptance(model, [easy], [WINDOW, GREEDY_SETTING], max_new_tokens=40, workload="chat",
                              prompt_set="chat tuning split[:1]")
    grown = add_replayed_rows(replace(base, prompt_set=f"chat tuning split[:1]{REPLAYED_ON}chat tuning split[:3]"),
                              model, prompts, lookups)
    new_window = Setting.of(LookaheadConfig(window=7, ngram=2, guesses=7, prompt_lookup=0))
    assert new_window.label != WINDOW.label
    lines: list[str] = []
    more = measure_acceptance(model, [easy], [WINDOW, GREEDY_SETTING, new_window], max_new_tokens=40, workload="chat",
                              prompt_set="chat tuning split[:1]", resume_from=grown, progress=lines.append)
    assert sum("measured before (resumed)" in line for line in lines) == 2
    assert (more.prompts, more.prompt_set, more.created) == (grown.prompts, grown.prompt_set, grown.created)
    assert more.row(WINDOW.label) == grown.row(WINDOW.label)
    assert more.row_prompts(more.row(new_window.label)) == 1  # counted on the engine's one prompt, not the table's 3
    lines = []
    done = add_replayed_rows(more, model, prompts, lookups, progress=lines.append)
    assert not any("greedy output" in line for line in lines) and any("replayed on 3 prompts before" in line for line in lines)
    assert done.row(new_window.label).sample_scale == grown.row(WINDOW.label).sample_scale < 1.0
    assert [r for r in done.rows if r.label != new_window.label] == list(grown.rows)
    # the same engine prompts under another prompt set are another measurement: nothing is resumed
    other = measure_acceptance(model, [easy], [GREEDY_SETTING], max_new_tokens=40, workload="chat",
                               prompt_set="chat tuning split[:2]", resume_from=grown)
    assert other.prompts == 1 and [r.label for r in other.rows] == ["greedy"] and other.row("greedy").counted_by == "engine"


def test_a_row_recounted_on_more_prompts_gets_the_scale_of_its_own_count():
    """`accept --recount` on a table grown by replay: the re-counted row rests on 2 of the 3 replayed prompts, so
    its scale is the replayed settings' 3-prompt over 2-prompt ratio, while the rows still on 1 keep theirs;
    and a plain `accept` over the engine's first prompt still resumes that table instead of starting over."""
    from dataclasses import replace

    from autolade.records.acceptance import REPLAYED_ON
    from autolade.tuning.acceptance_measure import recount_rows
    from autolade.tuning.acceptance_replay import sample_scale
    from autolade.tuning.replay import Trace

    model = tiny_llama()
    easy = repetitive_prompt(seed=0)
    hard = torch.randperm(90, generator=torch.Generator().manual_seed(5))[:40].add(3)
    prompts, lookups = [easy, hard, hard.flip(0)], [Setting.of(SCALED_LOOKUP), LOOKUP4, GREEDY_SETTING]
    other = Setting.of(LookaheadConfig(window=7, ngram=2, guesses=7, prompt_lookup=0))
    base = measure_acceptance(model, [easy], [WINDOW, other, GREEDY_SETTING], max_new_tokens=40, workload="chat",
                              prompt_set="chat tuning split[:1]")
    grown = add_replayed_rows(replace(base, prompt_set=f"chat tuning split[:1]{REPLAYED_ON}chat tuning split[:3]"),
                              model, prompts, lookups)
    recounted = recount_rows(model, prompts[:2], grown, [WINDOW.label])
    assert recounted.row(WINDOW.label).sample_scale == 1.0  # not refreshed by the re-count itself
    done = add_replayed_rows(recounted, model, prompts, lookups)
    traces = [Trace(tuple(p.tolist()) if p.dim() == 1 else tuple(p[0].tolist()), tuple(
        model.generate(p.view(1, -1), max_new_tokens=40, do_sample=False)[0, p.numel():].tolist())) for p in prompts]
    assert done.row_prompts(done.row(WINDOW.label)) == 2
    assert done.row(WINDOW.label).sample_scale == pytest.approx(sample_scale(lookups, traces, 2))
    assert done.row(other.label).sample_scale == grown.row(other.label).sample_scale  # still on its 1 prompt
    resumed = measure_acceptance(model, [easy], [WINDOW, other, GREEDY_SETTING], max_new_tokens=40, workload="chat",
                                 prompt_set="chat tuning split[:1]", resume_from=done)
    assert resumed.row(WINDOW.label) == done.row(WINDOW.label) and resumed.prompts == 3
