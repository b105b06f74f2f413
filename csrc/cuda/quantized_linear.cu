// CUDA path of quantized_linear: the same arithmetic through torch (x quantized per row in
// blocks of 32, the weight dequantized, then torch's linear). The CPU kernel's reason to
// exist (streaming few rows over quantized weights at the memory bandwidth, batch-invariant)
// is the CPU's; on a GPU this keeps the op callable without a device branch.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

namespace specdec {
namespace {

constexpr int64_t kXBlock = 32;

// x [M, K] -> its int8 quantization per block of 32, dequantized (float32).
at::Tensor quantize_dequantize_rows(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t blocks = (K + kXBlock - 1) / kXBlock;
  at::Tensor padded = at::constant_pad_nd(x.to(at::kFloat), {0, blocks * kXBlock - K}, 0.0);
  at::Tensor view = padded.view({M, blocks, kXBlock});
  at::Tensor amax = view.abs().amax({-1}, /*keepdim=*/true);
  at::Tensor scale = amax / 127.0;
  at::Tensor inverse = at::where(amax > 0, 127.0 / amax, at::zeros_like(amax));
  at::Tensor q = at::round(view * inverse).clamp(-127, 127);
  return (q * scale).view({M, blocks * kXBlock}).narrow(1, 0, K);
}

// The float32 [N, K] weight: scales[n, g] * q + mins[n, g].
at::Tensor dequantize(const at::Tensor& qweight, const at::Tensor& scales,
                      const std::optional<at::Tensor>& mins, int64_t K) {
  const int64_t N = qweight.size(0);
  at::Tensor q;
  if (qweight.scalar_type() == at::kByte) {  // per block of 32: byte j = value j | value j+16 << 4
    at::Tensor blocks = qweight.view({N, K / 32, 16});
    q = at::cat({at::bitwise_and(blocks, 0x0F), at::bitwise_right_shift(blocks, 4)}, -1).view({N, K});
  } else {
    q = qweight;
  }
  const int64_t groups = scales.size(1);
  at::Tensor w = q.to(at::kFloat).view({N, groups, K / groups}) * scales.to(at::kFloat).unsqueeze(-1);
  if (mins.has_value()) w = w + mins->to(at::kFloat).unsqueeze(-1);
  return w.view({N, K});
}

at::Tensor quantized_linear_cuda(const at::Tensor& x, const at::Tensor& qweight,
                                 const at::Tensor& scales, const std::optional<at::Tensor>& mins,
                                 const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1 && qweight.dim() == 2 && scales.dim() == 2,
                    "quantized_linear: x [..., K], qweight [N, K'] and scales [N, G] expected (the panel "
                    "layout [N / 16, K / 32, 256 or 512] is CPU-only), got ",
                    x.sizes(), ", ", qweight.sizes(), " and ", scales.sizes());
  const bool int4 = qweight.scalar_type() == at::kByte;
  TORCH_CHECK_VALUE(int4 || qweight.scalar_type() == at::kChar,
                    "quantized_linear: qweight must be int8 or uint8 (packed int4), got ",
                    qweight.scalar_type());
  const int64_t K = x.size(-1);
  const int64_t N = qweight.size(0);
  TORCH_CHECK_VALUE(qweight.size(1) * (int4 ? 2 : 1) == K, "quantized_linear: x has shape ",
                    x.sizes(), " but qweight has shape ", qweight.sizes());
  TORCH_CHECK_VALUE(scales.size(0) == N && scales.size(1) >= 1 && K % scales.size(1) == 0,
                    "quantized_linear: scales must have shape [N, K / group], got ", scales.sizes());
  const int64_t group = K / scales.size(1);
  TORCH_CHECK_VALUE((group & (group - 1)) == 0 && group >= (int4 ? 32 : 16),
                    "quantized_linear: the group must be a power of two >= ", int4 ? 32 : 16,
                    ", got ", group);
  TORCH_CHECK_VALUE(scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf,
                    "quantized_linear: scales must be float32 or float16, got ", scales.scalar_type());
  TORCH_CHECK_VALUE(!mins.has_value() || (mins->sizes() == scales.sizes() &&
                                          mins->scalar_type() == scales.scalar_type()),
                    "quantized_linear: mins must match scales in shape and dtype");
  TORCH_CHECK_VALUE(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == N &&
                                          bias->scalar_type() == x.scalar_type()),
                    "quantized_linear: bias must have shape [", N, "] and x's dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  std::vector<int64_t> out_sizes(x.sizes().begin(), x.sizes().end());
  out_sizes.back() = N;
  const at::Tensor rows = x.reshape({-1, K});
  const at::Tensor xd = quantize_dequantize_rows(rows);
  const at::Tensor w = dequantize(qweight, scales, mins, K);
  at::Tensor out = at::matmul(xd, w.t());
  if (bias.has_value()) out = out + bias->to(at::kFloat);
  return out.to(x.scalar_type()).view(out_sizes);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("quantized_linear", &quantized_linear_cuda); }

}  // namespace specdec
