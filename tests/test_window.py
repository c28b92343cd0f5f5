import pytest

from autolade.engine.window import JacobiWindow


def test_window_fills_level_by_level_then_emits_ngrams():
    win = JacobiWindow(width=3, levels=3, seed_tokens=[7])
    assert win.depth == 1 and win.row_width == 5  # W + levels - 1 while filling
    assert win.advance([10, 11, 12, 13, 14]) == ([], [])
    assert win.depth == 2 and win.row_width == 4
    assert win.rows[1] == [11, 12, 13, 14]
    assert win.advance([20, 21, 22, 23]) == ([], [])
    assert win.full and win.row_width == 3
    assert win.rows == [[7, 7, 7], [12, 13, 14], [21, 22, 23]]
    keys, grams = win.advance([30, 31, 32])
    assert keys == [7, 7, 7]
    assert grams == [(12, 21, 30), (13, 22, 31), (14, 23, 32)]  # column trajectories + new token
    assert win.rows == [[12, 13, 14], [21, 22, 23], [30, 31, 32]]


def test_window_resize_keeps_columns():
    win = JacobiWindow(width=4, levels=2, seed_tokens=[1, 2, 3])
    win.advance([9] * 5)
    before = [row[:2] for row in win.rows]
    win.resize(2)
    assert [row for row in win.rows] == before and win.width == 2
    win.resize(5, fill_tokens=[4])
    assert win.row_width == 5 and win.rows[0][:2] == before[0] and win.rows[0][2:] == [4, 4, 4]
    with pytest.raises(ValueError):
        win.resize(0)


def test_ngram_two_has_single_level():
    win = JacobiWindow(width=2, levels=1, seed_tokens=[5])
    assert win.full
    keys, grams = win.advance([8, 9])
    assert keys == [5, 5] and grams == [(8,), (9,)]
