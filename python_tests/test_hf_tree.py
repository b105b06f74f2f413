"""Tree forwards of unmodified HF causal LMs (Llama, Qwen2, Gemma3 families; tiny random
models, fp32): the logits of every tree node equal the logits the model gives when that node's
root-to-node path is run as a plain sequence, via the 4-D mask path and via the registered
tree-attention kernel."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from python_tests.conftest import DEVICES  # noqa: E402
from specdec_kernels.models.hf_tree_attention import (  # noqa: E402
    ATTENTION_NAME,
    METADATA_KWARG,
    TreeAttentionMetadata,
    register_tree_attention,
    tree_attention_forward,
    tree_kernel_forward_kwargs,
    tree_mask_forward_kwargs,
)
from specdec_kernels.models.hf_compat import cache_kwargs, output_cache  # noqa: E402
from specdec_kernels.tree import stack_trees, tree_from_parents, tree_from_sequences  # noqa: E402

VOCAB = 97
WINDOW = 5  # Gemma3's sliding window: shorter than the prefixes, so it matters


def tiny_model(family, attn_implementation, device):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128)
    if family == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif family == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.Gemma3TextConfig(
            **common, sliding_window=WINDOW, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"])
        cls = transformers.Gemma3ForCausalLM
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = cls(config).eval().to(device)
    model.set_attn_implementation(attn_implementation)
    return model


def random_tree(gen, num_nodes):
    parents = [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, num_nodes)]
    tokens = torch.randint(0, VOCAB, (num_nodes,), generator=gen).tolist()
    return tree_from_parents(parents, tokens)


def assert_tree_logits_match(model, prefixes, trees, tree_logits):
    """Each root-to-leaf path runs once as a plain sequence after its prefix; every node on it
    must get the logits the tree forward gave it."""
    for b, (prefix, tree) in enumerate(zip(prefixes, trees)):
        for path in tree.paths():
            ids = torch.tensor([prefix + [tree.tokens[n] for n in path]], device=model.device)
            want = model(ids).logits[0, len(prefix):]
            torch.testing.assert_close(tree_logits[b, path], want, atol=2e-5, rtol=1e-5)


def prefill_left_padded(model, prefixes):
    """Left-padded batched prefill into a DynamicCache, positions counted over real tokens."""
    width = max(len(p) for p in prefixes)
    ids = torch.zeros(len(prefixes), width, dtype=torch.int64)
    valid = torch.zeros(len(prefixes), width, dtype=torch.int64)
    for b, p in enumerate(prefixes):
        ids[b, width - len(p):] = torch.tensor(p)
        valid[b, width - len(p):] = 1
    ids, valid = ids.to(model.device), valid.to(model.device)
    positions = (valid.cumsum(-1) - 1).clamp(min=0)
    out = model(ids, attention_mask=valid, position_ids=positions, use_cache=True)
    return output_cache(out), valid


FAMILIES = ["llama", "qwen2", "gemma3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_mask_path_ragged_batch(device, family):
    """4-D mask path, ragged (left-padded) prefixes, ragged trees."""
    gen = torch.Generator().manual_seed(1)
    model = tiny_model(family, "sdpa", device)
    prefixes = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (11, 4, 8)]
    trees = [random_tree(gen, 9), random_tree(gen, 5),
             tree_from_sequences([[3, 4, 5], [3, 4, 6], [7]], root_token=2)]
    cache, valid = prefill_left_padded(model, prefixes)
    tokens, parents = stack_trees(trees, device=device)
    kwargs = tree_mask_forward_kwargs(model.config, parents, valid,
                                      sliding_prefix_valid=valid[:, -(WINDOW - 1):])
    logits = model(tokens, **cache_kwargs(model, cache), **kwargs).logits
    assert_tree_logits_match(model, prefixes, trees, logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_path(device, family):
    """The registered kernel, batch of equal-length prefixes in HF's DynamicCache, ragged trees;
    prefill goes through the same attention implementation (the sdpa fallback)."""
    gen = torch.Generator().manual_seed(2)
    model = tiny_model(family, register_tree_attention(), device)
    assert model.config._attn_implementation == ATTENTION_NAME
    prefixes = [torch.randint(0, VOCAB, (9,), generator=gen).tolist() for _ in range(2)]
    trees = [random_tree(gen, 12), random_tree(gen, 6)]
    out = model(torch.tensor(prefixes, device=device), use_cache=True)
    tokens, parents = stack_trees(trees, device=device)
    lens = torch.tensor([9, 9], device=device)
    logits = model(tokens, **cache_kwargs(model, output_cache(out)),
                   **tree_kernel_forward_kwargs(parents, lens)).logits
    assert_tree_logits_match(model, prefixes, trees, logits)


def test_kernel_path_calls_the_op(device, monkeypatch):
    """Guard against a silent fallback: on full-attention layers the tree path must reach
    ops.tree_attention, once per layer."""
    from specdec_kernels.models import hf_tree_attention

    calls = []
    real = hf_tree_attention.ops.tree_attention
    monkeypatch.setattr(hf_tree_attention.ops, "tree_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model("llama", register_tree_attention(), device)
    out = model(torch.tensor([[1, 2, 3]], device=device), use_cache=True)
    assert not calls  # prefill: sdpa fallback
    tokens, parents = stack_trees([random_tree(torch.Generator().manual_seed(3), 4)], device=device)
    model(tokens, **cache_kwargs(model, output_cache(out)),
          **tree_kernel_forward_kwargs(parents, torch.tensor([3], device=device)))
    assert len(calls) == model.config.num_hidden_layers


def test_kernel_matches_mask_path_and_sdpa_prefill(device):
    """Same model, same inputs: kernel logits equal the 4-D mask path's, and prefill under the
    registered implementation equals plain sdpa."""
    gen = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, VOCAB, (1, 10), generator=gen).to(device)
    tree = random_tree(gen, 16)
    tokens, parents = stack_trees([tree], device=device)
    sdpa = tiny_model("qwen2", "sdpa", device)
    kernel = tiny_model("qwen2", register_tree_attention(), device)
    pre_sdpa = sdpa(prefix, use_cache=True)
    pre_kernel = kernel(prefix, use_cache=True)
    torch.testing.assert_close(pre_kernel.logits, pre_sdpa.logits, atol=0, rtol=0)
    masked = sdpa(tokens, **cache_kwargs(sdpa, output_cache(pre_sdpa)),
                  **tree_mask_forward_kwargs(sdpa.config, parents, torch.ones_like(prefix))).logits
    fused = kernel(tokens, **cache_kwargs(kernel, output_cache(pre_kernel)),
                   **tree_kernel_forward_kwargs(parents, torch.tensor([10], device=device))).logits
    torch.testing.assert_close(fused, masked, atol=2e-5, rtol=1e-5)


def test_attention_function_rejects_bad_metadata(device):
    q = torch.zeros(1, 4, 3, 16, device=device)
    kv = torch.zeros(1, 2, 8, 16, device=device)
    module = torch.nn.Module()
    bad = TreeAttentionMetadata(torch.ones(1, 2, 1, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="tree metadata is for"):
        tree_attention_forward(module, q, kv, kv, None, **{METADATA_KWARG: bad})
    good = TreeAttentionMetadata(torch.ones(1, 3, 1, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="soft-capping"):
        tree_attention_forward(module, q, kv, kv, None, softcap=30.0, **{METADATA_KWARG: good})
    if device != "cpu":
        return  # on CUDA the layer passes cache lengths unchecked (validating them would sync)
    with pytest.raises(ValueError, match="too short"):
        tree_attention_forward(module, q, kv, kv, None, **{METADATA_KWARG: TreeAttentionMetadata(
            good.packed_mask, torch.tensor([6], device=device))})


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_kernel_path_fp16_cuda():
    """fp16 on CUDA (tensor-core kernel, head dim 64): tree logits close to the 4-D mask path."""
    gen = torch.Generator().manual_seed(5)
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    config = transformers.LlamaConfig(**common)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().to("cuda", torch.float16)
    prefix = torch.randint(0, VOCAB, (1, 300), generator=gen).cuda()
    tokens, parents = stack_trees([random_tree(gen, 40)], device="cuda")
    model.set_attn_implementation("sdpa")
    pre = model(prefix, use_cache=True)
    masked = model(tokens, **cache_kwargs(model, output_cache(pre)),
                   **tree_mask_forward_kwargs(config, parents, torch.ones_like(prefix))).logits
    model.set_attn_implementation(register_tree_attention())
    pre = model(prefix, use_cache=True)
    fused = model(tokens, **cache_kwargs(model, output_cache(pre)),
                  **tree_kernel_forward_kwargs(parents, torch.tensor([300], device="cuda"))).logits
    torch.testing.assert_close(fused.float(), masked.float(), atol=2e-2, rtol=2e-2)
