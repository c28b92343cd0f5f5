"""Rows of a compiled batch against HF greedy on each prompt alone: where a row differs, the reference's top-2
logit gap there (a bf16 tie is a gap of 0 or one bf16 step).

    python3 tools/batch_ties.py smollm2-135m

8 held-out prompts per set (MT-Bench chat, HumanEval code) in groups of 4, settings as generate() picks them
(memory off), 96 new tokens, bf16, through the compiled batched step (one graph, built on the first group).
"""
import sys

import autolade
from autolade.bench.run import load_sets
from autolade.compiling import default_runners
from autolade.engine.batch import RowRequest, decode_batch
from autolade.machine.models import eos_ids
from autolade.prepare import setup_run
from autolade.runtime.settings import stored_cost
from autolade.tuning.harness import divergence, greedy_reference
from autolade.workloads import encode_prompt

name = sys.argv[1]
model, tok = autolade.load(name, dtype="bfloat16")
eos = eos_ids(model)
runner = default_runners().batch(model)
for wl in ("chat", "code"):
    prompts = [encode_prompt(tok, p.text, kind=p.kind) for p in load_sets([wl], limit=8, heldout=True)[wl]]
    run = setup_run(model, window=None, ngram=None, guesses=None, config=None, policy=None, workload=wl, tokenizer=tok,
                    sampled=False, memory=False, pad_single=False, memory_default=False, compile=True)
    for g in range(0, 8, 4):
        group = prompts[g:g + 4]
        done, _ = decode_batch(model, [RowRequest(prompt=p[0].tolist(), config=run.config, max_new_tokens=96, eos_ids=eos,
                                                  recycled=run.recycled, token_cost=run.token_cost) for p in group],
                               step_cost=stored_cost(model, compiled=True), runner=runner)
        for j, (p, row) in enumerate(zip(group, done)):
            ref = greedy_reference(model, p, max_new_tokens=96, eos=eos, keep_logits=True)
            d = divergence(ref.tokens, row.out, ref)
            print(wl, g + j, "equal" if d is None else f"diverged at {d.index}: top-2 gap {d.gap_top2}, chosen gap {d.gap_chosen}", flush=True)
