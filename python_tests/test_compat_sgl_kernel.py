"""sgl-kernel's own speculative test cases, ported to :mod:`specdec_kernels.compat.sgl_kernel`.

Sources (sgl-project/sglang):

- ``sgl-kernel/tests/speculative/test_speculative_sampling.py``: the exact cases of
  ``tree_speculative_sampling_target_only`` (thresholds 1/1: expected outputs; thresholds 0/0,
  sgl-kernel's lossy mode: refused here with a ValueError).
- ``sgl-kernel/tests/speculative/test_eagle_utils.py``: ``verify_tree_greedy``.
- ``test/srt/test_build_eagle_tree.py``: ``build_tree_kernel_efficient`` (positions and
  retrieve links of a two-request EAGLE tree, topk 4, depth 4, 8 draft tokens).

Also: the first-sibling rule on repeated siblings (sgl-kernel's semantics, where this
package's own greedy tree verification takes the longest path), the ``accept_index`` depth
limit, the other mask modes, and a frequency check that target-only sampling is lossless.
"""

import pytest
import torch
import torch.nn.functional as F

from python_tests.compat_helpers import device  # noqa: F401  (fixture)
from python_tests.sampling_cases import chi_square_pvalue
from specdec_kernels import ops
from specdec_kernels.compat import sgl_kernel
from specdec_kernels.sampling import SamplingParams


