"""tree_attention vs the reference (SDPA with the dense [prefix + tree] mask), opcheck,
torch.compile and bad input.

Accuracy follows flash-attention's rule: the op's error against an fp64 reference must be at most
twice that of the same computation done by PyTorch in the inputs' precision (SDPA with the dense
mask, or HF's eager attention, whichever is less accurate), plus a tiny absolute slack for fp32
where both errors are rounding-level.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from python_tests.conftest import DEVICES, FLOAT_DTYPES, INDEX_DTYPES
from specdec_kernels import ops, reference
from specdec_kernels.tree import pack_tree_mask, stack_trees, tree_from_parents, unpack_tree_mask

SLACK = {torch.float32: 2e-6, torch.float16: 0.0, torch.bfloat16: 0.0}


def random_parents(num_nodes, gen):
    return [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, num_nodes)]


def make_case(gen, device, dtype, *, batch, tokens, q_heads, kv_heads, head_dim, cache_lens,
              extra=3, ragged=True, index_dtype=torch.int64):
    """Random q, caches (each request's tree K/V at cache_lens[b] + j) and a stacked random
    tree mask; `extra` unused rows at the end of the cache hold garbage that must not be read."""
    sizes = [tokens] + [int(torch.randint(1, tokens + 1, (1,), generator=gen)) for _ in range(batch - 1)]
    trees = [tree_from_parents(random_parents(n if ragged else tokens, gen)) for n in sizes]
    _, parents = stack_trees(trees, num_nodes=tokens)
    lens = torch.tensor(cache_lens)
    masks = reference.build_tree_masks(parents, lens)
    capacity = max(cache_lens) + tokens + extra
    q = torch.randn(batch, tokens, q_heads, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, capacity, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, capacity, head_dim, generator=gen)
    to = lambda t: t.to(dtype).to(device)  # noqa: E731
    return (to(q), to(k), to(v), lens.to(index_dtype).to(device), masks.packed_mask.to(device))


def poison_unused_rows(k, v, cache_lens, tokens):
    """NaN in every cache row past cache_lens[b] + T: rows the op must never use."""
    for b, n in enumerate(cache_lens.tolist()):
        k[b, :, n + tokens:] = float("nan")
        v[b, :, n + tokens:] = float("nan")


def eager_attention(q, k, v, cache_lens, packed, scale):
    """HF's eager attention in the inputs' dtype: matmuls in that dtype, softmax in fp32."""
    batch, nodes, q_heads, _ = q.shape
    group = q_heads // k.shape[1]
    out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    for b in range(batch):
        n = int(cache_lens[b])
        keys = k[b, :, : n + nodes].repeat_interleave(group, dim=0)
        values = v[b, :, : n + nodes].repeat_interleave(group, dim=0)
        tree = unpack_tree_mask(packed[b], nodes)
        visible = torch.cat([tree.new_ones(nodes, n), tree], dim=1)
        scores = (q[b].transpose(0, 1) @ keys.transpose(1, 2)) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).nan_to_num(0.0).to(q.dtype)
        out[b] = (probs @ values).transpose(0, 1)
    return out


def assert_flash_rule(out, q, k, v, cache_lens, packed, scale):
    """Error vs fp64 at most twice that of PyTorch in the inputs' precision (the less accurate
    of SDPA with the dense mask and HF's eager attention)."""
    assert out.dtype == q.dtype and out.shape == q.shape and out.is_contiguous()
    exact = reference.tree_attention(q.double(), k.double(), v.double(), cache_lens, packed, scale)
    err = (out.double() - exact).abs().max().item()
    err_torch = max(
        (impl(q, k, v, cache_lens, packed, scale).double() - exact).abs().max().item()
        for impl in (reference.tree_attention, eager_attention)
    )
    assert err <= 2 * err_torch + SLACK[q.dtype], (err, err_torch)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256, 40, 36])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 1)])
