// prototype: bf16 weight table
namespace specdec { namespace rows {
constexpr int kTableSpan = 2048;
constexpr uint32_t kTableLow = 0x3B80u;
inline void build_table(float M, float inv_t, float* t) {
  for (int k = 0; k < 2 * kTableSpan; ++k) {
    const uint32_t bits = ((k >= kTableSpan ? 0x8000u : 0u) + kTableLow + (k % kTableSpan)) << 16;
    float l; std::memcpy(&l, &bits, 4);
    t[k] = specdec_exp(mul_rn(sub_rn(l, M), inv_t));
  }
}
SPECDEC_TARGET_AVX512 inline void exp_sum_table_avx512(const float* l, int64_t begin, int64_t end,
    float max_logit, float inv_temperature, float min_weight, const float* table, double* sum) {
  const __m512 floor_w = _mm512_set1_ps(min_weight);
  const __m512 m = _mm512_set1_ps(max_logit);
  const __m512 inv_t = _mm512_set1_ps(inv_temperature);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i low = _mm512_set1_epi32(kTableLow), span = _mm512_set1_epi32(kTableSpan);
  const __m512i mag = _mm512_set1_epi32(0x7FFF), signbit = _mm512_set1_epi32(0x800);
  __m512d s_lo = _mm512_setzero_pd(), s_hi = _mm512_setzero_pd();
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 k = tail_mask(end - i);
    const __m512 v = _mm512_mask_loadu_ps(neg_inf, k, l + i);
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
    const __m512i d = _mm512_sub_epi32(_mm512_and_si512(bits, mag), low);
    const __mmask16 in = _mm512_cmplt_epu32_mask(d, span);
    const __m512i idx = _mm512_add_epi32(d, _mm512_and_si512(_mm512_srli_epi32(bits, 4), signbit));
    __m512 raw = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, idx, table, 4);
    if (__builtin_expect((in | static_cast<__mmask16>(~k)) != 0xFFFF, 0))
      raw = _mm512_mask_blend_ps(in, simd::exp16(_mm512_mul_ps(_mm512_sub_ps(v, m), inv_t)), raw);
    const __m512 w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(raw, floor_w, _CMP_GE_OQ), raw);
    add_wide(w, s_lo, s_hi);
  }
  *sum = finish_wide(s_lo, s_hi);
}
SPECDEC_TARGET_AVX2 inline void exp_sum_table_avx2(const float* l, int64_t begin, int64_t end,
    float max_logit, float inv_temperature, float min_weight, const float* table, double* sum) {
  const __m256 floor_w = _mm256_set1_ps(min_weight);
  const __m256 m = _mm256_set1_ps(max_logit);
  const __m256 inv_t = _mm256_set1_ps(inv_temperature);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256i low = _mm256_set1_epi32(kTableLow), spanm1 = _mm256_set1_epi32(kTableSpan - 1);
  const __m256i mag = _mm256_set1_epi32(0x7FFF), signbit = _mm256_set1_epi32(0x800);
  __m256d s_lo = _mm256_setzero_pd(), s_hi = _mm256_setzero_pd();
  for (int64_t i = begin; i < end; i += 8) {
    const __m256 v = i + 8 <= end ? _mm256_loadu_ps(l + i) : load8_tail(l + i, end - i, neg_inf);
    const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    const __m256i d = _mm256_sub_epi32(_mm256_and_si256(bits, mag), low);
    // d in [0, span): unsigned compare as max(d, span-1) == span-1
    const __m256i in = _mm256_cmpeq_epi32(_mm256_max_epu32(d, spanm1), spanm1);
    const __m256i idx = _mm256_add_epi32(d, _mm256_and_si256(_mm256_srli_epi32(bits, 4), signbit));
    __m256 raw = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), table, idx, _mm256_castsi256_ps(in), 4);
    if (__builtin_expect(_mm256_movemask_ps(_mm256_castsi256_ps(in)) != 0xFF, 0))
      raw = _mm256_blendv_ps(simd::exp8(_mm256_mul_ps(_mm256_sub_ps(v, m), inv_t)), raw, _mm256_castsi256_ps(in));
    const __m256 w = _mm256_and_ps(_mm256_cmp_ps(raw, floor_w, _CMP_GE_OQ), raw);
    add_wide(w, s_lo, s_hi);
  }
  *sum = finish_partials(s_lo, s_hi);
}
}}
