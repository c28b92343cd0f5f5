"""The prepared device check (autolade/devcheck.py, tools/gpu_check.py): sections, noise, the CPU run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import repetitive_prompt, tiny_llama

from autolade.bench.devcheck import FORMAT, CheckSizes, DeviceCheck, packed_noise, sizes_for
from autolade.tuning.harness import greedy_reference, noise_gap

ROOT = Path(__file__).resolve().parent.parent


def test_sizes_full_on_gpu_toy_with_quick():
    full = sizes_for("cuda", quick=False)
    assert max(full.curve_ks) == 256 and set(full.dtypes) == {"float32", "bfloat16"}
    assert set(full.models) == {"smollm2-135m", "gemma3-270m"}
    assert {name for name, _ in full.methods} == {"window", "pool", "lookup", "adaptive"}
    assert sum(full.budget_s.values()) < 9 * 60  # the device check fits its 9 minutes (model loads: gpu_check.sh's 590 s)
    assert full.compiled_models == ("smollm2-135m", "qwen2.5-coder-1.5b") and full.budget_s["compiled"] >= 180
    assert full.bench_repeats == 2  # the fastest of two: a first CUDA run pays cuDNN's per-shape plan building
    quick = sizes_for("cpu", quick=True)
    assert max(quick.curve_ks) == 32 and quick.prompts == 1 and quick.max_new_tokens == 16 and quick.bench_repeats == 1
    assert {name for name, _ in quick.methods} == {"window", "pool", "lookup", "adaptive"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_noise_is_measured_against_the_one_token_reference(dtype):
    model = tiny_llama(dtype=dtype)
    ids = repetitive_prompt(seed=5)
    ref = greedy_reference(model, ids, max_new_tokens=12, keep_logits=True)
    noise = packed_noise(model, ids, ref)
    assert noise["positions"] == 11 and noise["packed_implementation"] == "sdpa"
    assert noise["noise_gap"] == noise_gap(dtype)
    assert 0 <= noise["gap_shift"] <= 2 * noise["max_logit_diff"] + 1e-6
    if dtype == torch.float32:
        assert noise["max_logit_diff"] < 1e-4 and noise["noise_gap_covers"]
    assert model.config._attn_implementation == "sdpa"
    no_logits = greedy_reference(model, ids, max_new_tokens=4)
    assert packed_noise(model, ids, no_logits)["max_logit_diff"] is None


class CurveFails(DeviceCheck):
    """Every section a stand-in; the curve raises."""

    def _environment(self, record, deadline):
        record["probe"] = "stand-in"

    def _exactness(self, record, deadline):
        record["all_exact"] = True

    def _curve(self, record, deadline):
        raise RuntimeError("CUDA error: out of memory")

    def _settings(self, record, deadline):
        record["predicted"] = None if self._curve_value is None else "?"

    def _bench(self, record, deadline):
        assert json.loads(self.path.read_text())["sections"]["curve"]["status"] == "failed"  # written as it goes
        record["files"] = []

    def _compiled(self, record, deadline):
        record["models"] = {}

    def _batch(self, record, deadline):
        record["models"] = {}


def test_a_failing_section_is_recorded_and_the_rest_still_run(tmp_path):
    lines = []
    result = CurveFails(out=tmp_path / "o", device="cpu", sizes=CheckSizes(), log=lines.append).run()
    saved = json.loads((tmp_path / "o" / "gpu_check.json").read_text())
    assert saved["format"] == FORMAT and saved == json.loads(json.dumps(result, default=str))
    statuses = {name: s["status"] for name, s in saved["sections"].items()}
    assert statuses == {"environment": "ok", "exactness": "ok", "curve": "failed", "settings": "ok", "bench": "ok",
                        "compiled": "ok", "batch": "ok"}
    assert saved["sections"]["curve"]["error"] == "RuntimeError: CUDA error: out of memory"
    assert saved["sections"]["settings"]["predicted"] is None
    assert saved["ok"] is False and saved["exact"] is True
    assert any("failed: RuntimeError" in line for line in lines)


@pytest.mark.slow
def test_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu", "--quick", "--models", "smollm2-135m",
         "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )
    result = json.loads((out / "gpu_check.json").read_text())
    sections = result["sections"]
    assert sections["environment"]["status"] == "ok", sections["environment"]
    assert sections["environment"]["attention_plans"]["float32"]["packed"] == "sdpa"
    exact = sections["exactness"]
    assert exact["status"] == "ok" and exact["all_exact"] is True, proc.stdout[-3000:]
    runs = exact["runs"]
    assert {(r["dtype"], r["method"]) for r in runs} == {
        (d, m) for d in ("float32", "bfloat16") for m in ("window", "pool", "lookup", "adaptive")
    }
    assert all(r["exact"] and r["new_tokens"] == 16 and r["forward_ms"] > 0 and r["overhead_ms"] >= 0 for r in runs)
    assert all(n["gap_shift"] is not None for n in exact["noise"])
    assert sections["curve"]["status"] == "ok" and max(map(int, sections["curve"]["curve"]["points"]["64"])) == 32
    for name in ("gpu_check.json", "curve.png", "bench.json", "bench.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert sections["settings"]["status"] == "ok"
    assert sections["bench"]["status"] in ("ok", "partial") and sections["bench"]["summaries"]
    compiled = sections["compiled"]
    assert compiled["status"] in ("ok", "partial"), compiled
    smol = compiled["models"]["smollm2-135m"]
    assert smol["all_exact"] and smol["exactness"][0]["exact"] and smol["graphs"] == 1 and smol["buckets"] == [32]
    if "curve" in smol:  # the section's time box may stop it before the curve on a slow machine: said in "skipped"
        assert smol["curve"]["compiled"]["compiled"] is True and set(smol["compiled_over_eager"]) == {"32"}
        assert smol["weights_read_ms"]["weight_bytes"] > 100e6
    else:
        assert compiled["skipped"]
    batch = sections["batch"]
    assert batch["status"] in ("ok", "partial"), batch
    rows = batch["models"]["smollm2-135m"]
    assert rows["rows"] == 2 and rows["all_exact"], rows
    assert rows["eager"]["exact_rows"] == rows["compiled"]["exact_rows"] == 2  # fp32: every row HF greedy's alone
    assert rows["compiled"]["compiled"]["batched"] and rows["compiled"]["compiled"]["graphs"] == 1
    if "tokens_per_s" in rows:
        assert {"hf", "eager", "compiled"} <= set(rows["tokens_per_s"]) and rows["over_hf"]["compiled"] > 0
    else:
        assert batch["skipped"]
