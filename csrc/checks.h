// Argument checks shared by every operator's CPU and CUDA launchers. Messages name the
// argument and the shapes, so that a bad call reads as a ValueError-quality error in Python.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

namespace specdec {

inline bool is_index_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Int || t == c10::ScalarType::Long;
}

// `t` must be a contiguous tensor of `dtype` on `device` with exactly `sizes`.
inline void check_tensor(const at::Tensor& t, const char* name, at::IntArrayRef sizes,
                         c10::ScalarType dtype, c10::Device device) {
  TORCH_CHECK_VALUE(t.sizes() == sizes, name, " must have shape ", sizes, ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, " must have dtype ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device, name, " must be on ", device, ", got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

// `t` must be a 1-D or 2-D int32/int64 tensor; its dtype becomes the op's index dtype.
inline void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(is_index_dtype(t.scalar_type()), name, " must be int32 or int64, got ",
              t.scalar_type());
}

}  // namespace specdec
