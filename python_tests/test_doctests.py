"""The ``Examples`` of the public ops' docstrings run as written and print what they show."""

import doctest
import inspect
import importlib

import pytest

MODULES = [
    "specdec_kernels.types",
    "specdec_kernels.ops.build",
    "specdec_kernels.ops.kv_cache",
    "specdec_kernels.ops.linear",
    "specdec_kernels.ops.quantized_linear",
    "specdec_kernels.ops.decoder_layer",
    "specdec_kernels.ops.sampling",
    "specdec_kernels.ops.tree",
    "specdec_kernels.ops.verify",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name} shows no examples"
    assert result.failed == 0, f"{result.failed} of {name}'s examples failed (printed above)"


def test_every_public_op_shows_an_example():
    from specdec_kernels import ops

    functions = [n for n in ops.__all__ if inspect.isfunction(getattr(ops, n))]
    assert "verify_tree" in functions
    missing = [n for n in functions if ">>>" not in (getattr(ops, n).__doc__ or "")]
    assert not missing, f"public ops without an Examples section: {missing}"
