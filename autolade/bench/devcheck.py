"""The prepared device check (``tools/gpu_check.py``): one run that tells whether autolade's GPU
path works on a machine, and how fast, written to one folder as it goes.

Sections, in order, each with a time box (checked between units of work: a unit that starts in
time runs to its end) and each recorded on its own: a section that fails or runs out of time says
so in ``gpu_check.json`` and the next one still runs. The JSON is rewritten after every unit, so a
run killed from outside leaves what it had.

1. ``environment``: versions, the hardware profile (NVML on a GPU), flash-attn, the attention plan.
2. ``exactness``: per model and dtype, HF greedy vs autolade's window, pool, prompt lookup and
   adaptive policy, token for token (a flip counts only where the reference's top-2 gap is inside
   ``harness.noise_gap``), the measured packed-vs-one-token logit noise that tolerance must cover,
   and ``res.stats``' forward vs per-step Python overhead.
3. ``curve``: the step curve c(k) (``curve.png``), up to k=256 on a GPU.
4. ``settings``: what the shipped acceptance tables predict on that curve, and what generate()
   would pick with no settings.
5. ``bench``: HF greedy, HF prompt lookup and autolade side by side on chat and code
   (``bench.json`` / ``bench.png``, the ``autolade bench`` format).
6. ``compiled``: the compiled step (``devcheck_compiled``): exactness, its curve next to the eager one,
   and HF eager / HF static-cache compiled / autolade eager / autolade compiled on SmolLM2 and a 1.5B.
7. ``batch``: batched lookahead (``devcheck_batch``), what ``autolade serve`` runs: every row of a padded batch,
   eager and compiled, against HF greedy on the row alone, and HF's padded batch / autolade's batch eager and
   compiled / HF's static-cache compiled batch side by side.

``--device cpu --quick`` runs the same code at toy sizes, so CI keeps it working.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "autolade-gpu-check/1"
WORKLOADS = ("chat", "code")


@dataclass(frozen=True, kw_only=True)
class CheckSizes:
    """How much each section does, and its time box in seconds."""

    models: tuple[str, ...] = ("smollm2-135m", "gemma3-270m")  # registry names (models.MODELS)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # exactness runs each
    bench_dtype: str = "bfloat16"  # the curve, the prediction and the bench run in this one
    workloads: tuple[str, ...] = ("chat", "code")  # prompt sets of the exactness and bench sections
    prompts: int = 1  # exactness prompts per workload
    max_new_tokens: int = 64  # exactness
    methods: tuple[tuple[str, str], ...] = (  # exactness: (name, parse_method spec)
        ("window", "8,5,0,0"),
        ("pool", "8,5,8,0"),
        ("lookup", "0,4,0,10"),
        ("adaptive", "8,5,8,10,policy=adaptive"),
    )
    curve_ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)  # c(k) points
    curve_contexts: tuple[int, ...] = (512,)  # KV lengths the curve is measured at
    curve_repeats: int = 5  # median of this many
    bench_prompts: int = 3  # per workload, held-out split
    bench_tokens: int = 128  # per bench run
    bench_repeats: int = 2  # timed runs per prompt and method, fastest kept: on CUDA the first run through
    # new shapes pays cuDNN's attention-plan building (H200, 2026-12-04: up to 3x, every method alike)
    compiled_models: tuple[str, ...] = ("smollm2-135m", "qwen2.5-coder-1.5b")  # the compiled section's models
    compiled_dtype: str = "bfloat16"
    compiled_spec: str = "4,4,4,10"  # the lookahead setting run eager and compiled
    compiled_buckets: tuple[int, ...] | None = None  # None: engine.compiled.BUCKETS
    compiled_capacity: int = 1024  # the static cache's tokens
    compiled_prompts: int = 2  # MT-Bench held-out prompts per model (exactness and bench)
    compiled_tokens: int = 128
    batch_models: tuple[str, ...] = ("smollm2-135m",)  # the batch section's models
    batch_dtype: str = "bfloat16"
    batch_rows: int = 4  # held-out MT-Bench prompts decoded together (at least 2)
    batch_tokens: int = 96
    budget_s: dict[str, float] = field(  # time box per section
        default_factory=lambda: {"environment": 20, "exactness": 100, "curve": 40, "settings": 20, "bench": 80,
                                 "compiled": 200, "batch": 70}
    )


def sizes_for(device_type: str, *, quick: bool) -> CheckSizes:
    """Full sizes on a GPU (under 9 minutes with the model conversions); toy sizes with ``quick``."""
    if not quick:
        return CheckSizes()
    return CheckSizes(
        workloads=("code",), prompts=1, max_new_tokens=16,
        methods=(("window", "4,4,0,0"), ("pool", "4,4,4,0"), ("lookup", "0,4,0,10"), ("adaptive", "4,4,4,10,policy=adaptive")),
        curve_ks=(1, 2, 4, 8, 16, 32), curve_contexts=(64,), curve_repeats=2,
        bench_prompts=1, bench_tokens=16, bench_repeats=1,
        compiled_models=("smollm2-135m",), compiled_dtype="float32", compiled_spec="0,4,0,10", compiled_buckets=(32,),
        compiled_capacity=256, compiled_prompts=1, compiled_tokens=16,
        batch_dtype="float32", batch_rows=2, batch_tokens=16,
        budget_s={"environment": 20, "exactness": 240, "curve": 60, "settings": 20, "bench": 120, "compiled": 300,
                  "batch": 300},
    )  # fmt: skip


class _NoStore:
    """The check reads shipped acceptance tables only: it never creates or writes the user's store."""

    def find_acceptance(self, **_key: Any) -> None:
        return None


