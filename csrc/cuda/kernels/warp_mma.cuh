// Warp-level tensor-core and async-copy primitives (sm_80+): mma.sync m16n8k16 with fp32
// accumulation, ldmatrix, cp.async. No torch includes.
//
// Built two ways: by nvcc for the GPU (inline PTX), and by a host compiler with
// SPECDEC_EMULATE_CUDA defined, where csrc/cuda/emulation/cuda_emulator.h runs each thread of a
// CTA as a fiber and implements these same primitives from the PTX ISA's fragment layouts, so
// the kernels that use them can be tested on a machine without a GPU.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4; each 32-bit register holds two 16-bit values, the lower column
// (or row, for B) in the low half:
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
//                           a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B (16 x 8, "col"):      b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..2t+9][g]
//   C, D (16 x 8, fp32):    c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/device_code.cuh"

#if defined(SPECDEC_DEVICE_CODE)
#include <cstring>
#endif

namespace specdec {

#if defined(SPECDEC_DEVICE_CODE)

// Two floats rounded to a pair of 16-bit values of type T (lo in the low half), as one register.
template <typename T>
SPECDEC_DEVICE uint32_t pack_pair(float lo, float hi) {
#if defined(SPECDEC_EMULATE_CUDA)
  T pair[2];
  if constexpr (std::is_same_v<T, __half>) {
    pair[0] = __float2half_rn(lo);
    pair[1] = __float2half_rn(hi);
  } else {
    pair[0] = __float2bfloat16_rn(lo);
    pair[1] = __float2bfloat16_rn(hi);
  }
  uint32_t bits;
  std::memcpy(&bits, pair, 4);
  return bits;
#else
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 pair = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
#endif
}

#if defined(SPECDEC_EMULATE_CUDA)

SPECDEC_DEVICE void cp_async_16(void* smem, const void* gmem, bool valid) {
  emu::cp_async_16(smem, gmem, valid);
}
SPECDEC_DEVICE void cp_async_commit() { emu::cp_async_commit(); }
template <int kPending>
SPECDEC_DEVICE void cp_async_wait() {
  emu::cp_async_wait(kPending);
}
SPECDEC_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* smem) { emu::ldmatrix_x4(r, smem, false); }
SPECDEC_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  emu::ldmatrix_x4(r, smem, true);
}
template <typename T>
SPECDEC_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_16816(d, a, b0, b1, std::is_same_v<T, __half>);
}

#else  // nvcc

SPECDEC_DEVICE uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without going through registers (L1 bypassed: K/V are streamed once
// per CTA). When !valid nothing is read and the 16 bytes are zero-filled (src-size 0).
SPECDEC_DEVICE void cp_async_16(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
               "l"(gmem), "r"(src_bytes)
               : "memory");
}
SPECDEC_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
SPECDEC_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i (16-byte aligned),
// register i receives matrix i: lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1.
SPECDEC_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}
// The same, each matrix transposed: lane l holds column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.
SPECDEC_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// d += A * B for one m16n8k16 tile (fp32 accumulators), T = __half or __nv_bfloat16.
template <typename T>
SPECDEC_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

#endif  // SPECDEC_EMULATE_CUDA

#endif  // SPECDEC_DEVICE_CODE

}  // namespace specdec
