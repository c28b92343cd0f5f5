"""Many sequences at once: every row's draft tree and window go through ONE forward per step.

    add_many(rows) -> prefill them together, join the batch cache   (rows may join at any step boundary)
    step()   -> plan + draft per row, pad to the widest row, one forward [B, K], verify per row,
                keep each row's accepted KV columns, retire finished rows

Each row keeps everything ``lookahead_decode`` keeps for one sequence (its drafter with prompt
lookup, memory, pool, window and recycling; its policy; its verifier with its own generator) and
accepts its own number of tokens. Row b's packed tokens sit at positions from its own length; the
mask [B, 1, K, L + K] shows row b its own committed columns (``BatchKVCache.visible``) and its own
tree/window block; the padding past row b's width sees only itself and is never kept. Rows that
finish leave the batch (their columns are compacted away), so they stop costing tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from autolade.config import LookaheadConfig

from .attention import AttentionPlan
from .batch_prefill import PrefillChoice, prefill_groups, prefill_rows
from .budget import AcceptanceCurve, cut_tree, step_widths
from .clock import DeviceClock
from .decode import PROMPT_OBSERVED, DecodeLog, ModelRunner, StepRecord, commit_tokens, prefill
from .drafter import Drafted, Drafter
from .layout import DraftTree, Layout, PackedStep, additive
from .memory import AnswerMemory
from .prompt_lookup import PromptLookupSource
from .recycle import NextTokenTable
from .sources import Candidates
from .steps import Policy, StaticPolicy, StepOutcome
from .verify import GreedyVerifier

# a row the budget packed alone skips drafting for 1, 2, 4, ... up to this many steps (then drafts, and the budget
# decides again): its trees cost host time every step (prompt lookup, memory, recycling, layout) for nothing
REST_MAX = 16


@dataclass(frozen=True, kw_only=True)
class RowRequest:
    """One sequence of a batch: what ``lookahead_decode`` takes for one prompt."""

    prompt: Sequence[int]  # token ids, no padding
    config: LookaheadConfig
    max_new_tokens: int
    eos_ids: Sequence[int] = ()  # decoding stops after the first of these (kept)
    stop: Callable[[list[int]], bool] | None = None  # stop(new_tokens) true: the row is done
    policy: Policy | None = None  # None: StaticPolicy(config); one object per row (policies keep state)
    verifier: Any = None  # None: greedy; a sampling verifier carries this row's own generator
    on_tokens: Callable[[list[int]], None] | None = None  # called with each step's new tokens of this row
    memory: AnswerMemory | None = None  # earlier answers as a draft source (read only)
    token_cost: float | None = None  # what memory and recycled drafts must earn (lookahead_decode's)
    recycled: NextTokenTable | None = None  # the token recycling table (may be shared between rows)


@dataclass
class Row:
    key: int  # the caller's handle: the order rows were added in
    request: RowRequest
    drafter: Drafter
    policy: Policy
    verifier: Any
    out: list[int] = field(default_factory=list)  # new tokens so far
    log: DecodeLog = field(default_factory=DecodeLog)
    length: int = 0  # this row's tokens in the cache: its context less the last token (the next step's root)
    done: bool = False
    accepts: AcceptanceCurve = field(default_factory=AcceptanceCurve)  # accepted drafts per step by tree cut
    shadow: DraftTree | None = None  # a whole tree the step budget cut, walked against the tokens that came
    shadow_tokens: list[int] = field(default_factory=list)  # tokens emitted since that step
    rest: int = 0  # steps left that this row skips drafting (the budget packed it alone: its drafts did not pay)
    backoff: int = 0  # the length of its last rest: doubled each time it is packed alone again, up to REST_MAX

    def follow_shadow(self, tokens: list[int]) -> None:
        """Walk the cut tree along the tokens that came; once it ends or they differ, its path says what
        every cut of it would have accepted, and the row's acceptance curve learns it."""
        if self.shadow is None:
            return
        self.shadow_tokens.extend(tokens)
        node, path = 0, []
        for tok in self.shadow_tokens:
            child = self.shadow.children[node].get(tok)
            if child is None:
                break
            node = child
            path.append(child)
        else:
            if self.shadow.children[node]:
                return  # the tree goes on beyond the tokens so far: wait for more
        self.accepts.learn(path)
        self.shadow, self.shadow_tokens = None, []


