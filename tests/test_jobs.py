"""Batch jobs (autolade/serve/jobs.py) and `autolade batch`: a file of requests decoded together, resumable."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from tiny import hf_greedy, tiny_llama, tiny_llama_dir, word_tokenizer

from autolade.cli.main import cli
from autolade.serve.jobs import BatchJob, JobError, answered, digest, read_job
from autolade.serve.worker import ModelServer

PROMPTS = ["w5 w6 w7 w8 w5 w6", "w9 w10 w11", "w20 w21 w22 w20 w21", "w40 w41 w42 w43 w44", "w3 w4 w3 w4 w3"]


def write_lines(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs), encoding="utf-8")
    return path


def records(path) -> dict[int, dict]:
    out = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(raw)
        assert r["line"] not in out, f"line {r['line']} answered twice"
        out[r["line"]] = r
    return out


@pytest.fixture(scope="module")
def served():
    model, tok = tiny_llama(), word_tokenizer()
    return model, tok, ModelServer(model, tok, name="tiny", max_batch=2, memory=False)


def expected(model, tok, prompt: str, n: int) -> str:
    return tok.decode(hf_greedy(model, tok(prompt, return_tensors="pt").input_ids, n), skip_special_tokens=True)


def test_lines_of_every_kind_are_read_with_the_job_defaults(tmp_path):
    path = write_lines(tmp_path / "in.jsonl", [
        {"prompt": "w5 w6"},
        "",
        {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "max_tokens": 9},
        {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "w7"}},
        "{not json",
        {"custom_id": 7, "url": "/v1/embeddings", "body": {"input": "x"}},
    ])  # fmt: skip
    lines = read_job(path, temperature=0.0, max_tokens=5)
    assert [line.line for line in lines] == [1, 3, 4, 5, 6]  # the blank line is skipped, numbers stay the file's
    first, chat, batch_api, bad, wrong_url = lines
    assert not first.chat and first.body == {"prompt": "w5 w6", "temperature": 0.0, "max_tokens": 5}
    assert chat.chat and chat.body["temperature"] == 0.7 and chat.body["max_tokens"] == 9  # its own values win
    assert batch_api.custom_id == "a" and not batch_api.chat and batch_api.body["prompt"] == "w7"
    assert bad.error is not None and "line 5 is not valid JSON" in bad.error.message
    assert wrong_url.custom_id == "7" and "'url' must be" in wrong_url.error.message
    assert first.digest == digest(json.dumps({"prompt": "w5 w6"}))

    text = tmp_path / "in.txt"
    text.write_text("first prompt\n\nsecond one\n", encoding="utf-8")
    assert [(line.line, line.body["messages"][0]["content"]) for line in read_job(text)] == [(1, "first prompt"), (3, "second one")]
    # what a job asks for in all, weighed against a compiled graph's warm-up: 5 + 9 + 5, the bad lines not counted;
    # a line that names no max_tokens gets the API's default
    from autolade.serve.jobs import job_tokens
    from autolade.serve.requests import DEFAULT_MAX_TOKENS

    assert job_tokens(lines) == 19
    assert job_tokens(read_job(text)) == 2 * DEFAULT_MAX_TOKENS


def test_an_empty_or_missing_input_is_refused_with_what_to_give(tmp_path):
    with pytest.raises(JobError, match="holds no requests"):
        read_job(write_lines(tmp_path / "empty.jsonl", ["", "  "]))
    with pytest.raises(JobError, match="cannot read the input"):
        read_job(tmp_path / "missing.jsonl")


def test_a_job_answers_every_line_as_hf_greedy_and_refuses_bad_lines_alone(served, tmp_path):
    model, tok, server = served
    bodies = [{"prompt": p, "max_tokens": 12} for p in PROMPTS]
    bodies.insert(2, {"messages": [{"role": "user", "content": "w5"}]})  # the tiny tokenizer has no chat template
    bodies.append({"prompt": "w5", "n": 3})
    path = write_lines(tmp_path / "in.jsonl", bodies)
    out = tmp_path / "out.jsonl"
    summary = BatchJob(server, read_job(path), out, workers=4).run()
    assert (summary.lines, summary.answered, summary.errors, summary.skipped) == (7, 5, 2, 0)
    got = records(out)
    assert set(got) == set(range(1, 8))
    for number, prompt in zip([1, 2, 4, 5, 6], PROMPTS):
        r = got[number]["response"]
        assert r["text"] == expected(model, tok, prompt, 12), number
        assert r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 12 and r["autolade"]["sampled"] is False
    assert "no chat template" in got[3]["error"]["message"]
    assert got[7]["error"]["param"] == "n"

    again = BatchJob(server, read_job(path), out, workers=4).run()  # everything is there: nothing runs again
    assert (again.skipped, again.answered, again.errors) == (7, 0, 0)
    assert len(out.read_text().splitlines()) == 7


def test_an_interrupted_job_resumes_where_it_stopped(served, tmp_path):
    model, tok, server = served
    path = write_lines(tmp_path / "in.jsonl", [{"prompt": p, "max_tokens": 10} for p in PROMPTS])
    out = tmp_path / "out.jsonl"
    job = BatchJob(server, read_job(path), out, workers=1)
    job.run(progress=lambda s: job.stop.set())  # stops after the first record: the rest are dropped or never start
    first = records(out)
    assert 1 <= len(first) < len(PROMPTS)
    with out.open("a") as f:
        f.write('{"line": 5, "custom_id": null, "input_')  # a record cut off by a kill
    resumed = BatchJob(server, read_job(path), out, workers=4).run()
    assert resumed.skipped == len(first) and resumed.answered == len(PROMPTS) - len(first)
    got = records(out)
    assert set(got) == set(range(1, 6))
    assert all(got[i + 1]["response"]["text"] == expected(model, tok, p, 10) for i, p in enumerate(PROMPTS))


def test_an_output_of_another_input_is_refused_and_a_fixed_line_runs_again(tmp_path):
    lines = read_job(write_lines(tmp_path / "in.jsonl", [{"prompt": "w5"}, {"prompt": "w6"}]))
    out = tmp_path / "out.jsonl"
    write_lines(out, [{"line": 1, "input_sha": lines[0].digest, "response": {"text": "x"}},
                      {"line": 2, "input_sha": "0" * 16, "error": {"type": "invalid_request_error"}}])  # fmt: skip
    assert answered(out, lines) == {1}  # line 2 was refused as it read before; it has changed since: it runs
    write_lines(out, [{"line": 2, "input_sha": lines[1].digest, "error": {"type": "server_error"}}])
    assert answered(out, lines) == set()  # a fault of the machine is retried
    write_lines(out, [{"line": 1, "input_sha": "f" * 16, "response": {"text": "x"}}])
    with pytest.raises(JobError, match="answers another input"):
        answered(out, lines)
    write_lines(out, ["[1, 2]"])
    with pytest.raises(JobError, match="not a record of autolade batch"):
        answered(out, lines)


def test_the_batch_command_writes_its_output_and_resumes(tmp_path):
    model_dir = tmp_path / "tiny-model"
    model = tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    path = write_lines(tmp_path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS[:3]])
    args = ["batch", str(path), "--model", str(model_dir), "--max-batch", "2", "--max-tokens", "8", "--no-compile"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    out = tmp_path / "prompts.out.jsonl"
    got = records(out)
    tok = word_tokenizer()
    assert [got[i + 1]["response"]["text"] for i in range(3)] == [expected(model, tok, p, 8) for p in PROMPTS[:3]]
    assert "3 answered, 0 refused" in res.output
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0 and "3 already in" in res.output and "0 answered" in res.output
    res = CliRunner().invoke(cli, [*args, "--overwrite"])
    assert res.exit_code == 0 and "3 answered" in res.output and len(out.read_text().splitlines()) == 3


def test_the_batch_command_refuses_bad_input_before_loading_a_model(tmp_path):
    res = CliRunner().invoke(cli, ["batch", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 1 and "cannot read the input" in res.output and "Traceback" not in res.output
    path = write_lines(tmp_path / "in.jsonl", [{"prompt": "w5"}])
    res = CliRunner().invoke(cli, ["batch", str(path), "-o", str(path)])
    assert res.exit_code != 0 and "would overwrite the input" in res.output
    res = CliRunner().invoke(cli, ["batch", str(path), "--temperature", "3"])
    assert res.exit_code == 2 and "--temperature" in res.output


def test_ctrl_c_stops_the_command_with_what_finished_kept_and_a_rerun_completes(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    model_dir = tmp_path / "tiny-model"
    tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    path = write_lines(tmp_path / "many.jsonl", [{"prompt": f"w{5 + i % 80} w6 w7", "max_tokens": 40} for i in range(400)])
    out = tmp_path / "many.out.jsonl"
    cmd = [sys.executable, "-m", "autolade", "batch", str(path), "--model", str(model_dir), "--max-batch", "2", "--no-compile"]
    # SIGINT as a terminal's Ctrl-C delivers it: a shell's background job (CI under `&`, nohup) starts its children
    # with SIGINT ignored, and a Python started so never raises KeyboardInterrupt
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else "no record"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "interrupted" in text and "run the same command again to resume" in text, text
    assert "Traceback" not in text
    kept = records(out)
    assert 2 <= len(kept) < 400
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(kept)} already in" in done.stderr and set(records(out)) == set(range(1, 401))


@pytest.mark.slow
def test_mt_bench_prompts_in_a_txt_file_are_model_generate_on_smollm2(smollm2, tmp_path):
    import torch

    from autolade.bench.run import load_sets

    model, tok = smollm2
    prompts = [p.text.replace("\n", " ") for p in load_sets(["chat"], limit=3, heldout=True)["chat"]]
    path = tmp_path / "questions.txt"
    path.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    out = tmp_path / "answers.jsonl"
    server = ModelServer(model, tok, name="smollm2-135m", max_batch=3, memory=False, compile=False)
    summary = BatchJob(server, read_job(path, max_tokens=40), out, workers=6).run()
    assert (summary.answered, summary.errors) == (3, 0)
    got = records(out)
    for number, prompt in enumerate(prompts, start=1):
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
        assert got[number]["response"]["text"] == tok.decode(ref[0, ids.shape[1] :], skip_special_tokens=True), number
        assert got[number]["response"]["usage"]["prompt_tokens"] == ids.shape[1]
