"""tools/matmul_rows.py: the k-row matmul timer, on small shapes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import matmul_rows


def test_every_row_count_is_timed_in_each_dtype(capsys):
    ms = matmul_rows.measure(dtype="float32", shape=(16, 32), rows=[1, 2, 4], repeats=2, calls=2)
    assert sorted(ms) == [1, 2, 4] and all(v > 0 for v in ms.values())
    assert matmul_rows.main(["--dtype", "bfloat16", "float32", "--shape", "16", "32", "--rows", "1", "2",
                             "--repeats", "1", "--calls", "1"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16: k=1" in out and "float32: k=1" in out and "c(2)/c(1)" in out
