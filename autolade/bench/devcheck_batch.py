"""The device check's ``batch`` section (``devcheck.DeviceCheck``): batched lookahead on the machine, eager and
compiled, which is what ``autolade serve`` runs.

Per model: ``batch_rows`` held-out MT-Bench prompts, left-padded into one batch. Exactness: every row of
``autolade.generate`` on the batch, eager and compiled (one dynamic graph, ``engine.batch_compiled``), against HF
greedy on that row alone, token for token (a flip only within the noise gap). The compiled run's warm-up and graph
count. Then, interleaved, ``bench_repeats`` times (fastest kept): HF ``generate`` on the padded batch, greedy, and
autolade's batch eager and compiled; HF on a ``StaticCache`` with its compiled forward (``hf-static``) last, where
the time box leaves room for its compile. Total new tokens per second and each arm's ratio to HF's padded batch.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch


def batch_section(check: Any, record: dict[str, Any], deadline: float) -> None:
    from autolade.bench.padding import padded
    from autolade.bench.run import load_sets
    from autolade.machine.models import eos_ids
    from autolade.tuning.harness import divergence, greedy_reference, noise_gap
    from autolade.workloads import encode_prompt

    sizes = check.sizes
    record["models"] = {}
    for name in sizes.batch_models:
        if time.monotonic() > deadline:
            record.setdefault("skipped", []).append(f"{name}: time box")
            continue
        model, tok = check.model(name, sizes.batch_dtype)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos = eos_ids(model)
        prompts = load_sets(["chat"], limit=sizes.batch_rows, heldout=True)["chat"]
        rows = [encode_prompt(tok, p.text, kind=p.kind).to(model.device) for p in prompts]
        ids, mask = padded(rows, pad)
        n = sizes.batch_tokens
        out: dict[str, Any] = {"dtype": sizes.batch_dtype, "rows": len(rows), "prompt_tokens": [r.shape[1] for r in rows]}
        record["models"][name] = out
        refs = [greedy_reference(model, r, max_new_tokens=n) for r in rows]

        run = partial(run_arm, model=model, ids=ids, mask=mask, n=n, pad=pad, eos=eos)
        for arm in ("eager", "compiled"):  # the first compiled run builds the graph: its time is the warm-up
            got, seconds, res = run(arm)
            divs = [divergence(ref.tokens, g[: len(ref.tokens)], ref) for ref, g in zip(refs, got)]
            out[arm] = {
                "exact_rows": sum(d is None for d in divs),
                "within_noise": all(d is None or d.within_noise(noise_gap(model.dtype)) for d in divs),
                "diverged_at": [None if d is None else d.index for d in divs],
                "first_run_s": round(seconds, 2),
                "tokens_per_step": round(res.batch.new_tokens / max(res.batch.steps, 1), 2),
            }
            if arm == "compiled":
                out[arm]["compiled"] = res.stats[0].compiled
            check.write()
        out["all_exact"] = all(out[arm]["within_noise"] for arm in ("eager", "compiled"))
        if time.monotonic() > deadline:
            record.setdefault("skipped", []).append(f"{name}: timing, time box")
            continue
        arms = ["hf", "eager", "compiled"]
        best: dict[str, float] = {}
        tokens: dict[str, int] = {}
        for _ in range(sizes.bench_repeats):
            for arm in arms:
                got, seconds, _ = run(arm)
                best[arm], tokens[arm] = min(best.get(arm, seconds), seconds), sum(len(g) for g in got)
        if time.monotonic() < deadline - 0.5 * sizes.budget_s.get("batch", 60):  # room for HF's compile
            run("hf-static")  # builds its graph (this batch size), untimed
            got, seconds, _ = run("hf-static")
            best["hf-static"], tokens["hf-static"] = seconds, sum(len(g) for g in got)
        else:
            record.setdefault("skipped", []).append(f"{name}: hf-static, time box")
        out["tokens_per_s"] = {arm: round(tokens[arm] / best[arm], 2) for arm in best}
        out["over_hf"] = {arm: round(out["tokens_per_s"][arm] / out["tokens_per_s"]["hf"], 3) for arm in best if arm != "hf"}
        check.write()


def run_arm(arm: str, *, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, n: int, pad: int,
            eos: list[int]) -> tuple[list[list[int]], float, Any]:
    """One timed run of ``arm`` (hf, hf-static, eager, compiled) on the padded batch: each row's new tokens, the
    seconds (``harness.TIMER``: the device synchronised around the call), and autolade's result (None for HF)."""
    from autolade.api import generate
    from autolade.bench.padding import new_rows
    from autolade.tuning.harness import TIMER, static_kwargs

    def call():
        with torch.inference_mode():
            if arm.startswith("hf"):
                extra = static_kwargs(model, ids.shape[1] + n) if arm == "hf-static" else {}
                return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=pad,
                                      **extra), None
            res = generate(model, ids, attention_mask=mask, max_new_tokens=n, memory=False, pad_token_id=pad,
                           compile=arm == "compiled")  # fmt: skip
            return res.sequences, res

    (seq, res), seconds = TIMER(model.device, call)
    return new_rows(seq, ids.shape[1], eos), seconds, res
