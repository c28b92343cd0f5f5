import torch

from autolade.engine.layout import DraftTree, Layout, additive_mask, window_visibility


def test_tree_merges_prefixes_and_walks_greedily():
    tree = DraftTree(root_token=1)
    assert tree.add([2, 3, 4]) == 3
    assert tree.add([2, 3, 5]) == 1  # shares 2, 3
    assert tree.add([6]) == 1
    assert tree.tokens == [1, 2, 3, 4, 5, 6] and tree.depth == [0, 1, 2, 3, 3, 1]
    # argmax after each node: root->2, 2->3, 3->5, 5->9 (bonus)
    argmax = [2, 3, 5, 0, 9, 0]
    path, new = tree.walk(argmax)
    assert path == [1, 2, 4] and new == [2, 3, 5, 9]
    path, new = tree.walk([7, 0, 0, 0, 0, 0])
    assert path == [] and new == [7]
    vis = tree.visibility()
    assert vis[4].nonzero()[0].tolist() == [0, 1, 2, 4]
    assert vis[5].nonzero()[0].tolist() == [0, 5]


def test_tree_budget_caps_new_nodes():
    tree = DraftTree(0)
    assert tree.add([1, 2, 3, 4], budget=2) == 2
    assert len(tree) == 3


def test_window_visibility_is_the_jacobi_trajectory():
    vis = window_visibility(levels=3, width=3)
    # level 3 (index 2), column 1 sees level 1 cols 0..1, level 2 col 1, itself
    q = 2 * 3 + 1
    assert vis[q].nonzero()[0].tolist() == [0, 1, 4, 7]
    assert vis[0].nonzero()[0].tolist() == [0]


def test_packed_positions_and_mask_blocks():
    tree = DraftTree(5)
    tree.add([6, 7])
    rows = [[10, 11], [20, 21]]
    step = Layout(device=torch.device("cpu")).build(tree, rows, t=100)
    assert step.input_ids[0].tolist() == [5, 6, 7, 10, 11, 20, 21]
    assert step.position_ids[0].tolist() == [100, 101, 102, 101, 102, 102, 103]
    assert step.keep.tolist() == [0, 1, 2, 5, 6]  # tree + newest level
    v = step.block_visible
    assert not v[3:, 1:3].any() and not v[1:3, 3:].any()  # branches never see each other
    assert v[3:, 0].all()  # everything sees the last accepted token
    mask = additive_mask(step, prefix_len=4, dtype=torch.float32, device=torch.device("cpu"))
    assert mask.shape == (1, 1, 7, 11)
    assert (mask[0, 0, :, :4] == 0).all()
    assert mask[0, 0, 1, 4 + 3] == torch.finfo(torch.float32).min


def test_sliding_window_mask_hides_old_positions():
    tree = DraftTree(5)
    tree.add([6])
    step = Layout(device=torch.device("cpu")).build(tree, None, t=20)
    mask = additive_mask(step, prefix_len=20, dtype=torch.float32, device=torch.device("cpu"), sliding_window=8)
    visible = (mask[0, 0] == 0).numpy()
    # query at position 21 sees keys at positions > 13 only
    assert visible[1].nonzero()[0].tolist() == list(range(14, 20)) + [20, 21]
    # the last accepted token (position 20) sees positions 13..20, not its tree child
    assert visible[0].nonzero()[0].tolist() == list(range(13, 21))
