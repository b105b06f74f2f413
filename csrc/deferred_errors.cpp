// The per-thread registry of deferred error checks (deferred_errors.h) and its two ops.

#include "deferred_errors.h"

#include <torch/library.h>

#include <cstddef>
#include <deque>
#include <utility>

namespace specdec {
namespace {

constexpr size_t kMaxDeferred = 64;

thread_local bool deferred = false;
thread_local std::deque<std::function<void()>> checks;

bool set_deferred_errors(bool enabled) {
  const bool previous = deferred;
  deferred = enabled;
  return previous;
}

// Runs every queued check in call order; the first error raises (the others are dropped).
void raise_deferred_errors() {
  std::deque<std::function<void()>> queued;
  queued.swap(checks);
  for (const auto& check : queued) check();
}

}  // namespace

bool deferred_errors_enabled() { return deferred; }

void defer_error_check(std::function<void()> check) {
  if (checks.size() >= kMaxDeferred) {
    const std::function<void()> oldest = std::move(checks.front());
    checks.pop_front();
    oldest();
  }
  checks.push_back(std::move(check));
}

}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CompositeImplicitAutograd, m) {
  m.impl("set_deferred_errors", &specdec::set_deferred_errors);
  m.impl("raise_deferred_errors", &specdec::raise_deferred_errors);
}
