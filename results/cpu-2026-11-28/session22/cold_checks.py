import sys, time, torch, statistics, operator
from itertools import repeat
sys.path.insert(0, '/work/main')
torch.set_num_threads(2)
from specdec_kernels.models import load_model
from specdec_kernels.models.direct_forward import DirectForward
from torch.utils.hooks import RemovableHandle
m = load_model(weights="float32").model
d = DirectForward(m)
big = torch.randn(40_000_000)
def cold(): big.sum()
seen, ptrs = d._weights_seen()
tensors = [t for t in seen if t is not None]
def v_orig(): return d._weights_seen()
def v_ptrs(): return list(map(torch.Tensor.data_ptr, tensors)) == ptrs
def v_ident(): return all(map(operator.is_, map(dict.get, d._parameter_dicts, repeat("weight")), seen))
def v_hooks(): return any(map(len, d._hook_dicts))
def v_stamp(): return RemovableHandle.next_id
for name, fn in [('orig seen', v_orig), ('ptrs only', v_ptrs), ('ident weights', v_ident), ('hooks', v_hooks), ('stamp', v_stamp)]:
    ts = []
    for _ in range(30):
        cold(); s = time.perf_counter(); fn(); ts.append(time.perf_counter() - s)
    print(f"{name:14s} cold {statistics.median(ts)*1e6:7.1f} us   n={len(tensors)} hooks={len(d._hook_dicts)}")
