"""Per-step plot of one generation: W, G, packed size and accepted tokens over the steps.

Drawn on a bare ``matplotlib.figure.Figure`` (no pyplot): the caller's backend stays as it was.
"""

from __future__ import annotations

from pathlib import Path


def plot_steps(stats, path: str | Path) -> Path:
    from matplotlib.figure import Figure

    s = stats.per_step
    steps = range(len(s["packed"]))
    fig = Figure(figsize=(10, 5.5))
    a, b = fig.subplots(2, 1, sharex=True)
    a.step(steps, s["window"], where="post", label="window W")
    a.step(steps, s["guesses"], where="post", label="guesses G")
    a.plot(steps, s["packed"], lw=0.8, color="grey", label="packed tokens k")
    a.set(ylabel="per step", title=f"{stats.policy} policy: {stats.new_tokens} tokens in {stats.steps} steps "
                                   f"({stats.tokens_per_step:.2f}/step, {stats.tokens_per_s:.1f} tok/s)")
    a.legend(fontsize=8, loc="upper right")
    b.bar(steps, s["accepted"], width=1.0, color="tab:green", label="draft tokens accepted")
    b2 = b.twinx()
    b2.plot(steps, s["step_ms"], lw=0.8, color="tab:red", label="step ms")
    b.set(xlabel="step", ylabel="accepted")
    b2.set_ylabel("step ms")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
