import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import price_tables

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "docs" / "bench" / "gpu-h200-20261204"


def test_flat_gpu_curve_prices_the_shipped_tables_into_a_wide_window(capsys):
    # the measured H200 curve (flat to k=256) with the 1.5B tables measured on a CPU
    assert price_tables.main([str(H200 / "arch_curves_qwen.json"), "--model", "qwen2.5-coder-1.5b"]) == 0
    out = capsys.readouterr().out
    chosen = [line for line in out.splitlines() if line.startswith("==")]
    assert len(chosen) == 2 and all("chosen W15 N5 G15" in line for line in chosen)
    assert "chat" in chosen[0] and "code" in chosen[1]


def test_a_device_checks_json_is_read_too(capsys):
    assert price_tables.main([str(H200 / "gpu_check.json"), "--model", "smollm2-135m", "--top", "2"]) == 0
    assert "predicted" in capsys.readouterr().out


def test_missing_curve_or_tables_say_what_to_do():
    with pytest.raises(SystemExit, match="no curve for 'gemma3-270m'"):
        price_tables.main([str(H200 / "arch_curves_qwen.json"), "--model", "gemma3-270m"])
    with pytest.raises(SystemExit, match="autolade accept --model qwen2.5-coder-7b"):
        price_tables.main([str(H200 / "arch_curves_qwen.json"), "--model", "qwen2.5-coder-7b"])
