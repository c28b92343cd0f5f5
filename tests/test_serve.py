"""`autolade serve` as users run it: a real server process on a free port, called with the real
`openai` client (and raw HTTP for what the client cannot send). A tiny random Llama with a word-level
tokenizer for the fast tests; SmolLM2-135M with its own chat template for the slow one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
from conftest import MODEL_CACHE
from tiny import hf_greedy, tiny_llama_dir, word_tokenizer

from autolade.paths import ENV_VAR

openai = pytest.importorskip("openai")

NAME = "tiny"
PROMPTS = ["w5 w6 w7 w8 w5 w6", "w9 w10 w11", "w20 w21 w22 w20 w21", "w40 w41 w42 w43 w44"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(model: str, home: Path, *args: str, timeout: float = 240.0):
    """``autolade serve`` in its own process; yields the base URL once /health answers."""
    port = free_port()
    env = {**os.environ, ENV_VAR: str(home)}
    log = open(home / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "autolade", "serve", "--model", model, "--port", str(port), *args],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, (home / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start: " + (home / "serve.log").read_text()[-3000:]
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-home")
    model_dir = home / "tiny-model"
    model = tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    with server(str(model_dir), home, "--name", NAME) as base:
        yield base, model, word_tokenizer()


def client(base: str):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_lists_the_served_name(tiny_server):
    base, _, _ = tiny_server
    assert [m.id for m in client(base).models.list()] == [NAME]


def test_greedy_completion_is_hf_greedy_and_streaming_gives_the_same_text(tiny_server):
    base, model, tok = tiny_server
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    expected = tok.decode(hf_greedy(model, ids, 24), skip_special_tokens=True)
    c = client(base)
    done = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0)
    assert done.choices[0].text == expected
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 24
    assert done.model_extra["autolade"]["sampled"] is False and "source" in done.model_extra["autolade"]
    streamed = c.completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0, stream=True)
    parts = [chunk.choices[0].text for chunk in streamed if chunk.choices]
    assert "".join(parts) == expected and len([p for p in parts if p]) > 1  # text arrived step by step


def test_four_concurrent_clients_each_get_their_sequential_answer(tiny_server):
    base, _, _ = tiny_server
    c = client(base)
    alone = [c.completions.create(model=NAME, prompt=p, max_tokens=32, temperature=0).choices[0].text for p in PROMPTS]
    together: dict[int, str] = {}

    def ask(i: int) -> None:
        stream = i % 2 == 1  # half of them streaming
        r = client(base).completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=32, temperature=0, stream=stream)
        together[i] = "".join(ch.choices[0].text for ch in r if ch.choices) if stream else r.choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [together[i] for i in range(len(PROMPTS))] == alone


def test_a_compiled_server_builds_its_graph_before_serving_and_answers_as_hf_greedy(tmp_path):
    """`serve --compile`: the batched step's one graph is built before /health answers; concurrent clients'
    answers are HF's greedy decoding of each prompt alone."""
    model_dir = tmp_path / "tiny-model"
    model = tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    tok = word_tokenizer()
    with server(str(model_dir), tmp_path, "--name", NAME, "--compile") as base:
        log = (tmp_path / "serve.log").read_text()
        assert "compiling the batched step" in log and "compiled in" in log and "compiled steps" in log
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            answers[i] = client(base).completions.create(model=NAME, prompt=PROMPTS[i], max_tokens=24,
                                                         temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    for i, prompt in enumerate(PROMPTS):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert answers[i] == tok.decode(hf_greedy(model, ids, 24), skip_special_tokens=True), prompt


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(tiny_server):
    base, _, _ = tiny_server
    c = client(base)
    with pytest.raises(openai.NotFoundError) as err:
        c.completions.create(model="gpt-nothing", prompt="w5", max_tokens=4)
    assert err.value.body["code"] == "model_not_found"
    for bad in ({"max_tokens": 0}, {"n": 2}, {"logprobs": 2}, {"max_tokens": 10_000}):
        with pytest.raises(openai.BadRequestError) as err:
            c.completions.create(model=NAME, prompt="w5 w6", **bad)
        assert err.value.status_code == 400 and err.value.body["message"]
    raw = httpx.post(f"{base}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    no_template = httpx.post(f"{base}/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "w5"}]})
    assert no_template.status_code == 400 and "chat template" in no_template.json()["error"]["message"]
    assert c.completions.create(model=NAME, prompt="w5 w6", max_tokens=3, temperature=0).usage.completion_tokens == 3


