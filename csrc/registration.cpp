// The one place where every specdec operator schema is declared.
//
// CPU kernels register themselves in csrc/*.cpp, CUDA kernels in csrc/cuda/*.cu, fake (meta)
// kernels in specdec_kernels/ops/. Mutating ops end in `_`, mark what they write with
// `Tensor(a!)` and return nothing (except decoder_stack_, a composite of the other ops that
// writes the KV cache on the way to its outputs); outputs have fixed shapes (-1 padded) so every
// op is CUDA-graph safe and its fake kernel is trivial.

#include <Python.h>
#include <torch/library.h>

extern "C" {
// An empty module: importing specdec_kernels._C loads this library, whose static initialisers
// below register the operators with the dispatcher.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(specdec, m) {
  // ---------------------------------------------------------------- KV-cache rollback
  // For each request b, move rows accept_positions[b, :num_accepted[b]] of every cache tensor
  // ([B, H, S, D], all alike) to rows cache_lens[b] .. cache_lens[b] + num_accepted[b] - 1
  // (as if all rows were read before any is written), then cache_lens += num_accepted.
  m.def(
      "compact_kv_cache_(Tensor(a!)[] caches, Tensor(b!) cache_lens, Tensor accept_positions, "
      "Tensor num_accepted) -> ()");
  // The same through a block table: caches [num_blocks, block_size, H, D], block_tables
  // [B, max_blocks]; logical position p of request b lives in block block_tables[b, p // block_size].
  m.def(
      "compact_paged_kv_cache_(Tensor(a!)[] caches, Tensor block_tables, Tensor(b!) cache_lens, "
      "Tensor accept_positions, Tensor num_accepted) -> ()");
  // Truncate each request to new_lens[b] <= cache_lens[b]: blocks no longer needed are written to
  // freed_blocks[b] (left-aligned, -1 padded) and set to -1 in block_tables.
  m.def(
      "rollback_paged_kv_cache_(Tensor(a!) block_tables, Tensor(b!) cache_lens, Tensor new_lens, "
      "int block_size, Tensor(c!) freed_blocks) -> ()");

  // ---------------------------------------------------------------- verification
  // Per-request sampling parameters, all [B] on the logits' device: temperature (float32, 0 =
  // greedy), top_k (int64, <= 0 or >= V = off), top_p (float32 in (0, 1]), min_p (float32 in
  // [0, 1)), seed and offset (int64: the Philox key and counter of core/philox.h).
  // Processing and decision rules: core/sampling.h, core/verify.h.
  //
  // One token per row of logits [N, V] (float32/float16/bfloat16), drawn from the processed
  // distribution: tokens [N] int64.
  m.def(
      "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
      "Tensor seed, Tensor offset) -> Tensor");
  // The same, plus the processed distribution [N, V] float32 each token was drawn from.
  m.def(
      "sample_with_probs(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, "
      "Tensor min_p, Tensor seed, Tensor offset) -> (Tensor, Tensor)");
  // Chain verification: draft_tokens [B, K] int64 (the first num_draft[b] valid), target_logits
  // [B, K+1, V], draft_probs [B, K, V] float32 or None (one-hot drafts). Returns tokens
  // [B, K+1] int64 (accepted drafts then the next token, -1 padded) and num_accepted [B] int64.
  m.def(
      "verify_chain(Tensor draft_tokens, Tensor num_draft, Tensor target_logits, "
      "Tensor? draft_probs, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
      "Tensor seed, Tensor offset) -> (Tensor, Tensor)");
  // Tree verification: tree_tokens [B, T] int64, parents [B, T] int64 (-1 at node 0, parent <
  // child, -2 = padding), target_logits [B, T, V], draft_probs [B, T, V] float32 or None.
  // Returns accepted_nodes [B, T], tokens [B, T] (-1 padded) and num_accepted [B], all int64.
  m.def(
      "verify_tree(Tensor tree_tokens, Tensor parents, Tensor target_logits, Tensor? draft_probs, "
      "Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor offset) "
      "-> (Tensor, Tensor, Tensor)");
  // Typical acceptance (Medusa; lossy): accept x iff p(x) > min(posterior_threshold,
  // posterior_alpha * exp(-H(p))); the longest accepted path wins. Outputs as verify_chain.
  m.def(
      "typical_verify_chain(Tensor draft_tokens, Tensor num_draft, Tensor target_logits, "
      "Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor offset, "
      "float posterior_threshold, float posterior_alpha) -> (Tensor, Tensor)");
  // Typical acceptance over a tree. Outputs as verify_tree.
  m.def(
      "typical_verify_tree(Tensor tree_tokens, Tensor parents, Tensor target_logits, "
      "Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, Tensor seed, Tensor offset, "
      "float posterior_threshold, float posterior_alpha) -> (Tensor, Tensor, Tensor)");

  // Per thread: whether the CUDA sampling and verification ops defer the check of their
  // device-side error codes instead of synchronising after each call (returns the previous
  // setting), and the deferred checks run in call order, raising the first error found.
  m.def("set_deferred_errors(bool enabled) -> bool");
  m.def("raise_deferred_errors() -> ()");

  // ---------------------------------------------------------------- tree attention
  // Masks and positions of a batch of trees. parents [B, T]: parents[b, 0] = -1 (the root),
  // 0 <= parents[b, j] < j for the other nodes, -2 for padding nodes (all -2: no tree).
  // Returns the ancestor-or-self mask [B, T, T] bool and bit-packed [B, T, ceil(T / 32)] int32
  // (bit k % 32 of word k / 32), position_ids = prefix_lens + depth [B, T], depth [B, T] (-1 on
  // padding), retrieve_paths [B, T, T] (row i: the root-to-leaf path of the i-th leaf in node
  // order, -1 padded; rows >= num_leaves all -1) and num_leaves [B]. Index outputs are int64.
  m.def(
      "build_tree_masks(Tensor parents, Tensor prefix_lens) -> (Tensor mask, Tensor packed_mask, "
      "Tensor position_ids, Tensor depth, Tensor retrieve_paths, Tensor num_leaves)");
  // Attention of T tree tokens q [B, T, Hq, D] over caches [B, Hkv, S, D] holding each request's
  // prefix (cache_lens[b] rows) followed by the tree's own K/V at cache_lens[b] + j: the prefix
  // is visible to every token, tree node k to token j where bit k of tree_mask[b, j] is set
  // (packed int32 [B, T, ceil(T / 32)]; bits k >= T are padding, ignored). Query head i reads
  // KV head i / (Hq / Hkv). Returns
  // [B, T, Hq, D] in q's dtype; a row that sees no key is zero.
  m.def(
      "tree_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_lens, "
      "Tensor tree_mask, float scale) -> Tensor");

  // ---------------------------------------------------------------- small-batch linear
  // out = x @ weight^T (+ bias) for x [..., K], weight [N, K], bias [N] (all float32 or all
  // bfloat16; float32 accumulation): out [..., N]. On CPU every output element is reduced in one
  // fixed order whatever the number of rows (batch-invariant; see csrc/linear.cpp); CUDA calls
  // torch's linear.
  m.def("small_batch_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  // The instruction set of the CPU kernels (avx512_bf16, avx512, avx2 or portable). cap >= 0
  // caps it (0 portable .. 3 avx512_bf16; for tests), -1 lifts the cap, -2 only asks.
  m.def("cpu_isa(int cap=-2) -> str");

  // ---------------------------------------------------------------- quantized linear
  // out = x @ W^T (+ bias) for x [..., K] (float32 or bfloat16) and W at a GGUF file's
  // precision: qweight [N, K] int8 or [N, K / 2] uint8 (int4 pairs: in each 32-value block,
  // byte j holds value j in its low nibble and value j + 16 in its high nibble, 0..15), in
  // groups of G = K / scales.size(1) values along K (a power of two, >= 16 for int8, >= 32
  // for int4), w = scales[n, g] * q + mins[n, g] (mins None: 0); scales and mins [N, K / G]
  // float32 or float16. x is quantized per row to int8 in blocks of 32 (scale amax / 127,
  // round half to even) and the products summed exactly in integers, then in float32: the
  // result is batch-invariant on CPU (see csrc/cpu_qdot.h). out [..., N] in x's dtype.
  // CPU also takes panels of 16 weight rows (group 32): qweight [N / 16, K / 32, 256] uint8
  // (int4) or [N / 16, K / 32, 512] int8, scales and mins [N / 16, K / 32, 16] (layout and
  // arithmetic in csrc/cpu_qpanel.h).
  m.def(
      "quantized_linear(Tensor x, Tensor qweight, Tensor scales, Tensor? mins=None, "
      "Tensor? bias=None) -> Tensor");

  // ---------------------------------------------------------------- decoder-layer glue
  // The small ops between a Llama-family layer's linears, one call each instead of 5-14 torch
  // ops (their dispatch cost more than their arithmetic at batch 1), each bit-identical to the
  // torch expression it replaces. Rows are independent: batch-invariant. Activations float32,
  // bfloat16 or float16; weights and cos/sin in the activations' dtype; statistics in float32.
  // RMSNorm over the last dim H: weight [H] * to_dtype(x * rsqrt(mean(x^2) + eps)).
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  // The residual add fused with the next norm: sum = x + residual (in x's dtype), and
  // rms_norm(sum, weight, eps). Returns (sum, normed).
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  // Rotary embedding, rotate-half form: x [B, T, H, D] (last dim contiguous), cos and sin
  // [B, T, D]: out = x * cos + rotate_half(x) * sin, each product and the sum rounded to x's
  // dtype (bit-identical to that torch expression). out [B, T, H, D] contiguous.
  m.def("rotary_embedding(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  // The gated MLP's activation: silu(gate) * up for gate and up [..., I] (last dim contiguous;
  // the two halves of one joined projection are fine; SiLU as torch computes it on a
  // contiguous gate). out [..., I] contiguous.
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  // The decoder layers of a Llama-family model over one block, in one call: per layer the
  // q/k/v linears (joined or not), the rotary embedding of q and k, their K/V written to the
  // layer's cache rows, tree attention, the o linear, add_rms_norm, gate/up (joined or not),
  // silu_mul, down, add_rms_norm: the ops above, in that order (the direct forward's loop,
  // models/direct_forward.py, bit for bit). hidden [B, T, H] (embeddings); cos, sin [B, T, D];
  // kv_cache [>= L, 2, B, Hkv, S, D] (KVCache.buffer), the block's K/V written at rows
  // write_start .. write_start + T - 1, or at write_index [B, T] int64 where given, and
  // attention over rows < kv_len with cache_lens and tree_mask as tree_attention's; norms
  // [2L + 1]: the first layer's input norm, then per layer its post-attention norm and the
  // norm after it (the next layer's input norm, the final norm after the last layer);
  // linears [28 L]: per layer q, k, v, o, gate, up, down, each (weight, scales, mins, bias):
  // scales given -> quantized_linear, else small_batch_linear; k, v absent: q holds q/k/v
  // joined; up absent: gate holds gate/up joined. Returns the final norm's output [B, T, H]
  // and the hidden states after each layer in capture.
  m.def(
      "decoder_stack_(Tensor hidden, Tensor cos, Tensor sin, Tensor(a!) kv_cache, int write_start, "
      "Tensor? write_index, int kv_len, Tensor cache_lens, Tensor tree_mask, Tensor[] norms, "
      "Tensor?[] linears, int num_heads, int num_kv_heads, float scale, float eps, "
      "int[] capture) -> (Tensor, Tensor[])");

  // Rows of a lookahead window, to follow a verification tree of tree_nodes nodes in one block
  // (block columns: the tree's nodes, then num_rows window rows). Request b's window has
  // levels[b] levels of window[b] columns; cell (l, i) sits i + l positions after the root,
  // cell (0, 0) is the root itself (block column 0) and cell (l, i) is window row
  // l * window[b] + i - 1. Row (l, i) attends to the root, cells (0, 1..i) and cells
  // (1..l, i). Returns mask [B, num_rows, tree_nodes + num_rows] bool, packed_mask
  // [B, num_rows, ceil((tree_nodes + num_rows) / 32)] int32 and positions [B, num_rows] int64
  // (offsets from the root's position; padding rows: -1 and a mask holding only themselves).
  m.def(
      "build_lookahead_masks(Tensor window, Tensor levels, int tree_nodes, int num_rows) -> "
      "(Tensor mask, Tensor packed_mask, Tensor positions)");
}
