"""Benchmark report data: what ran (``Method``), one measurement (``Run``), one table row
(``Summary``), the whole report (``BenchReport``) and its JSON form (format ``autolade-bench/1``).

Speedups are throughput ratios: (method tokens / method time) / (greedy tokens / greedy time), per
prompt set (``speedup``, from the sums) and the median of the per-prompt ratios
(``median_speedup``). When the outputs are exact they have the same length, and the set ratio is
exactly sum(greedy time) / sum(method time) (also kept, as ``time_ratio``); a diverged output can
stop at another length, which a bare time ratio would reward.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autolade.config import LookaheadConfig
from autolade.engine.recycle import NextTokenTable
from autolade.errors import WorkloadError
from autolade.runtime.policies import make_policy, needs_cost
from autolade.tuning.harness import PLD_TOKENS

HF_GREEDY = "hf-greedy"
HF_PLD = "hf-pld"
HF_STATIC = "hf-static"  # HF greedy on a fixed-size StaticCache with its compiled forward (what a GPU user compiles)
HF_ASSISTED = "hf-assisted"  # HF assisted generation, greedy, drafted by a smaller model of the same tokenizer
BASELINES = {"greedy": HF_GREEDY, "pld": HF_PLD, "static": HF_STATIC, "assisted": HF_ASSISTED}
FORMAT = "autolade-bench/1"


@dataclass(frozen=True)
class Method:
    """One thing to time: an HF baseline or an autolade config (with an optional policy factory)."""

    name: str
    kind: str  # "hf-greedy", "hf-pld", "hf-static", "hf-assisted" or "autolade"
    config: LookaheadConfig | None = None
    # A policy name / preset / dict (autolade.runtime.policies.make_policy builds a fresh one per run), or a
    # factory called once per run: factory(config) or factory() -> Policy. None = static.
    policy: str | dict | Callable[..., Any] | None = None
    # autolade, recycling: keep the token recycling table from prompt to prompt of a set, as generate()
    # does with the memory on in a long-running process (False: a fresh table every run)
    carry: bool = False
    # autolade: generate(pad_single=): a step with nothing to draft packs a filler draft (True), never (False),
    # or as this machine's stored step curve says (None)
    pad: bool | None = None
    # autolade, recycling: the table also keeps rows per (previous token, token) (True), or per token only
    # (False: the recycling of before 2026-12-05, for side-by-side runs)
    pairs: bool = True
    # autolade: generate(compile=): compiled steps at fixed widths on a static cache (True), eager (False), or
    # as this machine's stored curves say (None)
    compile: bool | None = None
    # hf-assisted: the draft model (``model.generate(assistant_model=...)``) and its name for the report
    assistant: Any = field(default=None, repr=False, compare=False)
    assistant_name: str | None = None

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind == HF_PLD:
            out["prompt_lookup_num_tokens"] = PLD_TOKENS
        if self.kind == HF_ASSISTED:
            out["assistant_model"] = self.assistant_name
        if self.config is not None:
            out["config"] = self.config.to_dict()
        if isinstance(self.policy, (str, dict)):
            out["policy"] = self.policy
        elif self.policy is not None:
            out["policy"] = getattr(self.policy, "__name__", type(self.policy).__name__)
        if self.carry:
            out["carry"] = True
        if self.pad is not None:
            out["pad"] = self.pad
        if not self.pairs:
            out["pairs"] = False
        if self.compile is not None:
            out["compile"] = self.compile
        return out

    def new_table(self) -> NextTokenTable:
        """An empty token recycling table of this method's kind."""
        return NextTokenTable() if self.pairs else NextTokenTable(max_pairs=0)

    def make_policy(self, cost: Callable[[float], float] | None = None):
        """A fresh policy for one run; ``cost`` (this machine's c(k)) for the cost-aware policy, looked
        up once per benchmark so that the store lookup stays out of the timed runs."""
        if isinstance(self.policy, (str, dict)) and cost is not None and needs_cost(self.policy):
            return make_policy(self.policy, self.config, cost=cost)
        if self.policy is None or isinstance(self.policy, (str, dict)):
            return self.policy  # generate() builds a fresh policy from a name or dict
        try:
            return self.policy(self.config)
        except TypeError:
            return self.policy()


