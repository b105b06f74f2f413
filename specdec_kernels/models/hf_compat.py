"""Names that differ between the transformers releases the package supports.

transformers 5.24 renamed the cache argument of every model's ``forward`` (and the output
field) from ``past_key_values`` to ``cache``; the old name still works there with a
deprecation warning and goes in 5.40. The package asks each model which name its ``forward``
takes, so one code path serves both sides of the rename (and remote-code models that keep the
old name).
"""

from __future__ import annotations

import functools
import inspect

__all__ = ["CACHE_INPUT_NAMES", "cache_kwargs", "cache_of", "output_cache"]

#: Every name a cache argument has had, newest first.
CACHE_INPUT_NAMES = ("cache", "past_key_values")


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for ``model(**...)``, under the name its ``forward`` takes:
    ``"cache"`` (transformers >= 5.24) or ``"past_key_values"``."""
    return {_cache_kwarg_of(type(model).forward): cache}


def cache_of(model_kwargs: dict):
    """The cache passed in ``model_kwargs`` under either name (``None`` if absent)."""
    for name in CACHE_INPUT_NAMES:
        if model_kwargs.get(name) is not None:
            return model_kwargs[name]
    return None


def output_cache(output):
    """The cache a forward returned, under either field name."""
    fields = getattr(output, "__dataclass_fields__", {})
    name = "cache" if "cache" in fields else "past_key_values"
    return getattr(output, name, None)
