"""Load test of `autolade serve`: C concurrent clients stream MT-Bench (chat) and HumanEval (completion)
prompts through the `openai` client; requests/s, tokens/s and time to first token, for the server with
lookahead on and with `--plain` (lookahead off), and with `--peers transformers,transformers-cb`,
`transformers serve` on the same model (plain, and with its continuous batching). Every server is
started here as its own process on a free port before the first cell, and the modes take turns at each
client count (the order flips from one count to the next), so drift hits them alike.

    python3 tools/serve_bench.py --model smollm2-135m --dtype bfloat16 --clients 1,2,4,8 --prompts 8 -o out/serve-bench

Writes OUT.json after every (mode, clients) cell and prints a markdown table. Greedy (temperature 0).
Requests go to 127.0.0.1 only; every loop is bounded by --prompts and --max-minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai

from autolade.workloads import HOLDOUT_FRACTION, load_workload, split_workload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PEERS = ("transformers", "transformers-cb")  # `transformers serve`, without and with --continuous-batching


@functools.cache
def local_dir(model: str, dtype: str) -> str:
    """The local HF directory autolade resolves ``model`` to (converted once; no hub access needed), for the
    peers that take a path. Loads the model once per run to find it; the weights are freed on return."""
    from autolade.api import load

    return load(model, dtype=dtype)[0].name_or_path


def command(mode: str, model: str, dtype: str, port: int) -> tuple[list[str], str]:
    """The server's command line and the model name its clients pass."""
    if mode in PEERS:
        path = local_dir(model, dtype)
        cb = ["--continuous-batching"] if mode == "transformers-cb" else []
        return ["transformers", "serve", path, "--dtype", dtype, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", *cb], path
    cmd = [sys.executable, "-m", "autolade", "serve", "--model", model, "--dtype", dtype, "--port", str(port), "--no-memory"]
    return cmd + (["--plain"] if mode == "plain" else []), model


def start(mode: str, model: str, dtype: str, log: Path) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    cmd, name = command(mode, model, dtype, port)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"server exited: see {log}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base, name
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"server did not start in time: see {log}")


def one(client: openai.OpenAI, model: str, kind: str, text: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    first = None
    usage = None
    if kind == "chat":
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter() - start
            usage = chunk.usage or usage
    else:
        stream = client.completions.create(model=model, prompt=text, max_tokens=max_tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - start
            usage = chunk.usage or usage
    return {"seconds": time.perf_counter() - start, "ttft": first, "tokens": usage.completion_tokens if usage else 0}


def cell(base: str, model: str, prompts: list[tuple[str, str]], clients: int, max_tokens: int) -> dict:
    """All prompts, ``clients`` at a time (each client takes the next prompt when its last one ends)."""
    todo = list(prompts)
    lock = threading.Lock()
    done: list[dict] = []

    def worker() -> None:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=600)
        while True:
            with lock:
                if not todo:
                    return
                kind, text = todo.pop(0)
            r = one(c, model, kind, text, max_tokens)
            with lock:
                done.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in done)
    ttfts = [r["ttft"] for r in done if r["ttft"] is not None]
    return {"clients": clients, "requests": len(done), "wall_s": round(wall, 3), "requests_per_s": round(len(done) / wall, 4),
            "tokens_per_s": round(tokens / wall, 2), "tokens": tokens,
            "ttft_median_s": round(statistics.median(ttfts), 3) if ttfts else None,
            "ttft_max_s": round(max(ttfts), 3) if ttfts else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--clients", default="1,2,4,8", help="comma-separated concurrency levels")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per set (chat and code)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-minutes", type=float, default=30.0, help="start no new cell after this")
    ap.add_argument("--peers", default="", help=f"also time these servers: {', '.join(PEERS)} (comma-separated)")
    ap.add_argument("-o", "--out", default="out/serve-bench")
    args = ap.parse_args(argv)
    prompts = []
    for name, kind in (("chat", "chat"), ("code", "code")):
        held = split_workload(load_workload(name), holdout_fraction=HOLDOUT_FRACTION)[1][: args.prompts]
        prompts += [(kind, p.text) for p in held]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"model": args.model, "dtype": args.dtype, "max_tokens": args.max_tokens, "prompts": len(prompts),
               "command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])]), "cells": []}
    modes = ["lookahead", "plain", *[p for p in args.peers.split(",") if p]]
    if unknown := [m for m in modes[2:] if m not in PEERS]:
        ap.error(f"unknown peer {unknown[0]!r}: choose from {', '.join(PEERS)}")
    servers: dict[str, tuple[subprocess.Popen, str, str]] = {}
    try:
        for mode in modes:
            servers[mode] = start(mode, args.model, args.dtype, out.with_suffix(f".{mode}.log"))
            _, base, name = servers[mode]
            one(openai.OpenAI(base_url=f"{base}/v1", api_key="unused"), name, *prompts[0], 8)  # warm-up
        began = time.perf_counter()
        for turn, clients in enumerate(int(c) for c in args.clients.split(",")):
            for mode in modes if turn % 2 == 0 else modes[::-1]:
                if time.perf_counter() - began > 60 * args.max_minutes:
                    results["stopped_early"] = f"time budget of {args.max_minutes} min reached"
                    break
                _, base, name = servers[mode]
                row = {"mode": mode, **cell(base, name, prompts, clients, args.max_tokens)}
                results["cells"].append(row)
                out.with_suffix(".json").write_text(json.dumps(results, indent=1))
                print(json.dumps(row), flush=True)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    print("| mode | clients | requests/s | tokens/s | TTFT median s | TTFT max s |\n|---|---:|---:|---:|---:|---:|")
    for r in results["cells"]:
        print(f"| {r['mode']} | {r['clients']} | {r['requests_per_s']} | {r['tokens_per_s']} | {r['ttft_median_s']} | {r['ttft_max_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
