"""What the session's probes share (run them from the repository root): the default model's
int4 layer weights, a median timer, one-token forwards of a runner, and moving a model's
quantized weights into one huge-page buffer."""
import ctypes
import statistics
import time

import torch

from specdec_kernels import ops
from specdec_kernels.models.quantized_weight import QuantizedWeight, pack_panels, quantize_weight

libc = ctypes.CDLL("libc.so.6", use_errno=True)

#: A decoder layer's linears in the default model (q/k/v joined, o, gate/up joined, down).
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


def int4_layers(layers: int = 30):
    """(weights, bytes, call): the layers' int4 panel weights and ``call(weight)``, one row
    through the kernel."""
    torch.manual_seed(0)
    weights = [pack_panels(quantize_weight(torch.randn(*s), 4, 32))
               for _ in range(layers) for s in LAYER_SHAPES]
    xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
    return (weights, sum(q.nbytes_resident for q in weights),
            lambda q: ops.quantized_linear(xs[q.shape[1]], q.qweight, q.scales, q.mins))


def median_seconds(fn, rounds: int, warm: int = 2) -> float:
    """Median wall time of ``fn()`` over ``rounds`` calls after ``warm`` unmeasured ones."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one_token_ms(runner, kv=None, prefix: int = 256, steps: int = 30) -> float:
    """Median ms of a one-token forward after ``prefix`` cached rows (K/V in ``kv``)."""
    cache = runner.new_cache(1, prefix + steps + 8, kv)
    runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    token = torch.tensor([[11]])

    def step():
        runner.forward(cache, token, list(cache.host_lens))
        cache.extend([1])

    return 1000 * median_seconds(step, steps - 4)


MADV_HUGEPAGE = 14
LINE = 64


def anon_huge_pages() -> str:
    """This process's AnonHugePages (smaps_rollup)."""
    return open("/proc/self/smaps_rollup").read().split("AnonHugePages:")[1].split("\n")[0].strip()


def huge_buffer(nbytes: int, huge: bool = True):
    """(raw, base): a uint8 buffer with ``nbytes`` usable from offset ``base``, 2 MB aligned,
    advised to huge pages when ``huge`` (before anything touches it)."""
    raw = torch.empty(nbytes + (4 << 20), dtype=torch.uint8)
    addr = raw.data_ptr()
    start = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
    if huge:
        assert libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(nbytes + (2 << 20)),
                            MADV_HUGEPAGE) == 0, ctypes.get_errno()
    return raw, start - addr


def _padded(n: int) -> int:
    return (n + LINE - 1) // LINE * LINE


def copies_in_buffer(tensors: list, huge: bool = True):
    """(raw, copies): contiguous copies of ``tensors`` (None stays None) laid end to end, a
    cache line apart, in one :func:`huge_buffer`."""
    raw, off = huge_buffer(sum(_padded(t.numel() * t.element_size()) for t in tensors if t is not None), huge)
    copies = []
    for t in tensors:
        if t is None:
            copies.append(None)
            continue
        n = t.numel() * t.element_size()
        copies.append(raw[off:off + n].view(t.dtype).view(t.shape).copy_(t))
        off += _padded(n)
    return raw, copies


def relocate(model, huge=True):
    """Move the storages of ``model``'s quantized weights (values, scales, mins), in first-use
    order, into one :func:`huge_buffer`; every view keeps its offset (joined q/k/v stay one
    storage). Returns the buffer."""
    tensors = [t for m in model.modules() if isinstance(getattr(m, "weight", None), QuantizedWeight)
               for t in (m.weight.qweight, m.weight.scales, m.weight.mins) if t is not None]
    storages = {}
    for t in tensors:
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage())
    raw, off = huge_buffer(sum(_padded(s.nbytes()) for s in storages.values()), huge)
    where = {}
    for key, storage in storages.items():
        n = storage.nbytes()
        raw[off:off + n].copy_(torch.tensor([], dtype=torch.uint8).set_(storage))
        where[key] = off
        off += _padded(n)
    print("buffer", off >> 20, "MB; AnonHugePages after the copy", anon_huge_pages())
    new = raw.untyped_storage()
    for t in {id(t): t for t in tensors}.values():
        key = t.untyped_storage().data_ptr()
        t.set_(new, where[key] // t.element_size() + t.storage_offset(), t.size(), t.stride())
    return raw
