namespace specdec { namespace rows {
// 2x unrolled: vectors i (even) and i+8 (odd) into separate accumulator pairs
SPECDEC_TARGET_AVX2 inline void exp_sum_table2_avx2(const float* l, int64_t begin, int64_t end,
    float max_logit, float inv_temperature, float min_weight, const float* table, double* sum) {
  const __m256 floor_w = _mm256_set1_ps(min_weight);
  const __m256 m = _mm256_set1_ps(max_logit);
  const __m256 inv_t = _mm256_set1_ps(inv_temperature);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256d a_lo = _mm256_setzero_pd(), a_hi = _mm256_setzero_pd();
  __m256d b_lo = _mm256_setzero_pd(), b_hi = _mm256_setzero_pd();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(l + i), v1 = _mm256_loadu_ps(l + i + 8);
    const __m256 r0 = raw_weights8(v0, _mm256_mul_ps(_mm256_sub_ps(v0, m), inv_t), table);
    const __m256 r1 = raw_weights8(v1, _mm256_mul_ps(_mm256_sub_ps(v1, m), inv_t), table);
    add_wide(_mm256_and_ps(_mm256_cmp_ps(r0, floor_w, _CMP_GE_OQ), r0), a_lo, a_hi);
    add_wide(_mm256_and_ps(_mm256_cmp_ps(r1, floor_w, _CMP_GE_OQ), r1), b_lo, b_hi);
  }
  for (; i < end; i += 8) {
    const __m256 v = i + 8 <= end ? _mm256_loadu_ps(l + i) : load8_tail(l + i, end - i, neg_inf);
    const __m256 r = raw_weights8(v, _mm256_mul_ps(_mm256_sub_ps(v, m), inv_t), table);
    add_wide(_mm256_and_ps(_mm256_cmp_ps(r, floor_w, _CMP_GE_OQ), r), a_lo, a_hi);
  }
  *sum = finish_partials(_mm256_add_pd(a_lo, b_lo), _mm256_add_pd(a_hi, b_hi));
}
}}
