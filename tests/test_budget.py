import itertools
import random

import pytest

from autolade.engine.budget import TIE, AcceptanceCurve, cut_tree, step_widths
from autolade.engine.layout import DraftTree


def learned(path, steps=60):
    curve = AcceptanceCurve()
    for _ in range(steps):
        curve.learn(path)
    return curve


def test_a_path_tells_every_cut_what_it_would_have_accepted():
    curve = learned([1, 2, 5])  # the root's child 1, its child 2, then node 5 (a later draft's)
    assert curve.at(1) == 0.0  # the root alone accepts nothing
    assert curve.at(2) == pytest.approx(1.0, abs=1e-4)  # node 1 only
    assert curve.at(3) == pytest.approx(2.0, abs=1e-4)
    assert curve.at(5) == pytest.approx(2.0, abs=1e-4)  # node 5 is not packed yet
    assert curve.at(6) == pytest.approx(3.0, abs=1e-4)
    assert curve.at(500) == pytest.approx(3.0, abs=1e-4)  # cuts past the tracked ones: the widest tracked
    assert learned([]).at(40) == pytest.approx(0.0, abs=1e-4)


def test_the_prior_rises_with_the_nodes_packed():
    prior = AcceptanceCurve()
    assert prior.at(1) == 0.0
    assert 0 < prior.at(2) < prior.at(4) < prior.at(8) == prior.at(30) == 1.0


def test_without_a_curve_or_on_a_flat_one_every_row_packs_all_it_drafted():
    sizes, trees = [12, 4, 1, 20], [12, 4, 1, 14]
    curves = [AcceptanceCurve() for _ in sizes]
    assert step_widths(None, sizes, trees, curves) == sizes
    assert step_widths(lambda k: 10.0, sizes, trees, curves) == sizes


def test_when_a_packed_token_costs_a_step_plain_greedy_rows_win():
    sizes = [12, 4, 3, 20]
    assert step_widths(lambda k: k, sizes, sizes, [AcceptanceCurve() for _ in sizes]) == [1, 1, 1, 1]


def test_rows_that_accept_little_are_cut_to_the_width_the_others_pay_for():
    sizes = [16, 16, 16, 16]
    good, poor = learned([1, 2, 3, 4]), learned([])
    widths = step_widths(lambda k: 100.0 + k, sizes, sizes, [good, good, poor, poor])
    assert widths == [5, 5, 5, 5]  # 4 accepted drafts need 5 nodes; past that no row gains anything
    assert step_widths(lambda k: 100.0 + k, sizes, sizes, [poor] * 4) == [1, 1, 1, 1]


def test_a_row_too_wide_for_the_step_loses_its_window_first():
    sizes, trees = [10, 3], [4, 3]  # row 0: a 4-node tree and a 6-token window
    curves = [learned([1, 2, 3]), learned([1, 2])]
    assert step_widths(lambda k: 100.0 + 3 * k, sizes, trees, curves) == [4, 3]


def brute_force(cost, sizes, trees, curves):
    """The best expected tokens per ms over every choice of packed tokens per row."""
    choices = [sorted({size, *range(1, tree + 1)}) for size, tree in zip(sizes, trees)]
    best = 0.0
    for plan in itertools.product(*choices):
        accepted = sum(c.at(min(p, t)) for c, p, t in zip(curves, plan, trees))
        best = max(best, (len(plan) + accepted) / cost(len(plan) * max(plan)))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_chosen_widths_are_the_best_of_every_per_row_choice(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    trees = [rng.randint(1, 7) for _ in range(n)]
    sizes = [t + rng.choice([0, 0, 3, 5]) for t in trees]
    curves = []
    for _ in trees:
        path = sorted(rng.sample(range(1, 8), rng.randint(0, 3)))
        curves.append(learned(path, steps=rng.randint(1, 5)))
    slope = rng.choice([0.0, 0.5, 3.0, 20.0])
    cost = lambda k: 40.0 + slope * k
    widths = step_widths(cost, sizes, trees, curves)
    rate = (n + sum(c.at(min(w, t)) for c, w, t in zip(curves, widths, trees))) / cost(n * max(widths))
    best = brute_force(cost, sizes, trees, curves)
    assert best / TIE <= rate <= best * (1 + 1e-12)  # the best, or every row whole when that is within TIE of it
    assert all(w == s or w <= t for w, s, t in zip(widths, sizes, trees))  # all of it, or a cut of its tree


def test_a_cut_tree_is_the_first_nodes_and_walks_like_the_whole_one_up_to_the_cut():
    tree = DraftTree(7)
    tree.add([1, 2, 3])
    tree.add([1, 5])
    tree.add([4, 6])
    small = cut_tree(tree, 4)  # 7 -> 1 -> 2 -> 3
    assert small.tokens == [7, 1, 2, 3] and small.parent == [-1, 0, 1, 2]
    assert small.children == [{1: 1}, {2: 2}, {3: 3}, {}]
    argmax = {0: 1, 1: 5, 2: 3, 3: 9, 4: 0, 5: 0, 6: 0}
    assert tree.walk(argmax)[0] == [1, 4]  # the whole tree follows 1 then 5
    assert small.walk(argmax)[0] == [1]  # the cut one stops where node 4 is missing
    assert len(tree.tokens) == 7, "cutting leaves the whole tree as it was"


def test_a_cut_that_promises_less_than_the_tie_margin_is_not_made():
    sizes = [8, 8]
    curves = [learned([1, 2, 3, 4, 5, 6, 7])] * 2  # every node accepted: each row 7 drafts at width 8
    flat = lambda k: 100.0 + 0.01 * k
    assert step_widths(flat, sizes, sizes, curves) == [8, 8]
    tail = [learned([1])] * 2  # only the first node pays: a cut to 2 saves 12 of 16 tokens
    assert step_widths(lambda k: 100.0 + 0.3 * k, sizes, sizes, tail) == [8, 8]  # 3.4% cheaper: within TIE
    assert step_widths(lambda k: 100.0 + 1.0 * k, sizes, sizes, tail) == [2, 2]  # 10.7% cheaper: cut


def test_a_width_the_runner_pads_is_priced_as_what_runs():
    """A compiled batch runner runs a one-column step as two columns: there the second column costs nothing, so a
    draft the eager pricing would leave out (each token costs a tenth of a step) goes in."""
    sizes = [6, 6, 6, 6]
    weak = learned([])
    weak.learn([1])  # the first draft node accepted once: 0.2 expected
    cost = lambda k: 100.0 + 10.0 * k
    assert step_widths(cost, sizes, sizes, [weak] * 4) == [1, 1, 1, 1]
    padded = lambda rows, width: rows * max(width, 2)
    assert step_widths(cost, sizes, sizes, [weak] * 4, step_tokens=padded) == [2, 2, 2, 2]
