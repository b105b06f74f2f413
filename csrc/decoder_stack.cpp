// The decoder layers of a Llama-family model over one block, in one call (schema and semantics:
// registration.cpp): the body of models/direct_forward.py's layer loop, op for op, with the
// package's cache and kernels.
//
// At batch 1 on a CPU a decoding step of the default model ran ~360 ops from Python, and the
// Python between them cost as much as the quantized linears (bench.step_breakdown, 2026-11-26
// seventh session: 4.6 ms of a 13.2 ms step on a 2-core Xeon). Here the same ops are called
// through the dispatcher from C++, in the same order with the same operands, so the result is
// the Python loop's bits (tested) and stays batch-invariant. Registered as a composite: each
// device runs its own kernels of the ops, and fake tensors decompose.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "cpu_decoder_glue.h"
#include "cpu_linear.h"
#include "cpu_panel_linear.h"
#include "decoder_layer_common.h"
#include "linear_common.h"

namespace specdec {
namespace {

using OptionalTensor = std::optional<at::Tensor>;

// Slots of one layer in `linears`: each linear is (weight, scales, mins, bias); q/k/v and
// gate/up are one joined linear in the first slot of their group (the others absent) or
// separate linears.
constexpr int64_t kPartsPerLinear = 4;
constexpr int64_t kQ = 0, kK = 1, kV = 2, kO = 3, kGate = 4, kUp = 5, kDown = 6;
constexpr int64_t kLinearsPerLayer = 7;
constexpr int64_t kSlotsPerLayer = kLinearsPerLayer * kPartsPerLinear;

struct Linear {
  at::Tensor weight, scales, mins, bias;  // scales undefined: a float weight
  bool defined() const { return weight.defined(); }
};

using Layer = std::array<Linear, kLinearsPerLayer>;

at::Tensor quantized_linear(const at::Tensor& x, const Linear& l) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::quantized_linear", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const OptionalTensor&, const OptionalTensor&)>();
  return op.call(x, l.weight, l.scales, l.mins.defined() ? OptionalTensor(l.mins) : std::nullopt,
                 l.bias.defined() ? OptionalTensor(l.bias) : std::nullopt);
}

at::Tensor float_linear(const at::Tensor& x, const Linear& l) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::small_batch_linear", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const OptionalTensor&)>();
  return op.call(x, l.weight, l.bias.defined() ? OptionalTensor(l.bias) : std::nullopt);
}

at::Tensor apply(const Linear& l, const at::Tensor& x) {
  return l.scales.defined() ? quantized_linear(x, l) : float_linear(x, l);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::rms_norm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::add_rms_norm", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, residual, weight, eps);
}

at::Tensor rotary_embedding(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::rotary_embedding", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(x, cos, sin);
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::silu_mul", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(gate, up);
}

at::Tensor tree_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                          const at::Tensor& cache_lens, const at::Tensor& tree_mask,
                          double scale) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("specdec::tree_attention", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, double)>();
  return op.call(q, keys, values, cache_lens, tree_mask, scale);
}

Linear linear_at(const c10::List<OptionalTensor>& linears, int64_t layer, int64_t slot) {
  const int64_t base = (layer * kLinearsPerLayer + slot) * kPartsPerLinear;
  auto part = [&](int64_t i) {
    const OptionalTensor t = linears.get(base + i);
    return t.has_value() ? *t : at::Tensor();
  };
  return Linear{part(0), part(1), part(2), part(3)};
}

void check_layer(const Layer& l, int64_t layer) {
  for (int64_t slot : {kQ, kO, kGate, kDown})
    TORCH_CHECK_VALUE(l[slot].defined(), "decoder_stack_: layer ", layer, "'s linear slot ", slot,
                      " (q or joined qkv, o, gate or joined gate/up, down) has no weight");
  TORCH_CHECK_VALUE(l[kK].defined() == l[kV].defined(), "decoder_stack_: layer ", layer,
                    " has a k weight without a v weight (or v without k): give both, or "
                    "neither with q/k/v joined in the q slot");
  for (int64_t slot = 0; slot < kLinearsPerLayer; ++slot) {
    const Linear& lin = l[slot];
    TORCH_CHECK_VALUE(lin.defined() || (!lin.scales.defined() && !lin.mins.defined() &&
                                        !lin.bias.defined()),
                      "decoder_stack_: layer ", layer, "'s linear slot ", slot,
                      " has scales, mins or a bias but no weight");
    TORCH_CHECK_VALUE(!lin.mins.defined() || lin.scales.defined(), "decoder_stack_: layer ",
                      layer, "'s linear slot ", slot, " has mins without scales");
  }
}