@dataclass(frozen=True)
class BatchStep:
    """One forward of the whole batch."""

    rows: int  # rows in the forward
    packed: int  # real tokens, all rows together
    width: int  # K: the widest row's tokens (every row is padded to it)
    prefix: int  # cache columns every query attends over (holes included)
    holes: int  # of rows x prefix, the columns masked out (other rows' longer prompts, shorter accepted paths)
    alone: int  # rows the step budget packed as their last token alone (their drafts did not pay for the width)
    cut: int  # rows the step budget packed with part of their tree (no window), alone not included
    forward_ms: float
    step_ms: float
    rested: int = 0  # rows that drafted nothing this step: the budget had packed them alone lately (``REST_MAX``)


@dataclass
class BatchLog:
    steps: list[BatchStep] = field(default_factory=list)
    prefill_ms: float = 0.0
    prefills: int = 0  # prefill forwards (rows that join together share one)


class BatchDecoder:
    """Exact batched lookahead decoding of rows that join and leave at step boundaries."""

    def __init__(self, model: torch.nn.Module, *, attention: AttentionPlan | None = None,
                 clock: DeviceClock | None = None, capacity: int = 512,
                 step_cost: Callable[[float], float] | None = None, prefill_choice: PrefillChoice | None = None,
                 runner: ModelRunner | None = None) -> None:
        # ``runner``: whose forwards run the steps (a ``batch_compiled.CompiledBatchRunner``: compiled); None: eager
        self.runner = runner or ModelRunner(model, attention=attention)
        self.clock = clock or DeviceClock(self.runner.device)
        self.cache = self.runner.new_batch_cache(capacity)
        self.layout = Layout(device=self.runner.device)
        self.rows: list[Row] = []  # in the cache's row order
        self.finished: dict[int, Row] = {}
        self.log = BatchLog()
        self._keys = 0
        # c(k): a forward of k tokens (all rows, padding included), from the machine's step curve; with it each
        # step's width is the one with the most expected tokens per ms (``budget.step_widths``); None: no cuts
        self.step_cost = step_cost
        # rows joining together: one padded prefill or one each, by measured time (before any: together on a GPU)
        self.prefill_choice = prefill_choice or PrefillChoice.for_device(self.runner.device)

    def add(self, request: RowRequest) -> int:
        """Prefill ``request``'s prompt and add it to the batch; returns its key."""
        return self.add_many([request])[0]

    @property
    def next_key(self) -> int:
        """The key the next row added gets (``add_many`` gives consecutive keys in request order)."""
        return self._keys

    def add_many(self, requests: Sequence[RowRequest]) -> list[int]:
        """Prefill the prompts together (left-padded forwards of rows of about the same length; a row that
        fits no group goes alone) and add them to the batch; returns their keys, in ``requests``' order.
        If a group's forward raises, the groups before it are in the batch and its rows are not."""
        rows = []
        for request in requests:
            key, self._keys = self._keys, self._keys + 1
            config = request.config
            prompt = [int(t) for t in request.prompt]
            drafter = Drafter(config=config, prompt=prompt, memory=request.memory, token_cost=request.token_cost,
                              recycled=request.recycled)
            rows.append(Row(key=key, request=request, drafter=drafter, policy=request.policy or StaticPolicy(config),
                            verifier=request.verifier or GreedyVerifier()))
        keeps = [min(len(r.request.prompt), PROMPT_OBSERVED) if r.drafter.recycler is not None else 1 for r in rows]
        with torch.inference_mode():
            for group in prefill_groups([len(r.request.prompt) for r in rows], keeps, vocab=self.runner.vocab):
                together = self.prefill_choice.together(len(group))
                for part in [group] if together else [[i] for i in group]:
                    ms = self._prefill([rows[i] for i in part], [keeps[i] for i in part])
                    self.prefill_choice.record(together, ms, sum(len(rows[i].request.prompt) for i in part))
        return [row.key for row in rows]

    def _prefill(self, rows: list[Row], keeps: list[int]) -> float:
        """One forward for ``rows``' prompts; each row's first token; the rows that go on join the cache.
        Returns the ms it took."""
        t0 = self.clock.now()
        self.log.prefills += 1
        prompts = [[int(t) for t in row.request.prompt] for row in rows]
        if len(rows) == 1:  # alone: the model's own causal prefill
            cache = self.runner.new_cache(len(prompts[0]) + 1)
            ids = torch.tensor(prompts, device=self.runner.device)  # [1, T]
            starts, logits = [0], [prefill(self.runner, cache, ids, keep=keeps[0])]  # [keep, V]
        else:
            cache, starts, logits = prefill_rows(self.runner, prompts, keeps)
        staying = []
        for i, (row, prompt, row_logits) in enumerate(zip(rows, prompts, logits)):
            first = row.verifier.first(row_logits[-1], prompt)
            row.drafter.observe_prompt(prompt, row_logits)
            row.length = len(prompt)
            if row.request.max_new_tokens <= 0:
                row.log.stop_reason, row.done = "max_new_tokens", True
            else:
                row.done = self._commit(row, [first])
            if row.done:
                self.finished[row.key] = row
            else:
                staying.append(i)
        self.cache.join(cache, starts=starts, rows=staying)
        self.rows.extend(rows[i] for i in staying)
        ms = self.clock.since(t0) * 1e3
        for row in rows:
            row.log.prefill_ms = ms / len(rows)  # the group's prefill, shared out
        self.log.prefill_ms += ms
        return ms

    def _commit(self, row: Row, tokens: list[int]) -> bool:
        r = row.request
        return commit_tokens(tokens, out=row.out, drafter=row.drafter, log=row.log, eos=set(int(e) for e in r.eos_ids),
                             max_new_tokens=r.max_new_tokens, stop=r.stop, on_tokens=r.on_tokens)

    def step(self) -> dict[int, list[int]]:
        """One forward for every running row; returns each row's new tokens (by key)."""
        if not self.rows:
            return {}
        with torch.inference_mode():
            return self._step()

    def _step(self) -> dict[int, list[int]]:
        t0 = self.clock.now()
        plans, drafted, steps, rested = [], [], [], 0
        for row in self.rows:
            tp = self.clock.now()
            plan = row.policy.plan()
            row.log.policy_ms += self.clock.since(tp) * 1e3
            if row.rest > 0:  # packed alone lately: no drafts this step
                row.rest, rested = row.rest - 1, rested + 1
                plan = replace(plan, window=0, guesses=0, draft_len=0, drafts=0, recycle=0)
                d = Drafted(tree=DraftTree(row.drafter.tokens[-1]), ends={}, found={})
                steps.append(self.layout.build(d.tree, None, t=row.length))
            else:
                d = row.drafter.tree(plan)
                steps.append(self.layout.build(d.tree, row.drafter.window_rows(plan), t=row.length))
            plans.append(plan)
            drafted.append(d)
        whole = [len(d.tree) for d in drafted]
        widths = step_widths(self.step_cost, [s.size for s in steps], whole, [row.accepts for row in self.rows],
                             step_tokens=self.runner.step_tokens)
        cut = [w < s.size for w, s in zip(widths, steps)]
        for row, w, n in zip(self.rows, widths, whole):
            if w == 1 < n:  # its drafts did not pay for the width: rest from drafting, longer each time
                row.backoff = min(max(1, 2 * row.backoff), REST_MAX)
                row.rest = row.backoff
            elif w > 1:
                row.backoff = 0
        for b in [b for b in range(len(cut)) if cut[b]]:  # the whole tree is walked later against what came
            row, nodes = self.rows[b], widths[b]
            if row.shadow is None and whole[b] > 1:
                row.shadow, row.shadow_tokens = drafted[b].tree, []
            tree = cut_tree(drafted[b].tree, nodes)  # the policy hears of no lookup drafts: it learns nothing from a cut
            drafted[b] = Drafted(tree=tree, ends={k: min(e, nodes) for k, e in drafted[b].ends.items()}, found={})
            steps[b] = self.layout.build(tree, None, t=row.length)
            plans[b] = replace(plans[b], window=0) if nodes > 1 else replace(
                plans[b], window=0, guesses=0, draft_len=0, drafts=0, recycle=0)
        ids, positions, block, keep, where = pad_steps(steps, [row.length for row in self.rows])
        base = self.cache.length
        holes = len(self.rows) * base - int(self.cache.visible[:, :base].sum())
        self.cache.reserve(ids.shape[1])
        mask = self._mask(block, positions)
        tf = self.clock.now()
        logits = self.runner.rows_forward(ids, positions, self.cache, mask=mask, keep=keep)  # [B, m, V]
        forward_s = self.clock.since(tf)  # the forward alone (the clock waits for the device): not the rows' verifying
        kept, new_tokens = [], {}
        for b, (row, step, d) in enumerate(zip(self.rows, steps, drafted)):
            row_logits = logits[b, where[b]]  # [m_b, V]: this row's kept positions
            path, new = row.verifier.verify(d.tree, row_logits[: step.n_tree], row.drafter.tokens)
            row.drafter.observe(d.tree, row_logits[: step.n_tree])
            if step.window_levels:
                row.drafter.advance_window(row_logits[step.n_tree :].argmax(-1).tolist())
            kept.append([0] + path)
            new_tokens[row.key] = new
        self.cache.keep(base, kept, [row.length for row in self.rows])
        step_s = self.clock.since(t0)
        width = ids.shape[1]
        self.log.steps.append(BatchStep(rows=len(self.rows), packed=sum(s.size for s in steps), width=width, prefix=base,
                                        holes=holes, alone=sum(w == 1 < n for w, n in zip(widths, whole)),
                                        cut=sum(1 < w < n for w, n in zip(widths, whole)), forward_ms=forward_s * 1e3, step_ms=step_s * 1e3,
                                        rested=rested))
        self._finish_step(steps, drafted, plans, kept, cut, new_tokens, step_s, forward_s)
        return new_tokens

    def _finish_step(self, steps, drafted, plans, kept, cut, new_tokens, step_s: float, forward_s: float) -> None:
        """Per row: the policy's update, the log line, the commit; finished rows leave the batch."""
        staying = []
        for i, (row, step, d, plan, k, was_cut) in enumerate(zip(self.rows, steps, drafted, plans, kept, cut)):
            lookup = d.found.get(PromptLookupSource.name, Candidates())
            path = k[1:]
            outcome = StepOutcome(
                plan=plan, packed=step.size, nodes={name: d.nodes(name) for name in d.ends},
                window_tokens=step.size - len(d.tree), accepted=len(path), accepted_from=d.accepted_from(path),
                step_s=step_s, forward_s=forward_s, longest_draft=max((len(x) for x in lookup.drafts), default=0),
                match_len=lookup.match_len, shadow=lookup.shadow, emitted=tuple(new_tokens[row.key]),
            )  # fmt: skip
            tu = self.clock.now()
            row.policy.update(outcome)
            row.log.policy_ms += self.clock.since(tu) * 1e3
            new = new_tokens[row.key]
            row.log.steps.append(StepRecord.of(outcome, new_tokens=len(new), windowed=row.drafter.window is not None))
            row.length += len(k)
            if len(d.tree) > 1 and not was_cut:  # an uncut tree: its path tells every cut
                row.accepts.learn(path)
            row.follow_shadow(new)
            row.done = self._commit(row, new)
            if row.done:
                self.finished[row.key] = row
            else:
                staying.append(i)
        if len(staying) < len(self.rows):
            self.cache.select(staying)
            self.rows = [self.rows[i] for i in staying]

    def _mask(self, block: torch.Tensor, positions: torch.Tensor):
        """The additive mask(s) [B, 1, K, L + K]: each row's own committed columns, then its block."""
        n, k = block.shape[0], block.shape[1]
        length = self.cache.length
        prefix = self.cache.visible[:, :length]  # [B, L]
        visible = torch.cat([prefix[:, None, :].expand(n, k, length), block], dim=2)  # [B, K, L + K]
        full = additive(visible, self.runner.dtype)
        window = self.runner.sliding_window
        if window is None:
            return full
        keys = torch.cat([self.cache.positions[:, :length], positions], dim=1)  # [B, L + K]
        near = keys[:, None, :] > positions[:, :, None] - window  # [B, K, L + K]
        return self.runner.per_layer_type(full, additive(visible & near, self.runner.dtype))

    def cancel(self, key: int) -> Row:
        """Drop a running row now, between steps (its client went away); it is not among ``finished``."""
        index = next((i for i, r in enumerate(self.rows) if r.key == key), None)
        if index is None:
            raise KeyError(f"no running row {key}")
        row = self.rows[index]
        row.done, row.log.stop_reason = True, "cancelled"
        staying = [i for i in range(len(self.rows)) if i != index]
        self.cache.select(staying)
        self.rows = [self.rows[i] for i in staying]
        return row

    def run(self) -> dict[int, Row]:
        """Step until every row is done; returns the finished rows by key."""
        while self.rows:
            self.step()
        return self.finished

    def close(self) -> None:
        """Restore the model's own attention implementation (a flash model ends as it began)."""
        self.runner.attention.set(self.runner.loaded_attention)