@dataclass
class Run:
    """One (prompt, method) measurement."""

    set: str
    prompt: str
    method: str
    order: int  # position in this prompt's rotation (0 = ran first)
    prompt_tokens: int
    new_tokens: int
    time_s: float
    tokens_per_s: float
    speedup_vs_greedy: float | None = None  # throughput ratio to HF greedy on the same prompt
    speedup_vs_pld: float | None = None
    exact: bool | None = None  # same tokens as HF greedy (None for HF greedy itself)
    diverged_at: int | None = None  # index in the new tokens of the first difference
    ref_token: int | None = None
    got_token: int | None = None  # None: the output ended there (or went on where the reference ended)
    gap_top2: float | None = None  # reference logits at the divergence: top-1 minus top-2
    gap_chosen: float | None = None  # reference logits: logit(ref token) - logit(got token)
    context: str | None = None  # decoded text before the divergence, and the two tokens
    steps: int | None = None  # forwards after the prefill (HF methods: counted by a forward hook)
    tokens_per_step: float | None = None  # (new tokens - 1) / steps: the first token comes from the prefill
    packed_per_step: float | None = None  # tokens fed to a step's forward, mean
    prefill_ms: float | None = None  # this and the next two: autolade only (its own timers)
    forward_ms: float | None = None
    overhead_ms: float | None = None
    policy_ms: float | None = None  # the part of overhead_ms spent in the runtime policy
    stop_reason: str | None = None
    tokens: list[int] | None = None  # kept for HF greedy and for diverged outputs
    times_s: list[float] | None = None  # every timed repeat (time_s is the fastest)
    cpu_share: float | None = None  # CPU time / (wall x threads) of the kept run; low = other processes took CPU
    per_step: dict[str, list] | None = None


@dataclass
class Summary:
    """One (set, method) row of the table."""

    set: str
    method: str
    prompts: int
    tokens: int
    time_s: float
    tokens_per_s: float
    speedup: float | None  # (sum tokens / sum time) vs HF greedy's; = time_ratio when exact
    time_ratio: float | None  # sum(greedy time) / sum(method time)
    median_speedup: float | None
    speedup_vs_pld: float | None
    median_speedup_vs_pld: float | None
    exact: int | None
    diverged: int | None
    max_gap: float | None  # the largest top-2 gap at a first divergence (None: no divergence)
    tokens_per_step: float | None = None
    packed_per_step: float | None = None
    steps: int | None = None
    prefill_ms: float | None = None
    forward_ms: float | None = None
    overhead_ms: float | None = None
    policy_ms: float | None = None
    other_ms: float | None = None  # wall - prefill - step forwards - step overhead (API, commits, stops)
    cpu_share: float | None = None  # time-weighted CPU share of this method's runs (1.0 = had the cores)

    @property
    def forward_ms_per_step(self) -> float | None:
        return self.forward_ms / self.steps if self.steps and self.forward_ms is not None else None

    @property
    def overhead_ms_per_step(self) -> float | None:
        return self.overhead_ms / self.steps if self.steps and self.overhead_ms is not None else None

    @property
    def overhead_share(self) -> float | None:
        if not self.steps or self.forward_ms is None or not self.forward_ms + (self.overhead_ms or 0):
            return None
        return self.overhead_ms / (self.forward_ms + self.overhead_ms)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            forward_ms_per_step=self.forward_ms_per_step,
            overhead_ms_per_step=self.overhead_ms_per_step,
            overhead_share=self.overhead_share,
        )
        return out


