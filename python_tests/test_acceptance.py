"""Acceptance rules and proposal blocks (``decoding/acceptance.py``, ``decoding/drafter.py``):
each rule's verdict is its op's decision in the one form the engine commits, a chain's block is
the tree the chain op verifies, and a drafter that asks for the greedy rule gets the target's
greedy tokens from a sampling request."""

import dataclasses

import pytest
import torch

from python_tests.decoding_helpers import hf_greedy, tiny_model
from specdec_kernels import ops
from specdec_kernels.decoding import GREEDY, LOSSLESS, PromptLookupDrafter, Typical, generate
from specdec_kernels.decoding.drafter import ChainProposal, TreeProposal
from specdec_kernels.sampling import SamplingParams

VOCAB = 11


def chain_case(gen, batch=3, k=4):
    drafts = torch.randint(0, VOCAB, (batch, k), generator=gen)
    num_draft = torch.tensor([k, 1, 0][:batch])
    logits = torch.randn(batch, k + 1, VOCAB, generator=gen) * 3
    return drafts, num_draft, logits


def tree_case(gen):
    parents = torch.tensor([[-1, 0, 0, 1, 1, 3], [-1, 0, 1, -2, -2, -2]])
    tokens = torch.randint(0, VOCAB, parents.shape, generator=gen)
    logits = torch.randn(*parents.shape, VOCAB, generator=gen) * 3
    return tokens, parents, logits


def params_for(batch, temperature):
    return SamplingParams.create(batch, temperature=temperature, seed=list(range(batch)))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_rules_give_their_ops_decisions(gen, temperature):
    drafts, num_draft, logits = chain_case(gen)
    params, offsets = params_for(3, temperature), torch.tensor([0, 5, 9])
    tokens, accepted = ops.verify_chain(drafts, num_draft, logits, None, params, offsets)
    verdict = LOSSLESS.verify_chain(drafts, num_draft, logits, None, params, offsets)
    assert torch.equal(verdict.tokens, tokens) and torch.equal(verdict.num_accepted, accepted)
    assert verdict.rows.tolist() == [list(range(5))] * 3  # the chain's first rows, root first
    typical = Typical(0.2, 0.5).verify_chain(drafts, num_draft, logits, None, params, offsets)
    want = ops.typical_verify_chain(drafts, num_draft, logits, params, offsets, 0.2, 0.5)
    assert torch.equal(typical.tokens, want[0]) and torch.equal(typical.num_accepted, want[1])

    tokens, parents, logits = tree_case(gen)
    params, offsets = params_for(2, temperature), torch.tensor([3, 0])
    nodes, emitted, accepted = ops.verify_tree(tokens, parents, logits, None, params, offsets)
    verdict = LOSSLESS.verify_tree(tokens, parents, logits, None, params, offsets)
    assert torch.equal(verdict.tokens, emitted) and torch.equal(verdict.num_accepted, accepted)
    for b in range(2):  # the root, then the accepted nodes
        n = int(accepted[b])
        assert verdict.rows[b, : n + 1].tolist() == [0] + nodes[b, :n].tolist()


def test_greedy_rule_ignores_the_temperature(gen):
    drafts, num_draft, logits = chain_case(gen)
    sampling, greedy = params_for(3, 0.9), params_for(3, 0.0)
    offsets = torch.zeros(3, dtype=torch.int64)
    got = GREEDY.verify_chain(drafts, num_draft, logits, None, sampling, offsets)
    want = ops.verify_chain(drafts, num_draft, logits, None, greedy, offsets)
    assert torch.equal(got.tokens, want[0]) and torch.equal(got.num_accepted, want[1])
    tokens, parents, logits = tree_case(gen)
    got = GREEDY.verify_tree(tokens, parents, logits, None, params_for(2, 0.9), offsets[:2])
    want = ops.verify_tree(tokens, parents, logits, None, params_for(2, 0.0), offsets[:2])
    assert torch.equal(got.tokens, want[1]) and torch.equal(got.num_accepted, want[2])


def test_chain_block_is_the_tree_the_chain_op_verifies(gen):
    drafts, num_draft, logits = chain_case(gen)
    pending = torch.tensor([7, 8, 9])
    proposal = ChainProposal(drafts, num_draft, num_draft.tolist())
    tokens, parents = proposal.block(pending)
    assert tokens[:, 0].tolist() == [7, 8, 9] and torch.equal(tokens[:, 1:], drafts)
    assert parents.tolist() == [[-1, 0, 1, 2, 3], [-1, 0, -2, -2, -2], [-1, -2, -2, -2, -2]]
    params = params_for(3, 0.0)  # greedy: the tree op decides as the chain op does
    chain = proposal.verify(logits, params, torch.zeros(3, dtype=torch.int64))
    _, tree_tokens, tree_accepted = ops.verify_tree(tokens, parents, logits, None, params)
    assert torch.equal(chain.num_accepted, tree_accepted)
    for b, n in enumerate(chain.num_accepted.tolist()):
        assert chain.tokens[b, : n + 1].tolist() == tree_tokens[b, : n + 1].tolist()
    tree = TreeProposal(*tree_case(gen)[:2], depths=[3, 2])
    assert tree.block(pending[:2]) == (tree.tokens, tree.parents)
    assert tree.acceptance == LOSSLESS and proposal.acceptance == LOSSLESS


class GreedyLookup(PromptLookupDrafter):
    """Prompt lookup whose proposals ask for the greedy rule."""

    def propose(self, state):
        return dataclasses.replace(super().propose(state), acceptance=GREEDY)


def test_a_drafter_asking_for_the_greedy_rule_decodes_greedily():
    model = tiny_model("llama", vocab=VOCAB, layers=2, seed=3)
    prompts = [[1, 2, 3, 1, 2, 3, 1], [4, 5, 4, 5]]
    greedy = [hf_greedy(model, p, 10) for p in prompts]
    out = generate(model, prompts, drafter=GreedyLookup(max_ngram=2, max_depth=3),
                   max_new_tokens=10, temperature=1.0, seed=4)
    assert out.tokens == greedy
    assert out.stats.target_forwards < 10  # drafts were accepted
    lossless = generate(model, prompts, drafter=PromptLookupDrafter(max_ngram=2, max_depth=3),
                        max_new_tokens=10, temperature=1.0, seed=4)
    assert lossless.tokens != greedy  # the same request samples under the lossless rule
