"""Typed Python wrappers of ``torch.ops.specdec.*`` and their fake (meta) kernels.

One module per op family, mirroring ``csrc/`` (each family's CPU kernel in ``csrc/<family>.cpp``,
its CUDA launcher in ``csrc/cuda/<family>.cu``, every schema in ``csrc/registration.cpp``):

==========================  ==============================================================
:mod:`.tree`                 ``build_tree_masks``, ``build_lookahead_masks``, ``tree_attention``
:mod:`.sampling`             ``sample``, ``sample_with_probs``, ``deferred_errors``
:mod:`.verify`               ``verify_chain``, ``verify_tree``, ``typical_verify_*``
:mod:`.kv_cache`             ``compact_kv_cache_``, ``compact_paged_kv_cache_``,
                             ``rollback_paged_kv_cache_``
:mod:`.linear`               ``small_batch_linear``
:mod:`.quantized_linear`     ``quantized_linear`` (weights at a GGUF file's precision)
:mod:`.decoder_layer`        ``rms_norm``, ``add_rms_norm``, ``rotary_embedding``, ``silu_mul``
                             (the small ops between a decoder layer's linears) and
                             ``decoder_stack_`` (a model's layers over a block, one call)
:mod:`.build`                ``cpu_isa``, ``build_info``, ``has_cuda_kernels``
==========================  ==============================================================

Every public wrapper is also a name of this package (``ops.verify_chain(...)``). Each wrapper
documents shapes and semantics and registers its fake kernel right after itself; the
executable specification of the same op is the function of the same name in
:mod:`specdec_kernels.reference`. Index tensors are int32 or int64 (one dtype per call) and
live on the device of the data they index. A new op family is one more module here, listed
below.
"""

from specdec_kernels.ops.build import cpu_isa
from specdec_kernels.ops.decoder_layer import (
    add_rms_norm,
    decoder_stack_,
    rms_norm,
    rotary_embedding,
    silu_mul,
)
from specdec_kernels.ops.kv_cache import (
    compact_kv_cache_,
    compact_paged_kv_cache_,
    rollback_paged_kv_cache_,
)
from specdec_kernels.ops.linear import small_batch_linear
from specdec_kernels.ops.quantized_linear import quantized_linear
from specdec_kernels.ops.sampling import (
    deferred_errors,
    raise_deferred_errors,
    sample,
    sample_with_probs,
)
from specdec_kernels.ops.tree import build_lookahead_masks, build_tree_masks, tree_attention
from specdec_kernels.ops.verify import (
    typical_verify_chain,
    typical_verify_tree,
    verify_chain,
    verify_tree,
)
from specdec_kernels.types import CacheList, LookaheadMasks, TreeMasks, as_cache_list

__all__ = [
    "CacheList",
    "LookaheadMasks",
    "TreeMasks",
    "add_rms_norm",
    "as_cache_list",
    "build_lookahead_masks",
    "build_tree_masks",
    "compact_kv_cache_",
    "compact_paged_kv_cache_",
    "cpu_isa",
    "decoder_stack_",
    "deferred_errors",
    "quantized_linear",
    "raise_deferred_errors",
    "rms_norm",
    "rollback_paged_kv_cache_",
    "rotary_embedding",
    "sample",
    "sample_with_probs",
    "silu_mul",
    "small_batch_linear",
    "tree_attention",
    "typical_verify_chain",
    "typical_verify_tree",
    "verify_chain",
    "verify_tree",
]
