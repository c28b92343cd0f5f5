"""The per-step plot of one generation, on a tiny random model."""

import matplotlib
from tiny import repetitive_prompt, tiny_llama

from autolade import generate
from autolade.bench.plots import plot_steps


def test_plot_steps_writes_a_png_and_leaves_the_backend(tmp_path, foreign_backend):
    res = generate(tiny_llama(), repetitive_prompt(), max_new_tokens=16, window=2, ngram=3, guesses=2, policy="adaptive")
    path = plot_steps(res.stats, tmp_path / "plots" / "steps.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    assert matplotlib.get_backend() == foreign_backend  # a notebook's backend stays as it was