def eagle_case(dev):
    """The two-request tree shared by sgl-kernel's verification tests."""
    t = lambda rows: torch.tensor(rows, dtype=torch.int64, device=dev)  # noqa: E731
    candidates = t([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrive_index = t([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    next_token = t([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = t([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    logits = torch.full((2, 6, 20), 1.0, device=dev)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = 10
    logits[1, 0, 11] = logits[1, 4, 12] = 10
    for i in range(2):
        for j in range(6):
            if logits[i, j].max() < 10:
                logits[i, j, 18] = 10
    return candidates, retrive_index, next_token, next_sibling, logits


def outputs(dev, predicts=12, batch=2, steps=4):
    return (
        torch.full((predicts,), -1, dtype=torch.int32, device=dev),
        torch.full((batch, steps), -1, dtype=torch.int32, device=dev),
        torch.zeros(batch, dtype=torch.int32, device=dev),
    )


EXPECTED_PREDICTS = [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
EXPECTED_ACCEPT_INDEX = [[0, 3, 4, 5], [6, 10, 11, -1]]
EXPECTED_ACCEPT_NUM = [3, 2]


def test_verify_tree_greedy(device):
    candidates, retrive_index, next_token, next_sibling, logits = eagle_case(device)
    predicts, accept_index, accept_num = outputs(device)
    sgl_kernel.verify_tree_greedy(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=retrive_index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        target_predict=torch.argmax(logits, -1),
    )
    assert predicts.tolist() == EXPECTED_PREDICTS
    assert accept_index.tolist() == EXPECTED_ACCEPT_INDEX
    assert accept_num.tolist() == EXPECTED_ACCEPT_NUM


@pytest.mark.parametrize("spelling", ["retrive", "retrieve"])
def test_tree_speculative_sampling_target_only_lossless(device, spelling):
    """Thresholds 1/1, temperature 0.01 (one-hot target): sgl-kernel's expected outputs,
    whatever the coins."""
    candidates, retrive_index, next_token, next_sibling, logits = eagle_case(device)
    target_probs = F.softmax(logits / 0.01, -1)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        predicts, accept_index, accept_num = outputs(device)
        sgl_kernel.tree_speculative_sampling_target_only(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=candidates,
            **{
                f"{spelling}_index": retrive_index,
                f"{spelling}_next_token": next_token,
                f"{spelling}_next_sibling": next_sibling,
            },
            uniform_samples=torch.rand(2, 6, generator=gen).to(device),
            uniform_samples_for_final_sampling=torch.rand(2, generator=gen).to(device),
            target_probs=target_probs,
            draft_probs=torch.zeros_like(target_probs),
            threshold_single=1,
            threshold_acc=1,
            deterministic=True,
        )
        assert predicts.tolist() == EXPECTED_PREDICTS
        assert accept_index.tolist() == EXPECTED_ACCEPT_INDEX
        assert accept_num.tolist() == EXPECTED_ACCEPT_NUM


@pytest.mark.parametrize("thresholds", [(0, 0), (0.5, 1.0), (1.0, 0.3)])
def test_lossy_thresholds_are_refused(device, thresholds):
    """sgl-kernel's second case (thresholds 0/0, which accepts every first child) is its lossy
    mode: the adapter raises instead of silently sampling losslessly."""
    candidates, retrive_index, next_token, next_sibling, logits = eagle_case(device)
    target_probs = F.softmax(logits / 0.01, -1)
    with pytest.raises(ValueError, match="only the lossless mode"):
        sgl_kernel.tree_speculative_sampling_target_only(
            *outputs(device),
            candidates,
            retrive_index,
            next_token,
            next_sibling,
            torch.rand(2, 6, device=device),
            torch.rand(2, device=device),
            target_probs,
            torch.zeros_like(target_probs),
            threshold_single=thresholds[0],
            threshold_acc=thresholds[1],
        )


def test_greedy_repeated_siblings_take_the_first(device):
    """Root children 1 and 2 both carry token 5 (the target's prediction); only node 2 has a
    matching child. sgl-kernel takes the first sibling (path 0-1, one draft); this package's
    own greedy verify_tree takes the longest path (0-2-3, two drafts)."""
    t = lambda rows: torch.tensor(rows, dtype=torch.int64, device=device)  # noqa: E731
    candidates = t([[9, 5, 5, 6]])
    retrive_index = t([[0, 1, 2, 3]])
    next_token = t([[1, -1, 3, -1]])
    next_sibling = t([[-1, 2, -1, -1]])
    target_predict = t([[5, 7, 6, 8]])
    predicts, accept_index, accept_num = outputs(device, predicts=4, batch=1, steps=4)
    sgl_kernel.verify_tree_greedy(
        predicts,
        accept_index,
        accept_num,
        candidates,
        retrive_index,
        next_token,
        next_sibling,
        target_predict,
    )
    assert accept_index.tolist() == [[0, 1, -1, -1]] and accept_num.tolist() == [1]
    assert predicts.tolist() == [5, 7, -1, -1]

    logits = torch.full((1, 4, 10), -5.0, device=device)
    logits[0, torch.arange(4), target_predict[0]] = 5.0
    nodes, _, count = ops.verify_tree(
        candidates, t([[-1, 0, 0, 2]]), logits, None, SamplingParams.create(1, device=device)
    )
    assert count.tolist() == [2] and nodes[0, :2].tolist() == [2, 3]


def test_sibling_order_not_index_order(device):
    """Siblings linked in an order other than their node numbers: the first *linked* match
    wins (node 3 before node 1, both token 4)."""
    t = lambda rows: torch.tensor(rows, dtype=torch.int64, device=device)  # noqa: E731
    candidates = t([[0, 4, 2, 4]])
    next_token = t([[3, 2, -1, -1]])
    next_sibling = t([[-1, -1, -1, 1]])
    predicts, accept_index, accept_num = outputs(device, predicts=4, batch=1, steps=3)
    sgl_kernel.verify_tree_greedy(
        predicts,
        accept_index,
        accept_num,
        candidates,
        t([[0, 1, 2, 3]]),
        next_token,
        next_sibling,
        t([[4, 2, 0, 0]]),
    )
    assert accept_index.tolist() == [[0, 3, -1]] and predicts.tolist() == [4, -1, -1, 0]


def test_accept_index_width_limits_the_path(device):
    """num_speculative_tokens = accept_index.shape[1]: at most that many minus one drafts."""
    candidates, retrive_index, next_token, next_sibling, logits = eagle_case(device)
    predicts, accept_index, accept_num = outputs(device, steps=3)
    sgl_kernel.verify_tree_greedy(
        predicts,
        accept_index,
        accept_num,
        candidates,
        retrive_index,
        next_token,
        next_sibling,
        torch.argmax(logits, -1),
    )
    assert accept_index.tolist() == [[0, 3, 4], [6, 10, 11]]
    assert accept_num.tolist() == [2, 2]
    assert predicts.tolist() == [3, -1, -1, 4, 5, -1, 11, -1, -1, -1, 12, 18]


def test_target_only_sampling_is_lossless(device):
    """20000 copies of one request with random coins: the token after the root follows the
    target distribution (Pearson chi-square), and the first child is accepted with its target
    probability."""
    vocab, n = 12, 20000
    gen = torch.Generator().manual_seed(7)
    p = torch.softmax(2 * torch.randn(4, vocab, generator=gen), -1)
    candidates = torch.tensor([0, 3, 5, 7]).repeat(n, 1)  # root children 1, 2; node 3 under 1
    rows = lambda x: x.repeat(n, 1).to(device)  # noqa: E731
    predicts, accept_index, accept_num = outputs(device, predicts=4 * n, batch=n, steps=3)
    sgl_kernel.tree_speculative_sampling_target_only(
        predicts,
        accept_index,
        accept_num,
        candidates.to(device),
        (torch.arange(n).unsqueeze(1) * 4 + torch.arange(4)).to(device),
        rows(torch.tensor([1, 3, -1, -1])),
        rows(torch.tensor([-1, 2, -1, -1])),
        torch.rand(n, 4, generator=gen).to(device),
        torch.rand(n, generator=gen).to(device),
        p.repeat(n, 1, 1).to(device),
    )
    first = predicts.view(n, 4)[:, 0].long().cpu()
    assert chi_square_pvalue(torch.bincount(first, minlength=vocab), p[0]) > 1e-3
    rate = float((accept_index[:, 1].cpu() == torch.arange(n) * 4 + 1).float().mean())
    assert abs(rate - float(p[0, 3])) < 5 * (p[0, 3] * (1 - p[0, 3]) / n) ** 0.5


def _organize_draft_results(score_list, token_list, parents_list, num_draft_token):
    """What sglang's ``organize_draft_results`` computes before the kernel: the top scored
    drafts (indices sorted), their tokens, and the parents of every expansion."""
    scores = torch.cat(score_list, 1).flatten(1)
    selected = torch.sort(torch.topk(scores, num_draft_token - 1, -1).indices).values
    tokens = torch.gather(torch.cat(token_list, 1), 1, selected)
    return torch.cat(parents_list[:-1], 1), selected, tokens


SCORES = [
    [
        [[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]],
        [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]],
    ],
    [
        [
            [6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03],
            [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
            [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08],
            [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05],
        ],
        [
            [8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02],
            [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
            [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05],
            [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08],
        ],
    ],
    [
        [
            [6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06],
            [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
            [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05],
            [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05],
        ],
        [
            [2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03],
            [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
            [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04],
            [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04],
        ],
    ],
    [
        [
            [6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06],
            [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
            [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05],
            [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05],
        ],
        [
            [5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04],
            [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
            [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03],
            [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04],
        ],
    ],
]
TOKENS = [
    [[29896, 29906, 29900, 29945], [13, 2, 29871, 28956]],
    [
        [
            29889,
            29974,
            29945,
            29900,
            29974,
            29922,
            29930,
            29958,
            29889,
            29974,
            29930,
            29945,
            29974,
            29922,
            29930,
            29958,
        ],
        [22550, 4136, 16492, 8439, 29871, 2, 3001, 13, 2, 13, 29906, 29946, 2, 13, 29871, 259],
    ],
    [
        [
            29946,
            29945,
            29953,
            29906,
            29896,
            29945,
            29900,
            29906,
            29896,
            29945,
            29906,
            29953,
            29896,
            29945,
            29906,
            29946,
        ],
        [
            29871,
            2,
            29901,
            29889,
            29871,
            2,
            395,
            259,
            29901,
            29871,
            2,
            29889,
            3001,
            1234,
            7146,
            2186,
        ],
    ],
    [
        [
            29946,
            29974,
            29945,
            29930,
            29889,
            29922,
            29974,
            29930,
            29974,
            29946,
            29930,
            29922,
            29889,
            29974,
            29945,
            29922,
        ],
        [
            29941,
            29906,
            2,
            29946,
            29871,
            450,
            319,
            14990,
            29946,
            29941,
            2,
            29906,
            29871,
            2,
            3001,
            13,
        ],
    ],
]
PARENTS = [
    [[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]],
    [[4, 8, 9, 10], [4, 5, 6, 7]],
    [[20, 24, 21, 28], [24, 28, 20, 21]],
    [[36, 40, 41, 44], [36, 40, 44, 45]],
]


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_build_tree_kernel_efficient(device, mode):
    verified_id = torch.tensor([29974, 13], device=device)
    parent_list, selected, draft_tokens = _organize_draft_results(
        [torch.tensor(s, device=device) for s in SCORES],
        [torch.tensor(t, device=device) for t in TOKENS],
        [torch.tensor(p, device=device) for p in PARENTS],
        8,
    )
    seq_lens = torch.tensor([5, 10], device=device)
    batch, n = 2, 8
    tree_mask = {
        0: torch.full((int(seq_lens.sum()) * n + n * n * batch,), True, device=device),
        1: torch.full((batch * n * n,), True, device=device),
        2: torch.zeros(batch * n, dtype=torch.uint8, device=device),
    }[mode]
    positions = torch.empty(batch * n, dtype=torch.int64, device=device)
    retrive = torch.full((3, batch, n), -1, dtype=torch.int64, device=device)
    sgl_kernel.build_tree_kernel_efficient(
        parent_list,
        selected,
        seq_lens,
        tree_mask,
        positions,
        retrive[0],
        retrive[1],
        retrive[2],
        4,
        4,
        n,
        mode,
    )
    assert positions.tolist() == [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
    assert retrive[0].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert retrive[1].tolist() == [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
    assert retrive[2].tolist() == [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
    flat_tokens = torch.cat([verified_id.unsqueeze(1), draft_tokens], 1).flatten()
    assert flat_tokens.tolist() == [
        29974,
        29896,
        29906,
        29889,
        29974,
        29946,
        29896,
        29946,
        13,
        13,
        22550,
        4136,
        16492,
        8439,
        29871,
        29941,
    ]

    # The mask rows: each node sees itself and its ancestors (from the links above).
    parents = torch.full((batch, n), -1)
    for b in range(batch):
        for i in range(n):
            c = retrive[1, b, i].item()
            while c != -1:
                parents[b, c] = i
                c = retrive[2, b, c].item()
    expected = torch.zeros(batch, n, n, dtype=torch.bool)
    for b in range(batch):
        for i in range(n):
            j = i
            while j != -1:
                expected[b, i, j] = True
                j = parents[b, j].item()
    if mode == 0:
        rows = [
            tree_mask[: 5 * n + n * n].view(n, 5 + n),
            tree_mask[5 * n + n * n :].view(n, 10 + n),
        ]
        for b, (row, length) in enumerate(zip(rows, (5, 10))):
            assert row[:, :length].all()  # the prefix columns keep the caller's True
            assert torch.equal(row[:, length:].cpu(), expected[b])
    elif mode == 1:
        assert torch.equal(tree_mask.view(batch, n, n).cpu(), expected)
    else:
        bits = (tree_mask.view(batch, n, 1).long().cpu() >> torch.arange(n)) & 1
        assert torch.equal(bits.bool(), expected)


def test_bad_inputs(device):
    candidates, retrive_index, next_token, next_sibling, logits = eagle_case(device)
    predicts, accept_index, accept_num = outputs(device)
    with pytest.raises(ValueError, match="Expected 'predicts' to be of type torch.int32"):
        sgl_kernel.verify_tree_greedy(
            predicts.long(),
            accept_index,
            accept_num,
            candidates,
            retrive_index,
            next_token,
            next_sibling,
            torch.argmax(logits, -1),
        )
    with pytest.raises(ValueError, match="not both"):
        sgl_kernel.verify_tree_greedy(
            predicts,
            accept_index,
            accept_num,
            candidates,
            retrive_index,
            next_token,
            next_sibling,
            torch.argmax(logits, -1),
            retrieve_index=retrive_index,
        )
    with pytest.raises(ValueError, match=r"retrive_next_token must be \[2, 6\]"):
        sgl_kernel.verify_tree_greedy(
            predicts,
            accept_index,
            accept_num,
            candidates,
            retrive_index,
            next_token[:, :5],
            next_sibling,
            torch.argmax(logits, -1),
        )
    bad_links = torch.tensor([[2, -1, 1, -1, -1, -1]] * 2, device=device)  # child 1 under node 2
    with pytest.raises(ValueError, match="parent"):
        sgl_kernel.verify_tree_greedy(
            predicts,
            accept_index,
            accept_num,
            candidates,
            retrive_index,
            bad_links,
            torch.full_like(next_sibling, -1),
            torch.argmax(logits, -1),
        )
