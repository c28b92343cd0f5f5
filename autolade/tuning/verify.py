"""Timing a predicted setting against HF greedy and HF prompt lookup on held-out prompts
(``autolade profile --verify N``), through the tuner's measuring harness."""

from __future__ import annotations

from typing import Any

from autolade.errors import ProfileError
from autolade.runtime.predict import policy_spec


def measure_holdout(model: Any, tokenizer: Any, *, workload: str, config: Any, policy: dict | None, prompts: int,
                    max_new_tokens: int, cost: Any = None) -> tuple[float, float]:
    """(speedup over HF greedy, over HF prompt lookup) of one setting on ``prompts`` held-out prompts,
    timed through the tuner's measuring harness (the one import to re-point when it moves)."""
    from autolade.machine.models import eos_ids
    from autolade.tuning.trials import Candidate, Runner, measure
    from autolade.workloads import HOLDOUT_FRACTION, encode_prompt, load_workload, split_workload

    held = split_workload(load_workload(workload), holdout_fraction=HOLDOUT_FRACTION)[1][:prompts]
    if not held:
        raise ProfileError(f"workload {workload!r} has no held-out prompts to verify on")
    ids = [encode_prompt(tokenizer, p.text, kind=p.kind) for p in held]
    runner = Runner(model, max_new_tokens=max_new_tokens, eos=eos_ids(model), cost=cost)
    m = measure(runner, ids, Candidate(config, policy), pld=True, offset=10_000)
    return m.ratio(), m.ratio(m.pld_s)


def verify_prediction(model: Any, tokenizer: Any, *, workload: str, prediction: Any, prompts: int,
                      max_new_tokens: int = 64, cost: Any = None, measure_fn: Any = None) -> tuple[bool, float, float]:
    """(holds, speedup, vs prompt lookup): whether the predicted setting measured at least greedy's
    speed (>= 1.0x) on ``prompts`` held-out prompts. Greedy itself always holds (1.0x, unmeasured)."""
    if prediction.setting.greedy:
        return True, 1.0, float("nan")
    fn = measure_fn or measure_holdout
    speedup, vs_pld = fn(model, tokenizer, workload=workload, config=prediction.setting.config,
                         policy=policy_spec(prediction.setting), prompts=prompts, max_new_tokens=max_new_tokens, cost=cost)
    return speedup >= 1.0, speedup, vs_pld
