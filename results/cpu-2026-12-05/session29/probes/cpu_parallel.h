// Work over threads by claiming: chunks of a range handed out in turn from a shared counter, so
// a thread that runs slower (the calling thread, which also does the serial work between
// kernels, measured 16-21% slower over the same int4 tiles) takes fewer of them instead of
// holding the others at the end. Which thread computes a chunk never changes its bits.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace specdec {

// Chunks a thread claims on average: enough to even out a 20% difference between threads,
// few enough that each chunk still streams its weights in one run (prefetch ahead included).
constexpr int64_t kChunksPerThread = 4;

// fn(begin, end) over [0, total) in chunks of at least `grain` items, each claimed by one of
// the threads; one call of fn on the whole range where a single thread does the work (one
// thread configured, too little work, or inside another parallel region).
template <typename F>
void parallel_claim(int64_t total, int64_t grain, const F& fn) {
  if (total <= 0) return;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const int64_t most = std::max<int64_t>(1, total / std::max<int64_t>(1, grain));
  const int64_t chunks = std::min(most, threads * kChunksPerThread);
  if (threads <= 1 || chunks <= 1) {
    fn(int64_t{0}, total);
    return;
  }
  const int64_t size = (total + chunks - 1) / chunks;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, chunks), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c * size < total;
         c = next.fetch_add(1, std::memory_order_relaxed))
      fn(c * size, std::min(total, (c + 1) * size));
  });
}

}  // namespace specdec
