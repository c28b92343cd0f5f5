"""What a finished ``autolade tune`` leaves: its result, the winner saved as a profile, and the
report PNG of the study."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from autolade.tuning.trials import Candidate, Measured


@dataclass
class TuneResult:
    """What ``tune`` found: the held-out winner, its measurement and the study it came from."""

    best: Candidate
    holdout: Measured
    speedup: float  # held-out, vs HF greedy, ratio of total times
    ci: tuple[float, float]  # 95% bootstrap interval over held-out prompts
    vs_pld: float  # held-out, vs HF prompt lookup
    study_name: str
    storage: str
    trials_run: int
    finalists: list[tuple[Candidate, float]]  # (candidate, held-out speedup)
    profile_id: int | None = None
    report_png: Path | None = None


def save_profile(store, hardware, model, model_name, dtype, tag, result: TuneResult, curve, n_hold: int, *,
                 memory: bool = False) -> int:
    """Store the held-out winner of ``result`` as a tuned profile; returns its store id."""
    from autolade.machine.models import model_fingerprint
    from autolade.records.profile import Profile
    from autolade.runtime.settings import stored_compile

    fp = model_fingerprint(model)
    h = result.holdout
    prof = Profile(
        hardware_fingerprint=hardware.fingerprint, hardware_class=hardware.hardware_class,
        model_name=fp["name"], model_config_hash=fp["config_hash"], dtype=dtype, workload=tag,
        settings=result.best.config, policy=result.best.policy, speedup=max(result.speedup, 1e-3),
        tokens_per_s=sum(h.tokens) / sum(h.ours_s),
        baseline_tokens_per_s=sum(h.tokens) / sum(h.greedy_s),
        prompt_set=f"{tag}[held-out {n_hold}]", hardware_summary=hardware.summary(),
        step_curve=curve.to_dict() if curve is not None else None,
        compiled=stored_compile(model),  # the trials' generate() compiled where the stored curves say it pays
        notes=f"tuned by autolade tune{' with the n-gram memory' if memory else ''}: study {result.study_name}, 95% CI {result.ci[0]:.2f}-{result.ci[1]:.2f}, "
              f"{result.vs_pld:.2f}x HF prompt lookup",
    )
    return store.save(prof)


def plot_study(study, path: str | Path) -> Path:
    """Speedup per trial (by policy) and the best speedup on a W x N grid (a bare ``Figure``, no
    pyplot: the caller's matplotlib backend stays as it was)."""
    import numpy as np
    import optuna
    from matplotlib.figure import Figure

    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    fig = Figure(figsize=(12, 4.5))
    a, b = fig.subplots(1, 2)
    for name, colour in (("static", "tab:blue"), ("adaptive", "tab:orange"), ("lookup", "tab:green"), (None, "grey")):
        pts = [(t.number, t.value) for t in trials if t.params.get("policy") == name]
        if pts:
            a.scatter(*zip(*pts), c=colour, label=name or "greedy", s=22)
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    a.set(xlabel="trial", ylabel="speedup vs greedy (tuning prompts)", title=study.study_name[:60])
    a.legend(fontsize=8)
    def window(t) -> int:  # the lookup policy runs no window, whatever W the trial drew
        return 0 if t.params.get("policy") == "lookup" else t.params.get("window", 0)

    ws = sorted({window(t) for t in trials})
    ns = sorted({t.params.get("ngram", 0) for t in trials if window(t)}) or [0]
    grid = np.full((len(ns), len(ws)), np.nan)
    for t in trials:
        w, n = window(t), t.params.get("ngram", ns[0]) if window(t) else ns[0]
        i, j = ns.index(n) if n in ns else 0, ws.index(w)
        grid[i, j] = t.value if math.isnan(grid[i, j]) else max(grid[i, j], t.value)
    im = b.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
    b.set_xticks(range(len(ws)), ws)
    b.set_yticks(range(len(ns)), ns)
    b.set(xlabel="window W", ylabel="n-gram N (W=0: any)", title="best speedup per W x N")
    fig.colorbar(im, ax=b)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
