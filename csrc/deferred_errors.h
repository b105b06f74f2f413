// Deferred checks of the device-side error codes of the CUDA sampling and verification ops
// (see the rules in specdec_kernels/ops/sampling.py). The registry lives in CPU code so
// that the two control ops exist in every build; only the CUDA launchers queue checks.
#pragma once

#include <functional>

namespace specdec {

// Whether the calling thread has deferred error checks on (ops.deferred_errors()).
bool deferred_errors_enabled();

// Queues a check for raise_deferred_errors (run in call order). At most 64 stay queued: past
// that the oldest runs now, so a caller that never checks still gets its error, late.
void defer_error_check(std::function<void()> check);

}  // namespace specdec
