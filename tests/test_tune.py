"""The Optuna tuner on the real SmolLM2 with a tiny workload: a real study in SQLite, resumable,
saving a profile that generate() then uses."""

import json

import optuna
import pytest
import torch

from autolade import api
from autolade.config import LookaheadConfig
from autolade.engine.memory import AnswerMemory
from autolade.errors import ConfigError
from autolade.machine.hardware import probe_hardware
from autolade.store.db import ProfileStore
from autolade.tuning.harness import Reference
from autolade.tuning.search import study_name_for, tune
from autolade.tuning.space import TuneOptions, candidate_from_params, pick_finalists, suggest
from autolade.tuning.trials import Candidate, ExactnessError, Runner, bootstrap_ci, own_answer

PROMPTS = [
    "List the numbers from 1 to 20, one per line.",
    "Write the alphabet in capital letters, separated by commas.",
    "Repeat this sentence three times: the cat sat on the mat.",
    "Count down from 10 to 1.",
]


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "counting.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": p}) for i, p in enumerate(PROMPTS)))
    return str(path)


@pytest.mark.slow
def test_tune_saves_a_profile_resumes_and_generate_uses_it(smollm2, workload, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    model, tok = smollm2
    store = ProfileStore(tmp_path / "home" / "autolade.db")
    hw = probe_hardware(measure=False)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    opts = TuneOptions(trials=4, max_new_tokens=12, tune_prompts=2, holdout_prompts=1, finalists=2)
    logs = []
    res = tune(model, tok, model_name="smollm2-135m", workload=workload, options=opts, storage=storage,
               study_name="t", store=store, hardware=hw, compare_paper=False, report_png=tmp_path / "r.png",
               progress=False, log=logs.append)
    assert res.trials_run == 4 and res.profile_id is not None
    assert res.speedup >= 1.0 or res.best.config.greedy_only  # never slower than greedy by construction
    assert res.ci[0] <= res.speedup <= res.ci[1]
    assert (tmp_path / "r.png").stat().st_size > 1000
    study = optuna.load_study(study_name="t", storage=storage)
    assert study.trials[0].params["window"] == 0 and study.trials[0].params["prompt_lookup"] == 0  # greedy enqueued
    # resuming: the same command runs only what is missing
    opts6 = TuneOptions(trials=6, max_new_tokens=12, tune_prompts=2, holdout_prompts=1, finalists=1)
    tune(model, tok, model_name="smollm2-135m", workload=workload, options=opts6, storage=storage, study_name="t",
         store=None, hardware=hw, compare_paper=False, progress=False, log=logs.append)
    assert len(optuna.load_study(study_name="t", storage=storage).trials) == 6
    assert any("4 trials done, 2 to run" in line for line in logs)
    # generate() with no settings now uses the stored profile for this hardware/model/dtype/workload
    ids = tok("Count down from 10 to 1.", return_tensors="pt").input_ids
    out = api.generate(model, ids, max_new_tokens=4, workload=workload)
    assert out.stats.settings_source.startswith("store:exact")
    assert out.stats.settings == res.best.config.to_dict()


@pytest.mark.slow
def test_diverging_output_fails_the_trial(smollm2):
    model, tok = smollm2
    ids = tok("Hello", return_tensors="pt").input_ids
    runner = Runner(model, max_new_tokens=4, eos=[2])
    ref = runner.reference(0, ids).tokens
    runner._ref[0] = Reference([t + 1 for t in ref], [5.0] * len(ref))  # a reference the engine cannot match
    with pytest.raises(ExactnessError, match="top-2 gap 5"):
        runner.ours(0, ids, Candidate(LookaheadConfig(window=1), None))
    runner._ref[0] = Reference([t + 1 for t in ref], [1e-6] * len(ref))  # the same flip within float noise: tolerated
    _, _, _, gap = runner.ours(0, ids, Candidate(LookaheadConfig(window=1), None))
    assert gap == pytest.approx(1e-6)


def test_search_space_round_trips_and_options_validate():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    opts = TuneOptions()
    for _ in range(20):
        trial = study.ask()
        cand = suggest(trial, opts, 6)
        assert cand.config.window <= 6
        again = candidate_from_params(trial.params, opts)
        assert again.config == cand.config and again.policy == cand.policy
        study.tell(trial, 1.0)
    with pytest.raises(ConfigError):
        TuneOptions(trials=0)
    with pytest.raises(ConfigError, match="budget"):
        TuneOptions(budget_s=-1)


def test_finalists_are_distinct_behaviours_and_old_trials_still_load():
    lookup = {"window": 3, "ngram": 4, "guesses": 2, "prompt_lookup": 8, "prompt_lookup_drafts": 2,
              "prompt_lookup_scaled": False, "policy": "lookup"}
    ranked = [lookup, {**lookup, "window": 5, "ngram": 2}, {"window": 0, "prompt_lookup": 0},
              {**lookup, "prompt_lookup_scaled": True}]
    picked = pick_finalists(ranked, TuneOptions(finalists=3))
    # the 2nd differs only in the W/N the lookup policy ignores: it is the 1st again, so the 4th gets in
    assert [c.label() for c in picked] == ["lookup8 lookup", "greedy", "lookup8s lookup"]
    old = {k: v for k, v in lookup.items() if k != "prompt_lookup_scaled"}  # a study from before scaled drafts
    assert candidate_from_params(old, TuneOptions()).config.prompt_lookup_scaled is False
    assert candidate_from_params(old, TuneOptions()).config.recycle == 0  # ... and before token recycling
    assert candidate_from_params({**lookup, "recycle": 16}, TuneOptions()).label() == "lookup8+R16 lookup"
    # an adaptive trial from before start_off / probe_backoff: the window starts on, probes never back off
    adaptive = {"window": 3, "ngram": 3, "guesses": 2, "prompt_lookup": 0, "policy": "adaptive", "max_window": 4,
                "margin": 1.05, "probe_every": 16}
    policy = candidate_from_params(adaptive, TuneOptions()).policy
    assert policy["start_window"] == 3 and policy["probe_backoff"] == 1.0
    assert candidate_from_params({**adaptive, "start_off": True, "probe_backoff": 2.0}, TuneOptions()).policy[
        "start_window"] == 0
    # the lookup branch may size drafts by the step curve; without a curve the tuner does not offer it
    cost_aware = candidate_from_params({**lookup, "lookup_sizing": "cost"}, TuneOptions())
    assert cost_aware.policy == {"name": "cost-aware"} and cost_aware.label() == "lookup8 cost-aware"  # no W: it runs none
    assert candidate_from_params({**lookup, "lookup_sizing": "cost"},
                                 TuneOptions(search_cost_aware=False)).policy["name"] == "lookup"


def test_bootstrap_ci_brackets_the_ratio():
    lo, hi = bootstrap_ci([2.0, 2.2, 1.8, 2.1], [1.0, 1.0, 1.0, 1.0])
    assert lo <= 2.025 <= hi and hi - lo < 0.5
    assert torch.isfinite(torch.tensor([lo, hi])).all()


def test_quiet_optuna_and_the_report_leave_global_state_alone(tmp_path, foreign_backend):
    import matplotlib

    from autolade.tuning.report import plot_study
    from autolade.tuning.search import quiet_optuna

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    try:
        with quiet_optuna():
            assert optuna.logging.get_verbosity() == optuna.logging.WARNING
            study = optuna.create_study(direction="maximize", study_name="s")
            study.optimize(lambda t: 1.0 + 0.1 * t.suggest_int("window", 0, 3) - 0.05 * t.suggest_int("ngram", 2, 4),
                           n_trials=4)
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG  # the caller's verbosity is back
        path = plot_study(study, tmp_path / "report.png")
    finally:
        optuna.logging.set_verbosity(before)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == foreign_backend


def test_trials_draft_from_the_memory_but_never_from_the_prompts_own_answer(tmp_path, monkeypatch):
    """``tune --memory``: a trial's autolade runs draft from the remembered answers, except the timed
    prompt's own earlier answer (it would make any setting look fast); the tokens stay greedy's."""
    from tiny import tiny_llama

    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    model = tiny_llama()
    ids = torch.randperm(90, generator=torch.Generator().manual_seed(3))[:30].add(3).unsqueeze(0)
    cand = Candidate(LookaheadConfig(window=0, guesses=0, prompt_lookup=8, prompt_lookup_drafts=1), None)
    plain = Runner(model, max_new_tokens=60, eos=[])
    ref = plain.reference(0, ids).tokens
    _, _, alone, _ = plain.ours(0, ids, cand)
    assert alone.memory == "off"

    own = AnswerMemory()
    own.add(ref)  # an earlier run of this very prompt
    runner = Runner(model, max_new_tokens=60, eos=[], memory=own)
    _, n, stats, gap = runner.ours(0, ids, cand)  # exact (else ExactnessError), and nothing read from its own answer
    assert n == 60 and gap is None
    assert stats.memory.startswith("0 answers") and stats.accepted_by.get("memory", 0) == 0
    assert stats.steps == alone.steps

    other = AnswerMemory()
    other.add_many([ref, [7, 8, 9] + ref[12:]])  # another answer that shares this one's middle and end
    runner = Runner(model, max_new_tokens=60, eos=[], memory=other)
    _, n, stats, _ = runner.ours(0, ids, cand)
    assert n == 60 and stats.memory.startswith("1 answers")
    assert stats.accepted_by.get("memory", 0) > 0 and stats.steps < alone.steps
    assert len(other) == 2  # the store's memory itself is never changed


def test_own_answer_and_the_memory_study_name():
    assert own_answer([1, 2, 3, 4], [1, 2, 3, 4, 5]) and own_answer(list(range(40)), list(range(16)) + [99])
    assert not own_answer([9, 2, 3], [1, 2, 3]) and not own_answer([], [1, 2])
    plain, mem = study_name_for("cpu:x", "m", "float32", "code"), study_name_for("cpu:x", "m", "float32", "code", memory=True)
    assert mem != plain and "-memory-" in mem
