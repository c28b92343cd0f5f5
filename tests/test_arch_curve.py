import json
import sys
from pathlib import Path

import pytest
from tiny import TINY_ARCH

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import arch_curve


@pytest.mark.parametrize(
    "name,published",
    [("llama2-7b-chat", 6.74e9), ("llama2-13b-chat", 13.0e9), ("qwen2.5-coder-7b", 7.61e9)],
)
def test_shapes_give_the_published_parameter_counts(name, published):
    model = arch_curve.build(name, device="meta", dtype="bfloat16")  # shapes only, no memory
    params = sum(p.numel() for p in model.parameters())
    assert abs(params - published) / published < 0.01, params


def test_curve_is_measured_and_written_per_architecture(tmp_path, capsys):
    out = tmp_path / "curves.json"
    rc = arch_curve.main(["--device", "cpu", "--dtype", "float32", "--ks", "1,4", "--contexts", "16",
                          "--repeats", "1", "--out", str(out)], archs=TINY_ARCH)  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["weights"].startswith("random")
    entry = data["curves"]["tiny-llama"]
    assert entry["params"] > 0
    assert set(entry["curve"]["points"]["16"]) == {"1", "4"}
    assert all(ms > 0 for ms in entry["curve"]["points"]["16"].values())
    assert "tiny-llama" in capsys.readouterr().out


def test_unknown_architecture_names_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        arch_curve.main(["--arch", "gpt-5", "--device", "cpu"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown architecture 'gpt-5'" in err and "llama2-7b-chat" in err