class DeviceCheck:
    """One run of the check into ``out`` (see the module doc)."""

    def __init__(self, *, out: str | Path, device: str, sizes: CheckSizes, log: Callable[[str], None] = print) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.sizes = sizes
        self.log = log
        self.result: dict[str, Any] = {"format": FORMAT, "device": device, "sizes": asdict(sizes), "sections": {}}
        self._models: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._curve_value: Any = None  # the step curve, once measured
        self._predicted: dict[str, tuple[Any, str | None]] = {}

    @property
    def path(self) -> Path:
        return self.out / "gpu_check.json"

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1, default=str), encoding="utf-8")
        tmp.replace(self.path)

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        for name in ("environment", "exactness", "curve", "settings", "bench", "compiled", "batch"):
            self.section(name, getattr(self, f"_{name}"))
        self.result["total_s"] = round(time.monotonic() - started, 1)
        self.result["ok"] = all(s["status"] == "ok" for s in self.result["sections"].values())
        self.result["exact"] = self.result["sections"]["exactness"].get("all_exact")
        self.write()
        return self.result

    def section(self, name: str, fn: Callable[[dict[str, Any], float], None]) -> None:
        budget = float(self.sizes.budget_s.get(name, 60))
        record: dict[str, Any] = {"status": "running", "budget_s": budget}
        self.result["sections"][name] = record
        self.write()
        t0 = time.monotonic()
        self.log(f"== {name} (time box {budget:.0f} s)")
        try:
            fn(record, t0 + budget)
            record["status"] = "ok" if not record.get("skipped") else "partial"
        except Exception as exc:  # recorded, and the next section still runs
            record["status"] = "failed"
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc(limit=6)
            self.log(f"   failed: {record['error']}")
        record["seconds"] = round(time.monotonic() - t0, 2)
        self.write()

    def model(self, name: str, dtype: str) -> tuple[Any, Any]:
        from autolade.machine.models import load

        key = (name, dtype)
        if key not in self._models:
            self._models = {k: v for k, v in self._models.items() if k[0] == name}  # keep one model's dtypes at most
            self._models[key] = load(name, dtype=dtype, device=self.device)
        return self._models[key]

    # --- sections -----------------------------------------------------------------------------

    def _environment(self, record: dict[str, Any], deadline: float) -> None:
        import platform

        import transformers

        from autolade.engine.attention import flash_attn_installed, load_implementation, plan_attention
        from autolade.machine.hardware import probe_hardware

        hw = probe_hardware(device=self.device, quick=True)
        device_type = torch.device(self.device).type
        cc = torch.cuda.get_device_capability(self.device) if device_type == "cuda" else None
        flash = flash_attn_installed()
        record.update(
            python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
            cuda_runtime=torch.version.cuda, flash_attn_installed=flash, hardware=hw.to_dict(),
            hardware_summary=hw.summary().splitlines(),
        )  # fmt: skip
        plans = {}
        for dtype in (*self.sizes.dtypes, self.sizes.bench_dtype):
            torch_dtype = _torch_dtype(dtype)
            # what autolade.load gives this dtype here (None: transformers' default, sdpa)
            loaded = load_implementation(device_type=device_type, dtype=torch_dtype, flash_installed=flash,
                                         compute_capability=cc) or "sdpa"
            plan = plan_attention(device_type=device_type, dtype=torch_dtype, flash_installed=flash, loaded=loaded,
                                  compute_capability=cc)
            plans[dtype] = plan.to_dict()
        record["attention_plans"] = plans

    def _exactness(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.bench.run import load_sets
        from autolade.config import parse_method
        from autolade.tuning.harness import divergence, greedy_reference, noise_gap, run_autolade
        from autolade.workloads import encode_prompt

        sizes = self.sizes
        results: list[dict[str, Any]] = []
        record["runs"] = results
        noise: list[dict[str, Any]] = []
        record["noise"] = noise
        for model_name in sizes.models:
            for dtype in sizes.dtypes:
                if time.monotonic() > deadline:
                    record.setdefault("skipped", []).append(f"{model_name} {dtype}: time box")
                    continue
                model, tok = self.model(model_name, dtype)
                for workload, prompts in load_sets(list(sizes.workloads), limit=sizes.prompts, heldout=True).items():
                    for prompt in prompts:
                        ids = encode_prompt(tok, prompt.text, kind=prompt.kind).to(model.device)
                        ref = greedy_reference(model, ids, max_new_tokens=sizes.max_new_tokens, keep_logits=True)
                        noise.append({"model": model_name, "dtype": dtype, "workload": workload, "prompt": prompt.id,
                                      **packed_noise(model, ids, ref)})
                        for method, spec in sizes.methods:
                            config, policy = parse_method(spec)
                            got = run_autolade(model, ids, max_new_tokens=sizes.max_new_tokens, config=config,
                                               policy=policy)
                            div = divergence(ref.tokens, got.tokens, ref)
                            stats = got.stats
                            results.append({
                                "model": model_name, "dtype": dtype, "workload": workload, "prompt": prompt.id,
                                "method": method, "spec": spec, "new_tokens": len(got.tokens),
                                "bitwise": div is None,
                                "exact": div is None or div.within_noise(noise_gap(model.dtype)),
                                "diverged_at": None if div is None else div.index,
                                "gap_top2": None if div is None else div.gap_top2,
                                "noise_gap": noise_gap(model.dtype),
                                "steps": stats.steps, "tokens_per_step": stats.tokens_per_step,
                                "wall_s": got.seconds, "forward_ms": stats.forward_ms,
                                "overhead_ms": stats.overhead_ms, "policy_ms": stats.policy_ms,
                                "overhead_ms_per_step": stats.overhead_ms / stats.steps if stats.steps else None,
                            })  # fmt: skip
                            self.log(f"   {model_name} {dtype} {workload} {method}: "
                                     f"{'exact' if results[-1]['exact'] else 'DIVERGED'}")
                        self.write()
        record["all_exact"] = bool(results) and all(r["exact"] for r in results) and not record.get("skipped")

    def _curve(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.machine.step_curve import measure_step_curve, plot_curve

        name = self.sizes.models[0]
        model, _ = self.model(name, self.sizes.bench_dtype)
        curve = measure_step_curve(model, ks=self.sizes.curve_ks, contexts=self.sizes.curve_contexts,
                                   repeats=self.sizes.curve_repeats, name=name)
        self._curve_value = curve
        png = plot_curve(curve, self.out / "curve.png")
        record.update(model=name, dtype=self.sizes.bench_dtype, curve=curve.to_dict(), files=[png.name])
        record["spare_compute"] = {str(c): curve.spare_compute(c) for c in curve.points}

    def _settings(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.machine.models import model_fingerprint
        from autolade.records.vocab import tokenizer_fingerprints
        from autolade.runtime.predict import predicted_settings
        from autolade.runtime.settings import resolve_settings
        from autolade.store.tables import find_table
        from autolade.tuning.harness import setting_label

        model, tok = self.model(self.sizes.models[0], self.sizes.bench_dtype)
        fp = model_fingerprint(model)
        tfp = tokenizer_fingerprints(tok)
        for workload in WORKLOADS:
            row: dict[str, Any] = {}
            record[workload] = row
            config, source, policy = resolve_settings(model, workload=workload, tokenizer=tok)
            row["generate_default"] = {"setting": setting_label(config, policy), "source": source}
            table, where = find_table(_NoStore(), model_fingerprint=fp, tokenizer_fingerprint=tfp, workload=workload,
                                      dtype=fp["dtype"])
            row["table"] = where
            if table is None or self._curve_value is None:
                row["predicted"] = None if table is None else "no step curve (the curve section failed)"
                continue
            chosen, ranking = predicted_settings(table, self._curve_value)
            pol = None if chosen.setting.policy == "static" else chosen.setting.policy
            self._predicted[workload] = (chosen.setting.config, pol)
            row["predicted"] = {"setting": setting_label(chosen.setting.config, pol), "speedup": chosen.speedup,
                                "tokens_per_step": chosen.tokens_per_step, "packed_per_step": chosen.packed_per_step}
            row["top"] = [{"setting": p.setting.label, "speedup": p.speedup} for p in ranking[:5]]

    def _compiled(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.bench.devcheck_compiled import compiled_section

        compiled_section(self, record, deadline)

    def _batch(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.bench.devcheck_batch import batch_section

        batch_section(self, record, deadline)

    def _bench(self, record: dict[str, Any], deadline: float) -> None:
        from autolade.bench.render import write_report
        from autolade.bench.report import write_json
        from autolade.bench.run import config_label, load_sets, run_benchmark
        from autolade.runtime.defaults import builtin_default

        model, tok = self.model(self.sizes.models[0], self.sizes.bench_dtype)
        configs: dict[str, Any] = {}
        default, default_policy = builtin_default(torch.device(self.device).type)
        candidates = [(default, (default_policy or {}).get("name"))]
        candidates += [self._predicted[w] for w in self.sizes.workloads if w in self._predicted]
        for config, policy in candidates:
            configs.setdefault(config_label(config, policy), config if policy is None else (config, policy))
        sets = load_sets(list(self.sizes.workloads), limit=self.sizes.bench_prompts, heldout=True)
        report = run_benchmark(
            model=model, tokenizer=tok, prompts=sets, configs=configs, max_new_tokens=self.sizes.bench_tokens,
            warmup=1, repeats=self.sizes.bench_repeats, max_seconds=max(deadline - time.monotonic(), 1.0),
            on_prompt=lambda partial: write_json(partial, self.out / "bench.json"),
        )  # fmt: skip
        js, png = write_report(report, self.out / "bench")
        record["files"] = [js.name, png.name]
        record["summaries"] = [
            {k: s.to_dict()[k] for k in ("set", "method", "prompts", "tokens_per_s", "speedup", "speedup_vs_pld",
                                         "exact", "diverged", "forward_ms_per_step", "overhead_ms_per_step")}
            for s in report.summaries
        ]  # fmt: skip
        if report.settings.get("stopped_early"):
            record["skipped"] = [f"stopped early: {report.settings['stopped_early']}"]


def packed_noise(model: torch.nn.Module, ids: torch.Tensor, ref: Any) -> dict[str, Any]:
    """The float noise a packed forward adds, measured: HF greedy's one-token logits (``ref``, kept)
    against one packed forward of the same tokens (causal 4-D mask, the engine's packed attention
    implementation) after a cached prefill of the prompt. ``gap_shift``: the largest change, between
    the two, of the reference's top-1 minus top-2 logit: a packed step flips a token only where that
    gap is smaller than its shift, so ``harness.noise_gap`` should be at least ``gap_shift``."""
    from transformers import DynamicCache

    from autolade.engine.attention import AttentionSwitch
    from autolade.machine.step_curve import cache_kwarg
    from autolade.tuning.harness import noise_gap

    tokens = ref.tokens
    if ref.logits is None or len(tokens) < 2:
        return {"max_logit_diff": None, "note": "needs kept reference logits and 2+ new tokens"}
    n = len(tokens) - 1
    t = ids.shape[1]
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    window = getattr(cfg, "sliding_window", None)
    if window and t + n > window:
        return {"max_logit_diff": None, "note": f"prompt + tokens exceed the sliding window {window}"}
    switch = AttentionSwitch.for_model(model)
    loaded = switch.current
    dtype, device = model.dtype, ids.device
    try:
        with torch.inference_mode():
            cache = DynamicCache()
            switch.use("prefill")
            kw = {cache_kwarg(model): cache}
            model(input_ids=ids, use_cache=True, **kw)
            switch.use("packed")
            step = torch.tensor([tokens[:-1]], device=device)
            mask = torch.zeros((1, 1, n, t + n), dtype=dtype, device=device)
            mask[0, 0, :, t:] = torch.triu(torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device), 1)
            out = model(input_ids=step, position_ids=torch.arange(t, t + n, device=device)[None], attention_mask=mask,
                        use_cache=True, **kw)
    finally:
        switch.set(loaded)
    packed, one = out.logits[0].float().cpu(), ref.logits[1:].float().cpu()
    top2 = one.topk(2, dim=-1).indices  # the reference's top-1 and top-2 tokens at each position
    gap_one = one.gather(1, top2[:, :1]) - one.gather(1, top2[:, 1:])
    gap_packed = packed.gather(1, top2[:, :1]) - packed.gather(1, top2[:, 1:])
    shift = (gap_packed - gap_one).abs().max().item()
    gap = noise_gap(dtype)
    return {"positions": n, "max_logit_diff": (packed - one).abs().max().item(), "gap_shift": shift, "noise_gap": gap,
            "noise_gap_covers": shift <= gap, "packed_implementation": switch.plan.packed}


def _torch_dtype(name: str) -> torch.dtype:
    from autolade.machine.models import resolve_dtype

    return resolve_dtype(name)
