"""The CUDA emulator's own checks (csrc/cuda/emulation/cuda_emulator.h), each shown on a small
kernel with a known fault and on its fixed twin (csrc/cuda/emulation/emulate_selftest.cpp): a
missing barrier is a shared-memory race, a shuffle mask without the calling lane and divergent
collectives are errors, float atomics are applied in another order under the adversarial
schedule, reads past a buffer hit its guard zone, distributed shared memory needs the cluster
barrier, threads must not leave a barrier's block, dynamic shared memory has its size."""

import pytest
import torch

from python_tests import emulation

pytestmark = pytest.mark.skipif(
    emulation.library() is None, reason=emulation.UNAVAILABLE or "emulator unavailable"
)

THREADS = 128
NEIGHBOUR, WARP_SUM, DIVERGENT, ATOMIC_SUM, BOUNDS, CLUSTER, EARLY_EXIT, SHARED_BOUNDS = range(8)


def run(which, fault, values=None, *, adversarial=False):
    """Runs self-test `which` (its fault, or its fixed twin); returns (out, error message)."""
    call = emulation.Call(adversarial)
    values = torch.arange(1.0, THREADS + 1) if values is None else values
    x = call.guarded(values, "in")
    out = call.guarded(torch.zeros(THREADS), "out")
    call.lib.specdec_emu_selftest(which, int(fault), x.data_ptr(), out.data_ptr())
    try:
        call.check()
    except RuntimeError as e:
        return out.clone(), str(e)
    return out.clone(), ""


@pytest.mark.parametrize("adversarial", [False, True])
def test_missing_barrier_is_a_race(adversarial):
    out, error = run(NEIGHBOUR, False, adversarial=adversarial)
    assert not error and torch.equal(out, torch.arange(1.0, THREADS + 1).roll(-1))
    _, error = run(NEIGHBOUR, True, adversarial=adversarial)
    assert "shared-memory race" in error and "no barrier or warp collective between them" in error


def test_shuffle_mask_must_hold_the_calling_lane():
    out, error = run(WARP_SUM, False)
    assert not error and out[:32].eq(sum(range(1, 33))).all()
    _, error = run(WARP_SUM, True)
    assert "with mask 0x7fffffff called by lane 31, which is not in it" in error


def test_divergent_collectives_are_reported():
    _, error = run(DIVERGENT, True)
    assert "deadlock or divergent collectives" in error


def test_float_atomics_take_another_order_when_adversarial():
    """Magnitudes 2^20, 1 and 2^-20: float sums of them in different orders differ, as the sums
    of a GPU's atomics do (their order is free). Lockstep adds in thread order; adversarial
    applies the additions in another order."""
    values = torch.tensor([2.0**20, 1.0, -2.0**20] + [2.0**-20] * (THREADS - 3))
    in_order = torch.zeros((), dtype=torch.float32)
    for v in values:
        in_order = in_order + v
    lockstep, error = run(ATOMIC_SUM, False, values)
    assert not error and lockstep[0] == in_order
    adversarial, error = run(ATOMIC_SUM, False, values, adversarial=True)
    assert not error and adversarial[0] != lockstep[0]
    assert abs(float(adversarial[0]) - float(values.double().sum())) < 1e-3


def test_reads_past_a_buffer_hit_its_guard_zone():
    _, error = run(BOUNDS, False)
    assert not error
    _, error = run(BOUNDS, True)
    assert "read out of bounds: 4 bytes at 0 bytes past the end of in" in error


def test_distributed_shared_memory_needs_the_cluster_barrier():
    out, error = run(CLUSTER, False)
    assert not error and out[:2].tolist() == [1.0, 0.0]
    _, error = run(CLUSTER, True)
    assert "shared-memory race" in error or "which has exited" in error


def test_threads_leaving_before_a_barrier_are_reported():
    _, error = run(EARLY_EXIT, True)
    assert "threads exited while others wait at a barrier" in error


def test_dynamic_shared_memory_has_its_size():
    out, error = run(SHARED_BOUNDS, False)
    assert not error and out[0] == 1.0
    _, error = run(SHARED_BOUNDS, True)
    assert "shared-memory read outside the block's shared memory" in error
