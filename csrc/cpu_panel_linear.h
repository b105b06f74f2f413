// quantized_linear's CPU kernel for a panel-layout weight (cpu_qpanel.h), for C++ callers:
// the weight is checked once (panel_linear), then run on raw rows into a float32 buffer
// (run_panel_linear), the quantized x rows kept in a PanelRows the caller reuses. The op
// (quantized_linear.cpp) takes the same two steps, so both give the same bits; decoder_stack_'s
// one-call path (decoder_stack.cpp) runs a forward's linears this way without a dispatch or an
// allocation apiece.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <optional>

#include "cpu_qpanel.h"

namespace specdec {

// A panel-layout weight of N rows of K values, its parts contiguous (mins undefined: none).
struct PanelLinear {
  at::Tensor qweight, scales, mins;
  int64_t N = 0, K = 0, panels = 0, blocks = 0, entries = 0;
  bool int4 = false, kquant = false, halves = false;
};

// Checks a panel-layout qweight, its scales and mins against rows of K values; the messages
// are quantized_linear's.
PanelLinear panel_linear(const at::Tensor& qweight, const at::Tensor& scales,
                         const std::optional<at::Tensor>& mins, int64_t K);

// out [M, N] (float32, rows N apart) = x [M, K] (rows K apart) times the weight's rows, no
// bias; x's blocks are quantized into `rows`.
void run_panel_linear(const PanelLinear& w, const float* x, int64_t M, float* out,
                      qpanel::PanelRows& rows);
void run_panel_linear(const PanelLinear& w, const c10::BFloat16* x, int64_t M, float* out,
                      qpanel::PanelRows& rows);

}  // namespace specdec
