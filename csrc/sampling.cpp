// CPU kernels of sample and sample_with_probs: one task per row of logits (see
// core/sampling.h for the processing and core/philox.h for the uniforms).

// Lets g++ if-convert the clamps of specdec_exp and vectorise the per-token loops; no IEEE
// result changes (nothing here relies on floating-point traps).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "sampling_common.h"
#include "sampling_cpu.h"

namespace specdec {
namespace {

// Rows per parallel task: enough work per task to amortise the scheduling for small V.
int64_t row_grain(int64_t vocab) { return std::max<int64_t>(1, 16384 / vocab); }

template <typename scalar_t>
void sample_rows_cpu(const at::Tensor& logits, const ParamPointers& params, int mantissa,
                     int64_t* tokens, float* probs, std::vector<uint64_t>& errors) {
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const scalar_t* base = logits.const_data_ptr<scalar_t>();
  // Fewer rows than threads: rows one after another, each split over the threads by chunks.
  const bool split_rows = rows < at::get_num_threads();
  auto sample_row = [&](CpuRow& row, int64_t n) {
    tokens[n] = -1;
    if (errors[n] != kNoError) return;
    const scalar_t* l = base + n * vocab;
    const RowParams p = params.at(n);
    // Greedy rows only need the scan; others are copied in the same pass.
    const rows::Scan scan = p.greedy() ? scan_row(l, vocab, split_rows) : row.load(l, vocab, mantissa);
    if (!scan.valid()) {
      errors[n] = encode_error(kErrLogits, n);
      return;
    }
    if (p.greedy()) row.load_greedy(vocab, scan);
    row.process(p, /*with_entropy=*/false);
    tokens[n] = row.draw_target(uniforms_at(p.seed, p.offset, 0, kStreamSample).sample);
    if (probs != nullptr) row.write_probs(probs + n * vocab);
  };
  if (split_rows) {
    CpuRow row;
    row.set_parallel(true);
    for (int64_t n = 0; n < rows; ++n) sample_row(row, n);
    return;
  }
  at::parallel_for(0, rows, row_grain(vocab), [&](int64_t begin, int64_t end) {
    CpuRow row;
    for (int64_t n = begin; n < end; ++n) sample_row(row, n);
  });
}

SampleResult sample_cpu(const at::Tensor& logits, const ParamTensors& params, bool with_probs) {
  check_sample_args(logits, params);
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  at::Tensor tokens = at::empty({rows}, logits.options().dtype(at::kLong));
  at::Tensor probs =
      at::empty({with_probs ? rows : 0, vocab}, logits.options().dtype(at::kFloat));
  const ParamPointers pointers = param_pointers(params);
  std::vector<uint64_t> errors(rows, kNoError);
  for (int64_t n = 0; n < rows; ++n) {
    const uint32_t kind = check_row_params(pointers.at(n));
    if (kind != kErrNone) errors[n] = encode_error(kind, 0);
  }
  float* probs_ptr = with_probs ? probs.mutable_data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "sample_cpu", [&] {
    sample_rows_cpu<scalar_t>(logits, pointers, mantissa_bits(logits.scalar_type()),
                              tokens.mutable_data_ptr<int64_t>(), probs_ptr, errors);
  });
  ErrorContext ctx{OpKind::kSample, params};
  ctx.vocab = vocab;
  raise_first_error(errors.data(), rows, ctx);
  return {tokens, probs};
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("sample", &sample_op<sample_cpu>);
  m.impl("sample_with_probs", &sample_with_probs_op<sample_cpu>);
}

}  // namespace specdec
