"""What the op families' wrappers share."""

from __future__ import annotations

import torch
from torch import Tensor


def needs_host_check(validate: bool, *tensors: Tensor) -> bool:
    """Whether to check index values on the host before a CUDA launch: only when the caller asks
    (the CPU kernels always check, for free). A host copy is impossible during graph capture."""
    if not validate or all(t.device.type == "cpu" for t in tensors):
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError("validate=True copies index values to the host, which CUDA graph "
                         "capture does not allow; validate outside the captured region")
    return True
