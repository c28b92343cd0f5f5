"""Measuring the step-latency curve on a real (tiny) model, and its plot."""

from __future__ import annotations

import json
import math

import pytest
import torch
from curves import BF16_CPU
from tiny import tiny_llama
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from autolade.errors import ProfileError
from autolade.machine.step_curve import measure_step_curve, plot_curve
from autolade.records.curve import StepCurve

# --- measuring the curve -----------------------------------------------------------------




def test_measure_step_curve_tiny_llama(one_thread):
    model = tiny_llama(max_positions=256)
    curve = measure_step_curve(model, ks=(2, 4, 8), contexts=(16, 48), repeats=2, warmup=1, name="tiny")
    assert curve.contexts == [16, 48] and curve.ks == [1, 2, 4, 8]  # k=1 always measured
    assert all(ms > 0 for row in curve.points.values() for ms in row.values())
    assert curve.dtype == "float32" and curve.device == "cpu" and curve.model == "tiny"
    assert 1 <= curve.spare_compute() <= 8
    assert set(curve.spread) == {16, 48} and all(sp >= 0 for row in curve.spread.values() for sp in row.values())
    back = StepCurve.from_dict(json.loads(json.dumps(curve.to_dict())))
    assert back.ks == curve.ks and back.contexts == curve.contexts and back.notes == curve.notes
    assert back.spread.keys() == curve.spread.keys()
    assert math.isclose(back.cost(4, 16), curve.cost(4, 16), rel_tol=1e-3)


def test_measure_step_curve_sliding_window_model(one_thread):
    # Gemma 3 has sliding-window layers; the context (40) is past the window (8)
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    model = Gemma3ForCausalLM(config).eval()
    curve = measure_step_curve(model, ks=(1, 4), contexts=(40,), repeats=1, warmup=1)
    assert curve.ks == [1, 4]


def test_measure_step_curve_checks_limits():
    with pytest.raises(ProfileError, match="max_position_embeddings"):
        measure_step_curve(tiny_llama(max_positions=64), ks=(1, 32), contexts=(48,))
    with pytest.raises(ProfileError, match="repeats"):
        measure_step_curve(tiny_llama(), ks=(1,), contexts=(8,), repeats=0)


def test_plot_curve(tmp_path, foreign_backend):
    import matplotlib

    path = plot_curve(BF16_CPU, tmp_path / "out" / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == foreign_backend  # the caller's backend is left alone
