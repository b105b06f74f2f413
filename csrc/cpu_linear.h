// small_batch_linear's CPU kernel on raw float32 rows, for C++ callers (decoder_stack_'s one-call
// path, decoder_stack.cpp): the op (linear.cpp) runs its float32 rows through this function, so
// both give the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace specdec {

// out [M, N] (rows N apart) = x [M, K] (rows K apart) times weight [N, K] (float32, checked by
// the caller) transposed, plus bias [N] (or nullptr) as the kernel adds it.
void run_small_batch_linear(const float* x, int64_t M, const at::Tensor& weight, const float* bias,
                            float* out);

}  // namespace specdec