@dataclass
class BenchReport:
    methods: list[Method]
    sets: dict[str, list[str]]  # set -> prompt ids, in run order
    runs: list[Run]
    summaries: list[Summary]
    environment: dict[str, Any]
    settings: dict[str, Any]
    warmup_runs: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, set_name: str, method: str) -> Summary:
        for s in self.summaries:
            if s.set == set_name and s.method == method:
                return s
        raise KeyError((set_name, method))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchReport:
        """Back from ``to_dict()`` / the JSON file (to redraw the chart or the tables)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise WorkloadError("not an autolade benchmark JSON (format autolade-bench/1)")
        methods = [
            Method(m["name"], m["kind"], LookaheadConfig.from_dict(m["config"]) if m.get("config") else None, m.get("policy"),
                   bool(m.get("carry", False)), m.get("pad"), bool(m.get("pairs", True)), m.get("compile"),
                   assistant_name=m.get("assistant_model"))
            for m in data["methods"]
        ]
        summary_fields = {f for f in Summary.__dataclass_fields__}
        summaries = [Summary(**{k: v for k, v in s.items() if k in summary_fields}) for s in data["summaries"]]
        run_fields = set(Run.__dataclass_fields__)
        runs = [Run(**{k: v for k, v in r.items() if k in run_fields}) for r in data["runs"]]
        return cls(methods, data["sets"], runs, summaries, data["environment"], data["settings"], data.get("warmup_runs", []))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "environment": self.environment,
            "settings": self.settings,
            "methods": [m.spec() for m in self.methods],
            "sets": self.sets,
            "summaries": [s.to_dict() for s in self.summaries],
            "runs": [asdict(r) for r in self.runs],
            "warmup_runs": self.warmup_runs,
        }


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def summarise(set_name: str, method: Method, runs: list[Run]) -> Summary:
    mine = [r for r in runs if r.set == set_name and r.method == method.name]
    greedy = {r.prompt: r for r in runs if r.set == set_name and r.method == HF_GREEDY}
    pld = {r.prompt: r for r in runs if r.set == set_name and r.method == HF_PLD}
    tokens = sum(r.new_tokens for r in mine)
    secs = sum(r.time_s for r in mine)
    tps = tokens / secs if secs > 0 else 0.0
    g_tokens = sum(greedy[r.prompt].new_tokens for r in mine if r.prompt in greedy)
    g_secs = sum(greedy[r.prompt].time_s for r in mine if r.prompt in greedy)
    g_tps = g_tokens / g_secs if g_secs > 0 else 0.0
    p_runs = [pld[r.prompt] for r in mine if r.prompt in pld]
    p_tps = (sum(r.new_tokens for r in p_runs) / sum(r.time_s for r in p_runs)) if p_runs else None
    per = [r.speedup_vs_greedy for r in mine if r.speedup_vs_greedy is not None]
    per_pld = [r.speedup_vs_pld for r in mine if r.speedup_vs_pld is not None]
    checked = [r for r in mine if r.exact is not None]
    gaps = [r.gap_top2 for r in checked if r.exact is False and r.gap_top2 is not None]
    summary = Summary(
        set=set_name,
        method=method.name,
        prompts=len(mine),
        tokens=tokens,
        time_s=secs,
        tokens_per_s=tps,
        speedup=_ratio(tps, g_tps),
        time_ratio=_ratio(g_secs, secs),
        median_speedup=statistics.median(per) if per else None,
        speedup_vs_pld=_ratio(tps, p_tps) if p_tps else None,
        median_speedup_vs_pld=statistics.median(per_pld) if per_pld else None,
        exact=sum(1 for r in checked if r.exact) if checked else None,
        diverged=sum(1 for r in checked if not r.exact) if checked else None,
        max_gap=max(gaps) if gaps else None,
    )
    shared = [r for r in mine if r.cpu_share is not None]
    if shared:
        summary.cpu_share = sum(r.cpu_share * r.time_s for r in shared) / sum(r.time_s for r in shared)
    counted = [r for r in mine if r.steps is not None]
    if counted:
        steps = sum(r.steps for r in counted)
        summary.steps = steps
        summary.tokens_per_step = sum(max(r.new_tokens - 1, 0) for r in counted) / steps if steps else None
        packed = [(r.packed_per_step or 0.0) * r.steps for r in counted]
        summary.packed_per_step = sum(packed) / steps if steps else None
    stepped = [r for r in mine if r.forward_ms is not None]
    if stepped:
        summary.prefill_ms = sum(r.prefill_ms or 0.0 for r in stepped)
        summary.forward_ms = sum(r.forward_ms or 0.0 for r in stepped)
        summary.overhead_ms = sum(r.overhead_ms or 0.0 for r in stepped)
        summary.policy_ms = sum(r.policy_ms or 0.0 for r in stepped)
        summary.other_ms = sum(r.time_s for r in stepped) * 1e3 - summary.prefill_ms - summary.forward_ms - summary.overhead_ms
    return summary


def write_json(report: BenchReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return path


def load_report(path: str | Path) -> BenchReport:
    """A report written by ``write_report`` / ``autolade bench``."""
    return BenchReport.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