def test_a_client_that_disconnects_frees_its_row(tiny_server):
    base, _, _ = tiny_server
    with httpx.stream("POST", f"{base}/v1/completions", timeout=60,
                      json={"model": NAME, "prompt": PROMPTS[1], "max_tokens": 400, "temperature": 0, "stream": True}) as r:
        next(r.iter_lines())  # the first chunk came: the decode is running; then hang up
    start = time.monotonic()
    done = client(base).completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=8, temperature=0)
    assert done.usage.completion_tokens == 8
    deadline = time.monotonic() + 30
    while httpx.get(f"{base}/health").json()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    health = httpx.get(f"{base}/health").json()
    assert health["in_flight"] == 0 and health["waiting"] == 0 and time.monotonic() - start < 60


def test_every_request_the_server_takes_gets_a_thread_of_its_own():
    """asyncio's default pool has min(32, cpus + 4) threads: request 33 (7 on 2 cores) would wait there
    behind a whole decode. RequestSlots runs every admitted request at once: 40 meet at a barrier."""
    import asyncio

    from autolade.serve.app import RequestSlots

    slots, meet = RequestSlots(40), threading.Barrier(40, timeout=20)

    async def all_at_once():
        for _ in range(40):
            slots.take()
        return await asyncio.gather(*(slots.run(meet.wait) for _ in range(40)))

    assert sorted(asyncio.run(all_at_once())) == list(range(40))  # every thread reached the barrier
    slots.take()  # and every slot is free again
    slots.pool.shutdown()
    with pytest.raises(ValueError, match="must be >= 1"):
        RequestSlots(0)


def test_past_its_rows_and_waiting_places_the_server_answers_503_and_serves_on(tmp_path):
    model_dir = tmp_path / "tiny-model"
    tiny_llama_dir(model_dir, tokenizer=word_tokenizer(), max_positions=16384)  # room for a decode that outlasts the test
    with server(str(model_dir), tmp_path, "--name", NAME, "--max-batch", "1", "--max-waiting", "1") as base:
        body = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 16000, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json=body) as first, \
                httpx.stream("POST", f"{base}/v1/completions", timeout=60, json=body) as second:
            lines = first.iter_lines()  # kept: a dropped line iterator closes the connection (the client left)
            next(lines)  # decoding in the one row
            assert second.status_code == 200  # the one waiting place
            with pytest.raises(openai.InternalServerError) as err:
                client(base).completions.create(model=NAME, prompt="w5 w6", max_tokens=3, temperature=0)
            assert err.value.status_code == 503 and err.value.body["code"] == "server_busy"
            assert "--max-waiting" in err.value.body["message"]
        deadline = time.monotonic() + 30  # both clients hung up: their rows and slots free up
        while httpx.get(f"{base}/health").json()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.1)
        retrying = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=3, timeout=120)  # a slot frees as its thread ends
        assert retrying.completions.create(model=NAME, prompt="w5 w6", max_tokens=3, temperature=0).usage.completion_tokens == 3
        assert httpx.get(f"{base}/health").json()["waiting"] == 0, "the waiting client hung up: its job never ran"


def test_sampling_with_a_seed_repeats(tiny_server):
    base, _, _ = tiny_server
    c = client(base)
    runs = [c.completions.create(model=NAME, prompt=PROMPTS[3], max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
            for _ in range(2)]
    assert runs[0].choices[0].text == runs[1].choices[0].text
    assert runs[0].model_extra["autolade"]["sampled"] is True


def test_answers_remembered_before_a_kill_are_kept(tmp_path):
    """kill -9 right after the answers: memory.db passes integrity_check and holds every answer."""
    import signal
    import sqlite3

    model_dir = tmp_path / "tiny-model"
    tiny_llama_dir(model_dir, tokenizer=word_tokenizer())
    with server(str(model_dir), tmp_path, "--name", NAME) as base:
        c = client(base)
        for p in PROMPTS[:3]:
            c.completions.create(model=NAME, prompt=p, max_tokens=6, temperature=0)
        pid = int(subprocess.run(["pgrep", "-f", "--", f"--port {base.rsplit(':', 1)[1]}"], capture_output=True, text=True).stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
    db = sqlite3.connect(tmp_path / "memory.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM memory").fetchone()[0] == 3
    finally:
        db.close()


@pytest.mark.slow
def test_greedy_chat_on_smollm2_is_model_generate(smollm2, tmp_path):
    model, tok = smollm2
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False)
    expected = tok.decode(ref[0, ids.shape[1]:], skip_special_tokens=True)
    (tmp_path / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    with server("smollm2-135m", tmp_path) as base:
        c = client(base)
        done = c.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=48, temperature=0)
        streamed = c.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=48, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
        chunks = list(streamed)
    assert done.choices[0].message.content == expected
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == expected
    assert chunks[-1].usage.completion_tokens == done.usage.completion_tokens
