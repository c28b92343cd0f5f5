import json
import sys
from pathlib import Path

from tiny import TINY_ARCH

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import step_probe


def test_probe_times_each_setting_next_to_the_curve(tmp_path, capsys):
    rc = step_probe.main(["--device", "cpu", "--dtype", "float32", "--arch", "tiny-llama", "--tokens", "12",
                          "--out", str(tmp_path)], archs=TINY_ARCH)  # fmt: skip
    assert rc == 0
    data = json.loads((tmp_path / "step_probe.json").read_text())
    assert set(data["runs"]) == {"greedy", "W15N5G15+L10", "L10", "W4N3G4"}
    greedy, window = data["runs"]["greedy"], data["runs"]["W15N5G15+L10"]
    assert greedy["packed_median"] == 1 and greedy["tokens"] == 12
    assert window["packed_median"] > 1 and window["forward_ms_median"] > 0
    assert all(r["c_of_packed_ms"] > 0 for r in data["runs"].values())
    assert "W4N3G4" in capsys.readouterr().out