def pad_steps(steps: Sequence[PackedStep], lengths: Sequence[int]):
    """Stack per-row packed steps into one [B, K] forward. Returns ids [B, K], positions [B, K], the
    block visibility [B, K, K] (padding sees only itself), the union of kept indices [m] and, per
    row, where its own kept indices sit in that union."""
    n, k = len(steps), max(s.size for s in steps)
    ids = np.empty((n, k), dtype=np.int64)
    pos = np.empty((n, k), dtype=np.int64)
    block = np.zeros((n, k, k), dtype=bool)
    block[:, np.arange(k), np.arange(k)] = True
    for b, (s, t) in enumerate(zip(steps, lengths)):
        size = s.size
        ids[b] = int(s.input_ids[0, 0])  # padding: the row's root token at the root's position
        pos[b] = t
        ids[b, :size] = s.input_ids[0].cpu().numpy()
        pos[b, :size] = s.block_positions
        block[b, :size, :size] = s.block_visible
    keeps = [s.keep.cpu().numpy() for s in steps]
    union = np.unique(np.concatenate(keeps))
    where = [torch.from_numpy(np.searchsorted(union, kb)) for kb in keeps]
    device = steps[0].input_ids.device
    return (torch.from_numpy(ids).to(device), torch.from_numpy(pos).to(device), torch.from_numpy(block).to(device),
            torch.from_numpy(union).to(device), [w.to(device) for w in where])


def decode_batch(model: torch.nn.Module, requests: Sequence[RowRequest], *, attention: AttentionPlan | None = None,
                 clock: DeviceClock | None = None, step_cost: Callable[[float], float] | None = None,
                 prefill_choice: PrefillChoice | None = None,
                 runner: ModelRunner | None = None) -> tuple[list[Row], BatchLog]:
    """Decode ``requests`` together; returns the rows in request order and the batch's step log."""
    widest = max((len(r.prompt) + r.max_new_tokens + r.config.packed_size() + 8 for r in requests), default=64)
    decoder = BatchDecoder(model, attention=attention, clock=clock, capacity=widest, step_cost=step_cost,
                           prefill_choice=prefill_choice, runner=runner)
    try:
        keys = decoder.add_many(requests)
        finished = decoder.run()
    finally:
        decoder.close()
    return [finished[k] for k in keys], decoder.log