// Rows of D contiguous values converted one by one (float32 to the cache's type, rounded to
// nearest even as copy_ rounds), for the one-range case on CPU: copy_'s dispatch and iterator
// cost more than the few hundred values of a decoding step (~1.5 us, twice a layer).
template <typename cache_t>
void write_rows_cpu(at::Tensor& cache, const at::Tensor& states, int64_t start) {
  const int64_t B = states.size(0), T = states.size(1), H = states.size(2), D = states.size(3);
  const float* src = states.const_data_ptr<float>();
  cache_t* dst = cache.mutable_data_ptr<cache_t>();
  const auto ss = states.strides();
  const auto cs = cache.strides();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* in = src + b * ss[0] + t * ss[1] + h * ss[2];
        cache_t* out = dst + b * cs[0] + h * cs[1] + (start + t) * cs[2];
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<cache_t>(in[d]);
      }
}

// Stores the block's K or V [B, T, Hkv, D] at its rows of the layer's cache [B, Hkv, S, D]
// (as KVCache.write: one row range, or each request's rows by index).
void write_rows(at::Tensor cache, const at::Tensor& states, int64_t start,
                const OptionalTensor& rows) {
  if (!rows.has_value() && cache.is_cpu() && states.is_cpu() &&
      states.scalar_type() == at::kFloat && states.stride(3) == 1 && cache.stride(3) == 1 &&
      states.size(1) * states.size(2) * states.size(3) <= 4096) {
    switch (cache.scalar_type()) {
      case at::kFloat: return write_rows_cpu<float>(cache, states, start);
      case at::kBFloat16: return write_rows_cpu<c10::BFloat16>(cache, states, start);
      case at::kHalf: return write_rows_cpu<c10::Half>(cache, states, start);
      default: break;
    }
  }
  const at::Tensor block = states.transpose(1, 2);  // [B, Hkv, T, D]
  if (!rows.has_value()) {
    cache.narrow(2, start, block.size(2)).copy_(block);
    return;
  }
  const int64_t B = block.size(0), T = block.size(2);
  cache.scatter_(2, rows->view({B, 1, T, 1}).expand_as(block), block.to(cache.scalar_type()));
}

// ------------------------------------------------------------------------ the one-call path
//
// Where every linear takes the package's kernels as float32 rows (a float32 weight, or a panel
// weight: a GGUF file's precision, the quantized-self draft) on CPU, the layers run here without
// a dispatch per op: the linears and the glue ops' arithmetic on buffers allocated once a call
// and reused by every layer, the same kernels on the same values, so the same bits as the ops
// (tested against the ops composed one by one and the Python loop). Only torch's row sums,
// SiLU and the tree attention are still called as ops. The int4 draft's one-token forward spent
// ~29% of its calling thread in dispatch and allocation (perf, bench/RESULTS.md 2026-12-04
// twenty-fifth session).

struct StackShape {
  int64_t B, T, H, heads, kv_heads, D;
  int64_t rows() const { return B * T; }
};

bool is_panel(const Linear& l) { return l.weight.dim() == 3 && l.scales.defined(); }

bool is_float32(const Linear& l) {
  return l.weight.dim() == 2 && !l.scales.defined() && l.weight.scalar_type() == at::kFloat;
}

// A CPU tensor with its data: not a fake, functional or Python-subclass tensor, which the
// composite meets while tracing (opcheck, torch.compile) and must decompose into the ops for.
bool holds_cpu_data(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return t.is_cpu() && t.has_storage() && !keys.has(c10::DispatchKey::Python) &&
         !keys.has(c10::DispatchKey::Functionalize);
}

bool one_call_applies(const at::Tensor& hidden, const at::Tensor& kv_cache,
                      const std::vector<Layer>& layers) {
  if (hidden.scalar_type() != at::kFloat || !holds_cpu_data(hidden) ||
      !holds_cpu_data(kv_cache) || c10::impl::TorchDispatchModeTLS::any_modes_set())
    return false;
  for (const Layer& layer : layers)
    for (const Linear& l : layer)
      if (l.defined() && !(holds_cpu_data(l.weight) && (is_panel(l) || is_float32(l))))
        return false;
  return true;
}