def test_matches_reference(device, gen, dtype, head_dim, heads):
    """On CUDA: tensor cores for 2-byte types with a head dim that is a multiple of 8 (40 on the
    64 instantiation, zero-padded), the SIMT kernel for fp32 and head dim 36."""
    q_heads, kv_heads = heads
    args = make_case(gen, device, dtype, batch=3, tokens=13, q_heads=q_heads, kv_heads=kv_heads,
                     head_dim=head_dim, cache_lens=[0, 77, 150])
    out = ops.tree_attention(*args)
    assert_flash_rule(out, *args, head_dim**-0.5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("tokens", [1, 33, 64])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_tree_sizes_and_long_prefix(device, gen, dtype, tokens, index_dtype):
    """Prefixes long enough for many key tiles (and, on CUDA, several splits), trees crossing
    the 32-node word boundary, and T = 1."""
    args = make_case(gen, device, dtype, batch=2, tokens=tokens, q_heads=8, kv_heads=2,
                     head_dim=64, cache_lens=[1000, 333], index_dtype=index_dtype)
    out = ops.tree_attention(*args, scale=0.3)
    assert_flash_rule(out, *args, 0.3)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_many_query_rows_per_kv_head(device, gen, dtype, head_dim):
    """T * G = 168 query rows per KV head (on CUDA: two m16 tiles per warp up to D = 128, several
    row blocks sharing each K/V tile through L2), ragged prefixes over several splits."""
    args = make_case(gen, device, dtype, batch=3, tokens=21, q_heads=16, kv_heads=2,
                     head_dim=head_dim, cache_lens=[300, 129, 0])
    out = ops.tree_attention(*args)
    assert_flash_rule(out, *args, head_dim**-0.5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rows_past_the_keys_are_never_used(device, gen, dtype):
    """Cache rows past cache_lens[b] + T hold NaN, as an unwritten cache may: never read."""
    args = make_case(gen, device, dtype, batch=3, tokens=7, q_heads=4, kv_heads=2, head_dim=64,
                     cache_lens=[0, 61, 33], extra=40)
    poison_unused_rows(args[1], args[2], args[3], 7)
    out = ops.tree_attention(*args)
    assert torch.isfinite(out).all()
    assert_flash_rule(out, *args, 64**-0.5)


def padding_bits(tokens: int, words: int) -> torch.Tensor:
    """[words] int32: the bits of a packed mask row at node columns >= tokens."""
    def word(w):
        valid = min(max(tokens - 32 * w, 0), 32)
        bits = (0xFFFFFFFF << valid) & 0xFFFFFFFF
        return bits - (1 << 32) if bits >= 1 << 31 else bits
    return torch.tensor([word(w) for w in range(words)], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("tokens", [5, 33])
def test_mask_bits_past_the_block_are_padding(device, gen, dtype, tokens):
    """Bits of a packed mask row at node columns >= T are padding (build_tree_masks leaves
    them zero): set, they change nothing and reach no cache row past the block (those hold
    NaN here). The CPU kernel once took them as nodes and read cache_len + 32 rows."""
    args = make_case(gen, device, dtype, batch=3, tokens=tokens, q_heads=4, kv_heads=2,
                     head_dim=64, cache_lens=[0, 61, 33], extra=70)
    poison_unused_rows(args[1], args[2], args[3], tokens)
    clean = ops.tree_attention(*args)
    padding = padding_bits(tokens, args[4].shape[-1]).to(device)
    assert padding.ne(0).any() and (args[4] & padding).eq(0).all()
    out = ops.tree_attention(*args[:4], args[4] | padding)
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_decode_is_plain_attention(device, gen, dtype):
    """T = 1 with the root-only mask: ordinary decode attention over cache_len + 1 rows."""
    batch, heads, length, dim = 3, 4, 57, 64
    q = torch.randn(batch, 1, heads, dim, generator=gen).to(dtype).to(device)
    k = torch.randn(batch, heads, length, dim, generator=gen).to(dtype).to(device)
    v = torch.randn(batch, heads, length, dim, generator=gen).to(dtype).to(device)
    lens = torch.full((batch,), length - 1, device=device)
    packed = torch.ones(batch, 1, 1, dtype=torch.int32, device=device)
    out = ops.tree_attention(q, k, v, lens, packed)
    plain = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), k.double(), v.double()).transpose(1, 2)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(out.double(), plain, atol=tol, rtol=0)


def test_ancestor_semantics_hand_checked(device):
    """Independent of the reference: with V rows one-hot per cache row and equal scores, each
    output is the uniform average over exactly the visible rows."""
    parents = torch.tensor([[-1, 0, 0, 1]])
    masks = ops.build_tree_masks(parents, torch.tensor([2]))
    capacity, dim = 8, 8
    q = torch.zeros(1, 4, 1, dim, device=device)
    k = torch.zeros(1, 1, capacity, dim, device=device)
    v = torch.eye(capacity, dim, device=device)[None, None]
    out = ops.tree_attention(q, k, v, torch.tensor([2], device=device), masks.packed_mask.to(device))
    visible = {0: [0, 1, 2], 1: [0, 1, 2, 3], 2: [0, 1, 2, 4], 3: [0, 1, 2, 3, 5]}
    for j, rows in visible.items():
        want = torch.zeros(dim)
        want[rows] = 1.0 / len(rows)
        torch.testing.assert_close(out[0, j, 0].cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_arbitrary_masks_and_empty_rows(device, gen, dtype):
    """Any bit pattern is honoured (not only ancestor masks); a row with no bits over an empty
    prefix is zero, not NaN."""
    batch, tokens, heads, dim = 2, 40, 2, 64
    bits = torch.rand(batch, tokens, tokens, generator=gen) < 0.3
    bits[0, 5] = False
    packed = pack_tree_mask(bits).to(device)
    lens = torch.tensor([0, 9], device=device)
    q = torch.randn(batch, tokens, heads, dim, generator=gen).to(dtype).to(device)
    k = torch.randn(batch, heads, 9 + tokens, dim, generator=gen).to(dtype).to(device)
    v = torch.randn(batch, heads, 9 + tokens, dim, generator=gen).to(dtype).to(device)
    out = ops.tree_attention(q, k, v, lens, packed)
    assert out[0, 5].eq(0).all()
    assert torch.isfinite(out).all()
    assert_flash_rule(out, q, k, v, lens, packed, dim**-0.5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_strided_inputs(device, gen, dtype):
    """HF layouts: q as a [B, H, T, D] tensor transposed, caches as views of [B, S, H, D]."""
    batch, tokens, q_heads, kv_heads, dim, capacity = 2, 9, 8, 4, 128, 60
    q = torch.randn(batch, q_heads, tokens, dim, generator=gen).to(dtype).to(device).transpose(1, 2)
    k = torch.randn(batch, capacity, kv_heads, dim, generator=gen).to(dtype).to(device).transpose(1, 2)
    v = torch.randn(batch, capacity, kv_heads, dim, generator=gen).to(dtype).to(device).transpose(1, 2)
    _, parents = stack_trees([tree_from_parents(random_parents(tokens, gen)) for _ in range(batch)])
    lens = torch.tensor([40, 51])
    packed = ops.build_tree_masks(parents, lens).packed_mask.to(device)
    out = ops.tree_attention(q, k, v, lens.to(device), packed)
    assert_flash_rule(out, q, k, v, lens.to(device), packed, dim**-0.5)
    contiguous = ops.tree_attention(q.contiguous(), k.contiguous(), v.contiguous(), lens.to(device), packed)
    torch.testing.assert_close(out, contiguous, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unaligned_views(device, gen, dtype):
    """Caches that start one element into their storage (no 16-byte rows: on CUDA the SIMT
    kernel instead of the tensor-core one)."""
    batch, tokens, heads, dim, capacity = 2, 7, 4, 64, 50
    storage = torch.randn(2, batch * heads * capacity * dim + 1, generator=gen).to(dtype).to(device)
    k, v = (s[1:].view(batch, heads, capacity, dim) for s in storage)
    q = torch.randn(batch, tokens, heads, dim, generator=gen).to(dtype).to(device)
    _, parents = stack_trees([tree_from_parents(random_parents(tokens, gen)) for _ in range(batch)])
    lens = torch.tensor([30, 43])
    packed = ops.build_tree_masks(parents, lens).packed_mask.to(device)
    out = ops.tree_attention(q, k, v, lens.to(device), packed)
    assert_flash_rule(out, q, k, v, lens.to(device), packed, dim**-0.5)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cuda_graph_capture(gen, dtype):
    """Captured (the launch needs no host copy: the grid depends on shapes only), replayed with
    new cache lengths in the same tensor: each replay follows the current lengths."""
    args = make_case(gen, "cuda", dtype, batch=3, tokens=21, q_heads=8, kv_heads=2, head_dim=128,
                     cache_lens=[700, 5, 260], extra=300)
    _, parents = stack_trees([tree_from_parents(random_parents(21, gen)) for _ in range(3)])
    parents, lens = parents.cuda(), args[3]
    eager = ops.tree_attention(*args)
    ops.build_tree_masks(parents, lens)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed = ops.tree_attention(*args)
        masks = ops.build_tree_masks(parents, lens)
    graph.replay()
    torch.cuda.synchronize()
    assert_flash_rule(graphed, *args, 128**-0.5)
    torch.testing.assert_close(graphed, eager, atol=2e-3 if dtype == torch.float16 else 1e-5, rtol=0)
    want = reference.build_tree_masks(parents.cpu(), lens.cpu())
    assert all(torch.equal(a.cpu(), b) for a, b in zip(masks, want))
    lens.copy_(torch.tensor([12, 980, 1], device="cuda"))  # longer and shorter than captured
    graph.replay()
    torch.cuda.synchronize()
    assert_flash_rule(graphed, *args, 128**-0.5)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_cuda_unvalidated_lengths_stay_inside_the_cache(gen):
    """Without validate, lengths outside [0, S - T] are clamped on the device: no fault, finite
    output (the lengths the kernel used: 0 and S - T)."""
    args = list(make_case(gen, "cuda", torch.float16, batch=3, tokens=5, q_heads=4, kv_heads=2,
                          head_dim=64, cache_lens=[0, 10, 20], extra=0))
    args[3] = torch.tensor([-7, 10**6, 20], device="cuda")
    out = ops.tree_attention(*args, scale=0.125)
    torch.cuda.synchronize()
    clamped = torch.tensor([0, args[1].shape[2] - 5, 20], device="cuda")
    assert torch.isfinite(out).all()
    assert_flash_rule(out, args[0], args[1], args[2], clamped, args[4], 0.125)
    with pytest.raises(ValueError, match="negative"):
        ops.tree_attention(*args, scale=0.125, validate=True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_cuda_validate_refused_during_capture(gen):
    args = make_case(gen, "cuda", torch.float16, batch=2, tokens=3, q_heads=4, kv_heads=2,
                     head_dim=64, cache_lens=[4, 9])
    ops.tree_attention(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="graph capture"):
        with torch.cuda.graph(graph):
            ops.tree_attention(*args, validate=True)


def test_empty_shapes(device):
    q = torch.zeros(2, 0, 4, 64, device=device)
    k = torch.zeros(2, 2, 5, 64, device=device)
    out = ops.tree_attention(q, k, k, torch.tensor([1, 2], device=device),
                             torch.zeros(2, 0, 0, dtype=torch.int32, device=device))
    assert out.shape == (2, 0, 4, 64)
    out = ops.tree_attention(torch.zeros(0, 3, 4, 64, device=device), torch.zeros(0, 2, 5, 64, device=device),
                             torch.zeros(0, 2, 5, 64, device=device), torch.zeros(0, dtype=torch.int64, device=device),
                             torch.zeros(0, 3, 1, dtype=torch.int32, device=device))
    assert out.shape == (0, 3, 4, 64)
    # Hq = 0 passes the divisibility check; no query rows, nothing to launch.
    out = ops.tree_attention(torch.zeros(2, 3, 0, 64, device=device), k, k,
                             torch.tensor([1, 2], device=device),
                             torch.zeros(2, 3, 1, dtype=torch.int32, device=device))
    assert out.shape == (2, 3, 0, 64)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_cuda_kernels_of_one_dtype_in_any_order():
    """Each CUDA kernel raises its own shared-memory limit. In a fresh process (the limits are
    per-process state): the largest tensor-core kernel first (D = 128), then kernels of the same
    dtype that need less but still more than the 48 KiB default (tensor-core D = 64, and the SIMT
    kernel for unaligned D = 128 caches)."""
    code = """if True:
        import torch
        from python_tests.test_tree_attention import assert_flash_rule, make_case
        from specdec_kernels import ops

        def unaligned(t):
            storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
            return storage[1:].view_as(t).copy_(t)

        gen = torch.Generator().manual_seed(0)
        for dim, shift in ((128, False), (64, False), (128, True)):
            q, k, v, lens, packed = make_case(gen, "cuda", torch.float16, batch=2, tokens=9,
                                              q_heads=4, kv_heads=2, head_dim=dim,
                                              cache_lens=[30, 70])
            if shift:
                k, v = unaligned(k), unaligned(v)
            out = ops.tree_attention(q, k, v, lens, packed)
            torch.cuda.synchronize()
            assert_flash_rule(out, q, k, v, lens, packed, dim**-0.5)
    """
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------- opcheck, compile


def test_opcheck(device, gen):
    args = make_case(gen, device, torch.float16, batch=2, tokens=5, q_heads=4, kv_heads=2,
                     head_dim=64, cache_lens=[3, 11])
    torch.library.opcheck(torch.ops.specdec.tree_attention.default, (*args, 0.125))


def test_torch_compile_fullgraph(device, gen):
    """Masks and attention in one compiled graph."""
    batch, tokens, heads, dim = 2, 6, 4, 64
    _, parents = stack_trees([tree_from_parents(random_parents(n, gen)) for n in (6, 4)])
    parents, lens = parents.to(device), torch.tensor([5, 12], device=device)
    q = torch.randn(batch, tokens, heads, dim, generator=gen).to(device)
    k = torch.randn(batch, heads, 20, dim, generator=gen).to(device)
    v = torch.randn(batch, heads, 20, dim, generator=gen).to(device)

    @torch.compile(fullgraph=True)
    def step(q, k, v, parents, lens):
        masks = ops.build_tree_masks(parents, lens)
        return ops.tree_attention(q, k, v, lens, masks.packed_mask) * 2, masks.position_ids + 1

    doubled, positions = step(q, k, v, parents, lens)
    masks = ops.build_tree_masks(parents, lens)
    torch.testing.assert_close(doubled, 2 * ops.tree_attention(q, k, v, lens, masks.packed_mask))
    assert torch.equal(positions, masks.position_ids + 1)


# ----------------------------------------------------------------------------- bad input


def bad_args(device, **overrides):
    args = dict(
        q=torch.zeros(2, 3, 4, 64, device=device),
        k_cache=torch.zeros(2, 2, 10, 64, device=device),
        v_cache=torch.zeros(2, 2, 10, 64, device=device),
        cache_lens=torch.tensor([2, 7], device=device),
        tree_mask=torch.ones(2, 3, 1, dtype=torch.int32, device=device),
    )
    args.update({k: v(device) if callable(v) else v.to(device) for k, v in overrides.items()})
    return args


BAD_ATTENTION = {
    "mask rows vs T": (dict(tree_mask=torch.ones(2, 4, 1, dtype=torch.int32)), "tree_mask must have shape"),
    "mask words vs T": (dict(tree_mask=torch.ones(2, 3, 2, dtype=torch.int32)), "tree_mask must have shape"),
    "mask dtype": (dict(tree_mask=torch.ones(2, 3, 1, dtype=torch.int64)), "bit-packed int32"),
    "bool mask": (dict(tree_mask=torch.ones(2, 3, 3, dtype=torch.bool)), "bit-packed int32"),
    "heads not divisible": (dict(k_cache=torch.zeros(2, 3, 10, 64), v_cache=torch.zeros(2, 3, 10, 64)), "multiple of"),
    "cache too short": (dict(cache_lens=torch.tensor([2, 8])), "too short for prefix \\+ tree"),
    "negative cache len": (dict(cache_lens=torch.tensor([-1, 0])), "negative"),
    # cache_len + T would wrap around to a negative number and pass a naive bound check.
    "cache len near the int64 maximum": (dict(cache_lens=torch.tensor([2**63 - 2, 0])),
                                         "too short for prefix \\+ tree"),
    "cache lens shape": (dict(cache_lens=torch.tensor([1])), "cache_lens must have shape"),
    "cache lens dtype": (dict(cache_lens=torch.tensor([1.0, 2.0])), "int32 or int64"),
    "kv dtype": (dict(k_cache=torch.zeros(2, 2, 10, 64).half()), "share a dtype"),
    # A narrow cache is for float32 queries only: never a cache wider than q.
    "cache wider than q": (dict(q=torch.zeros(2, 3, 4, 64, dtype=torch.bfloat16)), "share a dtype"),
    "q dtype": (dict(q=torch.zeros(2, 3, 4, 64, dtype=torch.float64)), "float32, float16 or bfloat16"),
    "q rank": (dict(q=torch.zeros(2, 3, 256)), "q must have shape"),
    "v shape": (dict(v_cache=torch.zeros(2, 2, 11, 64)), "v_cache has shape"),
    "head dim": (dict(k_cache=torch.zeros(2, 2, 10, 32), v_cache=torch.zeros(2, 2, 10, 32)), "head dim"),
    "batch": (dict(k_cache=torch.zeros(3, 2, 10, 64), v_cache=torch.zeros(3, 2, 10, 64)), "batch"),
    # Built on the device: Tensor.to copies a non-dense view into a contiguous tensor.
    "strided head": (dict(q=lambda device: torch.zeros(2, 3, 4, 128, device=device)[..., ::2]),
                     "contiguous in its last"),
}


@pytest.mark.parametrize("case", sorted(BAD_ATTENTION))
def test_rejects_bad_input(device, case):
    """validate=True: on CUDA the lengths are checked on the host only when asked."""
    overrides, message = BAD_ATTENTION[case]
    with pytest.raises(ValueError, match=message):
        ops.tree_attention(**bad_args(device, **overrides), validate=True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_cuda_rejects_a_narrow_cache():
    narrow = dict(k_cache=torch.zeros(2, 2, 10, 64, dtype=torch.bfloat16),
                  v_cache=torch.zeros(2, 2, 10, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="on this device"):
        ops.tree_attention(**bad_args("cuda", **narrow))


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA kernels and a GPU")
def test_rejects_mixed_devices():
    with pytest.raises(ValueError, match="one device"):
        ops.tree_attention(**{**bad_args("cuda"), "k_cache": torch.zeros(2, 2, 10, 64)})
    with pytest.raises(ValueError, match="cache_lens must be on"):
        ops.tree_attention(**{**bad_args("cuda"), "cache_lens": torch.tensor([2, 7])})
    with pytest.raises(ValueError, match="tree_mask must be on"):
        ops.tree_attention(**{**bad_args("cuda"), "tree_mask": torch.ones(2, 3, 1, dtype=torch.int32)})


# ----------------------------------------------------------------------------- batch invariance


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("heads,prefix", [
    ((4, 4, 16), 37), ((9, 3, 64), 37), ((12, 2, 80), 37), ((32, 1, 8), 37),
    # Long prefixes: a token alone is few tasks, so the kernel splits keys and head dims over
    # the threads (float32), while the tree's many rows run one task per row block.
    # (The value sums are cut in 32-dim units into one span per thread: with 80 or 36 dims a
    # span can end inside a head and inside a unit's last, short piece.)
    ((9, 3, 64), 1031), ((12, 2, 80), 777), ((2, 1, 36), 600), ((12, 2, 128), 700),
])
def test_cpu_tree_rows_equal_one_token_decoding(cpu_isa, dtype, heads, prefix, gen):
    """On CPU, each tree node's output is bit-identical to decoding that token alone once its
    ancestors are committed right after the prefix (as the engine's cache holds them)."""
    q_heads, kv_heads, head_dim = heads
    nodes = 21
    parents = random_parents(nodes, gen)
    masks = reference.build_tree_masks(torch.tensor([parents]), torch.tensor([prefix]))
    to = lambda t: t.to(dtype)  # noqa: E731
    q = to(torch.randn(1, nodes, q_heads, head_dim, generator=gen))
    k = to(torch.randn(1, kv_heads, prefix + nodes, head_dim, generator=gen))
    v = to(torch.randn(1, kv_heads, prefix + nodes, head_dim, generator=gen))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))  # the split schedule needs threads to split over
    try:
        tree_out = ops.tree_attention(q, k, v, torch.tensor([prefix]), masks.packed_mask)
        root_only = torch.ones(1, 1, 1, dtype=torch.int32)
        for j in range(nodes):
            path = [j]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            rows = torch.tensor([prefix + n for n in reversed(path)])  # ancestors, then j
            keep = torch.cat([torch.arange(prefix), rows])
            alone = ops.tree_attention(q[:, j : j + 1], k[:, :, keep], v[:, :, keep],
                                       torch.tensor([prefix + len(path) - 1]), root_only)
            assert torch.equal(alone[0, 0], tree_out[0, j]), j
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("heads,batch", [((9, 3, 64), 1), ((8, 2, 48), 2), ((6, 1, 100), 3),
                                         ((5, 5, 72), 1)])
def test_cpu_decoding_bits_do_not_depend_on_threads(cpu_isa, heads, batch, gen):
    """A decoding token's attention over a long prefix (the schedule that splits keys and head
    dims over the threads) gives the same bits on 1, 2, 3 and 5 threads: every thread count cuts
    the value sums' spans elsewhere, across and inside heads."""
    q_heads, kv_heads, head_dim = heads
    lens = torch.tensor([1200, 700, 1100][:batch])
    q = torch.randn(batch, 1, q_heads, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, 1300, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, 1300, head_dim, generator=gen)
    mask = torch.ones(batch, 1, 1, dtype=torch.int32)
    threads = torch.get_num_threads()
    try:
        outs = []
        for count in (1, 2, 3, 5):
            torch.set_num_threads(count)
            outs.append(ops.tree_attention(q, k, v, lens, mask, 0.2))
    finally:
        torch.set_num_threads(threads)
    for count, out in zip((2, 3, 5), outs[1:]):
        assert torch.equal(out, outs[0]), count


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,prefix,nodes", [
    ((9, 3, 64), 37, 13), ((12, 2, 80), 5, 1), ((4, 4, 20), 61, 7), ((2, 1, 36), 600, 1),
    ((9, 3, 64), 1031, 1), ((6, 1, 48), 517, 9),
])
def test_cpu_narrow_cache_reads_as_its_float32_copy(cpu_isa, cache_dtype, heads, prefix, nodes, gen):
    """Float32 queries over a bfloat16/float16 cache give the bits of the same queries over the
    cache's float32 copy (widening is exact), on every path and schedule (long prefixes split
    keys over the threads); against the reference too."""
    q_heads, kv_heads, head_dim = heads
    parents = random_parents(nodes, gen)
    lens = torch.tensor([prefix, prefix // 2 + 1])
    masks = reference.build_tree_masks(torch.tensor([parents, parents]), lens)
    q = torch.randn(2, nodes, q_heads, head_dim, generator=gen)
    k = torch.randn(2, kv_heads, prefix + nodes + 2, head_dim, generator=gen).to(cache_dtype)
    v = torch.randn(2, kv_heads, prefix + nodes + 2, head_dim, generator=gen).to(cache_dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(threads, 2))  # the split schedule needs threads to split over
    try:
        narrow = ops.tree_attention(q, k, v, lens, masks.packed_mask)
        wide = ops.tree_attention(q, k.float(), v.float(), lens, masks.packed_mask)
    finally:
        torch.set_num_threads(threads)
    assert narrow.dtype == torch.float32
    assert torch.equal(narrow, wide)
    spec = reference.tree_attention(q.double(), k, v, lens, masks.packed_mask, head_dim**-0.5)
    torch.testing.assert_close(narrow, spec.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_half_types_are_the_float32_result_rounded(cpu_isa, dtype, gen):
    """A bfloat16/float16 call reads its cache at its own width and computes in float32: its
    output is the float32 call's on the same values, rounded once."""
    prefix, nodes = 300, 11
    parents = random_parents(nodes, gen)
    masks = reference.build_tree_masks(torch.tensor([parents]), torch.tensor([prefix]))
    q = torch.randn(1, nodes, 9, 64, generator=gen).to(dtype)
    k = torch.randn(1, 3, prefix + nodes, 64, generator=gen).to(dtype)
    v = torch.randn(1, 3, prefix + nodes, 64, generator=gen).to(dtype)
    half = ops.tree_attention(q, k, v, torch.tensor([prefix]), masks.packed_mask)
    wide = ops.tree_attention(q.float(), k.float(), v.float(), torch.tensor([prefix]), masks.packed_mask)
    assert torch.equal(half, wide.to(dtype))


def test_cpu_vector_paths_agree(gen):
    """The AVX2 and AVX-512 forms of the CPU kernel agree to rounding: the softmax and the value
    sums are the same operations in the same order, the scores are summed in another order
    (AVX-512 by key, AVX2 with the rows in lanes), as the linear tiles' sums differ by
    instruction set (fewer and more than 8 rows per KV head, head dims that are not a multiple
    of the vector width). Each path is batch-invariant on its own
    (test_cpu_tree_rows_equal_one_token_decoding runs on both)."""
    if ops.cpu_isa() not in ("avx512", "avx512_bf16"):
        pytest.skip("needs a CPU with AVX-512 (to run both paths)")
    prefix, nodes = 45, 7
    parents = random_parents(nodes, gen)
    masks = reference.build_tree_masks(torch.tensor([parents]), torch.tensor([prefix]))
    for q_heads, kv_heads, head_dim in [(9, 3, 64), (12, 2, 80), (32, 4, 20)]:
        q = torch.randn(1, nodes, q_heads, head_dim, generator=gen)
        k = torch.randn(1, kv_heads, prefix + nodes, head_dim, generator=gen)
        v = torch.randn(1, kv_heads, prefix + nodes, head_dim, generator=gen)
        args = (q, k, v, torch.tensor([prefix]), masks.packed_mask)
        out = {}
        try:
            for isa in ("avx2", "avx512"):
                ops.cpu_isa(isa)
                out[isa] = ops.tree_attention(*args)
        finally:
            ops.cpu_isa("none")
        torch.testing.assert_close(out["avx2"], out["avx512"], rtol=1e-5, atol=1e-6,
                                   msg=f"{(q_heads, kv_heads, head_dim)}")