// A float32 buffer of rows x width, reused while the width stays (every layer's is the same).
struct Rows {
  at::Tensor t;
  float* ensure(int64_t rows, int64_t width) {
    if (!t.defined() || t.size(0) != rows || t.size(1) != width)
      t = at::empty({rows, width}, at::TensorOptions().dtype(at::kFloat));
    return t.mutable_data_ptr<float>();
  }
};

// Runs a layer's linears on float32 rows into reused buffers, as the ops would.
struct LinearRunner {
  qpanel::PanelRows quantized;  // x's blocks for panel weights, reused by every linear

  // out [M, N] = input [..., K] (contiguous float32, M rows) by the linear, plus its bias;
  // `what` names the linear in errors.
  float* run(const Linear& l, const at::Tensor& input, int64_t M, int64_t N, Rows& out,
             int64_t layer, const char* what) {
    const float* x = input.const_data_ptr<float>();
    if (!is_panel(l)) {
      const OptionalTensor bias = l.bias.defined() ? OptionalTensor(l.bias) : std::nullopt;
      const int64_t rows = check_small_batch_linear_args(input, l.weight, bias);
      check_rows(rows, N, layer, what);
      float* o = out.ensure(M, N);
      const at::Tensor b = l.bias.defined() ? l.bias.contiguous() : at::Tensor();
      run_small_batch_linear(x, M, l.weight, b.defined() ? b.const_data_ptr<float>() : nullptr, o);
      return o;
    }
    const PanelLinear w = panel_linear(l.weight, l.scales,
                                       l.mins.defined() ? OptionalTensor(l.mins) : std::nullopt,
                                       input.size(-1));
    check_rows(w.N, N, layer, what);
    float* o = out.ensure(M, N);
    run_panel_linear(w, x, M, o, quantized);
    if (l.bias.defined()) {  // as quantized_linear adds it: elementwise, the same for every row
      TORCH_CHECK_VALUE(l.bias.dim() == 1 && l.bias.size(0) == N &&
                            l.bias.scalar_type() == at::kFloat,
                        "quantized_linear: bias must be float32 of shape [", N, "], got ",
                        l.bias.scalar_type(), " ", l.bias.sizes());
      const at::Tensor b = l.bias.contiguous();
      const float* pb = b.const_data_ptr<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) o[m * N + n] += pb[n];
    }
    return o;
  }

  static void check_rows(int64_t rows, int64_t N, int64_t layer, const char* what) {
    TORCH_CHECK_VALUE(rows == N, "decoder_stack_: layer ", layer, "'s ", what, " weight has ",
                      rows, " rows, not ", N);
  }
};

// Norm i's weight as float32 rows (checked against the hidden states, as the norm ops do).
const float* norm_weight(const at::TensorList& norms, int64_t i, const at::Tensor& like,
                         std::vector<at::Tensor>& keep) {
  check_norm_args(like, norms[i], i == 0 ? "rms_norm" : "add_rms_norm");
  keep.push_back(norms[i].contiguous());
  return keep.back().const_data_ptr<float>();
}

std::tuple<at::Tensor, std::vector<at::Tensor>> one_call_stack_cpu(
    const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& kv_cache, int64_t write_start, const OptionalTensor& write_index,
    const at::Tensor& cache_lens, const at::Tensor& tree_mask, at::TensorList norms,
    const std::vector<Layer>& layers, const StackShape& s, double scale, double eps,
    at::IntArrayRef capture) {
  const int64_t M = s.rows(), H = s.H, D = s.D, L = static_cast<int64_t>(layers.size());
  const int64_t nq = s.heads * D, nkv = s.kv_heads * D;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor input = hidden.contiguous();
  at::Tensor x = at::empty({s.B, s.T, H}, f32), h = at::empty({s.B, s.T, H}, f32);
  at::Tensor squares = at::empty({M, H}, f32), sums = at::empty({M}, f32);
  // Rotated q and k side by side: the attention reads q's heads, the cache gets k's.
  const at::Tensor qk = at::empty({s.B, s.T, s.heads + s.kv_heads, D}, f32);
  const at::Tensor q = qk.narrow(2, 0, s.heads), k = qk.narrow(2, s.heads, s.kv_heads);
  check_rotary_embedding_args(q, cos, sin);
  const at::Tensor c = cos.expand({s.B, s.T, D}).contiguous();
  const at::Tensor sn = sin.expand({s.B, s.T, D}).contiguous();
  const glue::HeadStrides qk_strides{qk.stride(0), qk.stride(1), qk.stride(2)};
  auto rotate = [&](const float* src, int64_t width, int64_t heads, int64_t first_head) {
    glue::rotary_rows(src, glue::HeadStrides{s.T * width, width, D}, c.const_data_ptr<float>(),
                      sn.const_data_ptr<float>(), qk.mutable_data_ptr<float>() + first_head * D,
                      qk_strides, s.B, s.T, heads, D);
  };
  std::vector<at::Tensor> kept_norms;
  LinearRunner linear;
  Rows qkv, q_rows, k_rows, v_rows, o_rows, gate_up, gate_rows, up_rows, gated;
  at::Tensor act;  // SiLU of the gate, [M, I]

  std::vector<at::Tensor> captured(capture.size());  // in capture's order
  float* px = x.mutable_data_ptr<float>();
  float* ph = h.mutable_data_ptr<float>();
  glue::rms_norm_rows(input.const_data_ptr<float>(), norm_weight(norms, 0, input, kept_norms), px,
                      M, H, eps, squares, sums);
  for (int64_t layer = 0; layer < L; ++layer) {
    const Layer& lin = layers[layer];
    at::Tensor v;  // [B, T, Hkv, D]
    auto width = [&](int64_t slot) {  // output columns of a linear
      const at::Tensor& w = lin[slot].weight;
      return is_panel(lin[slot]) ? w.size(0) * qpanel::kPanelRows : w.size(0);
    };
    if (!lin[kK].defined()) {  // q, k, v joined: one rotary pass over q and k side by side
      TORCH_CHECK_VALUE(width(kQ) == nq + 2 * nkv, "decoder_stack_: layer ", layer,
                        "'s joined q/k/v has ", width(kQ), " columns, not (Hq + 2 Hkv) D = ",
                        nq + 2 * nkv);
      const float* out = linear.run(lin[kQ], x, M, nq + 2 * nkv, qkv, layer, "q/k/v");
      rotate(out, nq + 2 * nkv, s.heads + s.kv_heads, 0);
      v = qkv.t.view({s.B, s.T, -1}).narrow(-1, nq + nkv, nkv).view({s.B, s.T, s.kv_heads, D});
    } else {
      TORCH_CHECK_VALUE(width(kQ) == nq && width(kK) == nkv && width(kV) == nkv,
                        "decoder_stack_: layer ", layer, "'s q/k/v have ", width(kQ), "/",
                        width(kK), "/", width(kV), " columns, not Hq D = ", nq,
                        " and Hkv D = ", nkv);
      rotate(linear.run(lin[kQ], x, M, nq, q_rows, layer, "q"), nq, s.heads, 0);
      rotate(linear.run(lin[kK], x, M, nkv, k_rows, layer, "k"), nkv, s.kv_heads, s.heads);
      linear.run(lin[kV], x, M, nkv, v_rows, layer, "v");
      v = v_rows.t.view({s.B, s.T, s.kv_heads, D});
    }
    const at::Tensor layer_kv = kv_cache.select(0, layer);
    const at::Tensor keys = layer_kv.select(0, 0), values = layer_kv.select(0, 1);
    write_rows(keys, k, write_start, write_index);
    write_rows(values, v, write_start, write_index);
    const at::Tensor attended = tree_attention(q, keys, values, cache_lens, tree_mask, scale)
                                    .contiguous()
                                    .view({s.B, s.T, nq});
    const float* o = linear.run(lin[kO], attended, M, H, o_rows, layer, "o");
    glue::add_rms_norm_rows(o, layer == 0 ? input.const_data_ptr<float>() : ph,
                            norm_weight(norms, 1 + 2 * layer, input, kept_norms), ph, px, M, H,
                            eps, squares, sums);
    const float* up;
    int64_t inner;
    if (!lin[kUp].defined()) {  // gate and up joined: the two halves of one output
      inner = width(kGate) / 2;
      const float* both = linear.run(lin[kGate], x, M, 2 * inner, gate_up, layer, "gate/up");
      float* gate = gate_rows.ensure(M, inner);  // contiguous, as the op makes it for SiLU
      for (int64_t m = 0; m < M; ++m)
        std::memcpy(gate + m * inner, both + m * 2 * inner, inner * sizeof(float));
      up = both + inner;
    } else {
      inner = width(kGate);
      linear.run(lin[kGate], x, M, inner, gate_rows, layer, "gate");
      up = linear.run(lin[kUp], x, M, inner, up_rows, layer, "up");
    }
    if (!act.defined() || act.size(1) != inner) act = at::empty({M, inner}, f32);
    float* g = gated.ensure(M, inner);
    glue::silu_mul_rows(gate_rows.t, up, lin[kUp].defined() ? inner : 2 * inner, g, act, M, inner);
    const float* mlp = linear.run(lin[kDown], gated.t, M, H, o_rows, layer, "down");
    glue::add_rms_norm_rows(mlp, ph, norm_weight(norms, 2 + 2 * layer, input, kept_norms), ph, px,
                            M, H, eps, squares, sums);
    for (size_t i = 0; i < capture.size(); ++i)
      if (capture[i] == layer) captured[i] = h.clone();
  }
  return {x, captured};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> decoder_stack(
    const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& kv_cache, int64_t write_start, const OptionalTensor& write_index,
    int64_t kv_len, const at::Tensor& cache_lens, const at::Tensor& tree_mask,
    at::TensorList norms, const c10::List<OptionalTensor>& linears, int64_t num_heads,
    int64_t num_kv_heads, double scale, double eps, at::IntArrayRef capture) {
  TORCH_CHECK_VALUE(hidden.dim() == 3, "decoder_stack_: hidden must be [B, T, H], got ",
                    hidden.sizes());
  const int64_t B = hidden.size(0), T = hidden.size(1);
  TORCH_CHECK_VALUE(linears.size() % kSlotsPerLayer == 0, "decoder_stack_: linears must hold ",
                    kSlotsPerLayer, " entries a layer (7 linears of weight, scales, mins, bias), "
                    "got ", linears.size());
  const int64_t L = static_cast<int64_t>(linears.size()) / kSlotsPerLayer;
  TORCH_CHECK_VALUE(static_cast<int64_t>(norms.size()) == 2 * L + 1, "decoder_stack_: norms must "
                    "hold 2L + 1 = ", 2 * L + 1, " weights for L = ", L, " layers, got ",
                    norms.size());
  TORCH_CHECK_VALUE(kv_cache.dim() == 6 && kv_cache.size(0) >= L && kv_cache.size(1) == 2 &&
                        kv_cache.size(2) == B && kv_cache.size(3) == num_kv_heads,
                    "decoder_stack_: kv_cache must be [>= L, 2, B, Hkv, S, D] = [>= ", L, ", 2, ",
                    B, ", ", num_kv_heads, ", S, D], got ", kv_cache.sizes());
  TORCH_CHECK_VALUE(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
                    "decoder_stack_: num_heads (", num_heads, ") must be a multiple of "
                    "num_kv_heads (", num_kv_heads, ")");
  const int64_t S = kv_cache.size(4), D = kv_cache.size(5);
  TORCH_CHECK_VALUE(kv_len >= T && kv_len <= S, "decoder_stack_: kv_len (", kv_len,
                    ") must be in [T, S] = [", T, ", ", S, "]");
  if (write_index.has_value()) {
    TORCH_CHECK_VALUE(write_index->dim() == 2 && write_index->size(0) == B &&
                          write_index->size(1) == T && write_index->scalar_type() == at::kLong,
                      "decoder_stack_: write_index must be int64 [B, T] = [", B, ", ", T,
                      "], got ", write_index->scalar_type(), " ", write_index->sizes());
  } else {
    TORCH_CHECK_VALUE(write_start >= 0 && write_start <= kv_len - T, "decoder_stack_: rows ",
                      write_start, " .. ", write_start + T, " of the block do not fit in kv_len ",
                      kv_len);
  }
  for (int64_t point : capture)
    TORCH_CHECK_VALUE(point >= 0 && point < L, "decoder_stack_: capture point ", point,
                      " is not a layer in [0, ", L, ")");

  std::vector<Layer> layers(L);
  for (int64_t layer = 0; layer < L; ++layer) {
    for (int64_t slot = 0; slot < kLinearsPerLayer; ++slot)
      layers[layer][slot] = linear_at(linears, layer, slot);
    check_layer(layers[layer], layer);
  }
  const StackShape shape{B, T, hidden.size(2), num_heads, num_kv_heads, D};
  if (one_call_applies(hidden, kv_cache, layers))
    return one_call_stack_cpu(hidden, cos, sin, kv_cache, write_start, write_index, cache_lens,
                           tree_mask, norms, layers, shape, scale, eps, capture);

  const int64_t nq = num_heads * D, nkv = num_kv_heads * D;
  std::vector<at::Tensor> captured(capture.size());  // in capture's order
  at::Tensor h = hidden;
  at::Tensor x = rms_norm(hidden, norms[0], eps);
  for (int64_t layer = 0; layer < L; ++layer) {
    const Layer& lin = layers[layer];
    at::Tensor q, k, v;
    if (!lin[kK].defined()) {  // q, k, v joined: one rotary pass over q and k side by side
      const at::Tensor joined = apply(lin[kQ], x);
      TORCH_CHECK_VALUE(joined.size(-1) == nq + 2 * nkv, "decoder_stack_: layer ", layer,
                        "'s joined q/k/v has ", joined.size(-1), " columns, not (Hq + 2 Hkv) D = ",
                        nq + 2 * nkv);
      const at::Tensor qk = rotary_embedding(joined.narrow(-1, 0, nq + nkv).view({B, T, -1, D}),
                                             cos, sin);
      q = qk.narrow(2, 0, num_heads);
      k = qk.narrow(2, num_heads, num_kv_heads);
      v = joined.narrow(-1, nq + nkv, nkv).view({B, T, -1, D});
    } else {
      const at::Tensor q_out = apply(lin[kQ], x), k_out = apply(lin[kK], x), v_out = apply(lin[kV], x);
      // The heads come from the arguments, not from the widths: a k of one head would
      // otherwise broadcast into every KV head's cache rows.
      TORCH_CHECK_VALUE(q_out.size(-1) == nq && k_out.size(-1) == nkv && v_out.size(-1) == nkv,
                        "decoder_stack_: layer ", layer, "'s q/k/v have ", q_out.size(-1), "/",
                        k_out.size(-1), "/", v_out.size(-1), " columns, not Hq D = ", nq,
                        " and Hkv D = ", nkv);
      q = rotary_embedding(q_out.view({B, T, num_heads, D}), cos, sin);
      k = rotary_embedding(k_out.view({B, T, num_kv_heads, D}), cos, sin);
      v = v_out.view({B, T, num_kv_heads, D});
    }
    const at::Tensor layer_kv = kv_cache.select(0, layer);
    const at::Tensor keys = layer_kv.select(0, 0), values = layer_kv.select(0, 1);
    write_rows(keys, k, write_start, write_index);
    write_rows(values, v, write_start, write_index);
    // The CPU kernel reads rows below cache_lens + T only: the whole cache, not a narrowed
    // view of it (two view ops a layer less, the same rows).
    const bool whole = kv_cache.is_cpu();
    const at::Tensor out = tree_attention(q, whole ? keys : keys.narrow(2, 0, kv_len),
                                          whole ? values : values.narrow(2, 0, kv_len),
                                          cache_lens, tree_mask, scale);
    const at::Tensor attended = apply(lin[kO], out.reshape({B, T, -1}));
    std::tie(h, x) = add_rms_norm(attended, h, norms[1 + 2 * layer], eps);
    at::Tensor gated;
    if (!lin[kUp].defined()) {  // gate and up joined: the two halves of one output
      const at::Tensor gate_up = apply(lin[kGate], x);
      const int64_t inner = gate_up.size(-1) / 2;
      gated = silu_mul(gate_up.narrow(-1, 0, inner), gate_up.narrow(-1, inner, inner));
    } else {
      gated = silu_mul(apply(lin[kGate], x), apply(lin[kUp], x));
    }
    const at::Tensor mlp = apply(lin[kDown], gated);
    std::tie(h, x) = add_rms_norm(mlp, h, norms[2 + 2 * layer], eps);
    for (size_t i = 0; i < capture.size(); ++i)
      if (capture[i] == layer) captured[i] = h;
  }
  return {x, captured};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CompositeImplicitAutograd, m) {
  m.impl("decoder_stack_", &decoder_stack);
}

}  // namespace specdec
