"""``make_drafter``: a drafter from its registry name (:mod:`specdec_kernels.drafters`) and
options. The drafter's class is imported here, on first use, and builds itself with
``from_options(options, context)``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from specdec_kernels import drafters as registry

__all__ = ["DrafterContext", "drafter_class", "make_drafter"]


@dataclass(frozen=True)
class DrafterContext:
    """What the caller holds besides the options, for a drafter's ``from_options``.

    A drafter is made before the target loads (so that its options and files are checked
    first); what it needs from the target it gets when bound (``Drafter.bind``).

    Attributes
    ----------
    draft_model : transformers.PreTrainedModel, optional
        The second model of a drafter whose registry entry ``needs_draft_model``.
    draft_tokenizer : optional
        Its tokenizer (checked against the target's).
    """

    draft_model: object = None
    draft_tokenizer: object = None


def drafter_class(name: str) -> type | None:
    """The class registered as ``name`` (imported now); ``None`` for plain decoding."""
    path = registry.spec(name).drafter
    if path is None:
        return None
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_drafter(name: str | None, *, draft_model=None, draft_tokenizer=None, **options):
    """A drafter from its registry name (see :data:`~specdec_kernels.drafters.DRAFTER_NAMES`).

    Parameters
    ----------
    name : str or None
        A registered name (:func:`~specdec_kernels.drafters.drafter_names`; each entry's
        ``description`` says what it drafts with), ``None``/``"none"`` for plain decoding.
        Drafters reading an asset (Medusa heads, a datastore, an EAGLE draft) take the one
        shipped for the default model unless it is given (``heads=``, ``datastore=``,
        ``eagle_draft=``); ``"multi"`` merges ``prophets=`` (by default
        :func:`~specdec_kernels.drafters.default_prophets`).
    draft_model : transformers.PreTrainedModel, optional
    draft_tokenizer : optional
    **options
        Fields of the drafter's options dataclass (its registry entry); an unknown one is a
        ``TypeError``.

    Returns
    -------
    Drafter or None
        ``None`` for plain decoding.

    Raises
    ------
    ValueError
        An unknown name, options given to plain decoding, a drafter that needs a draft model
        without one, a draft model for a drafter that drafts without one, or the drafter's own
        checks (sizes, files).
    """
    entry = registry.spec("none" if name is None else name)
    if entry.drafter is None and (options or draft_model is not None):
        raise ValueError("drafter options were given without a drafter")
    if entry.needs_draft_model and draft_model is None:
        raise ValueError(f"the {entry.name} drafter needs draft_model=...")
    if draft_model is not None and not (entry.needs_draft_model or entry.passes_draft_model):
        raise ValueError(f"draft_model was given, but the {entry.name} drafter drafts without "
                         "one: pass drafter='draft-model' to use it")
    values = entry.options(**options)
    cls = drafter_class(entry.name)
    if cls is None:
        return None
    return cls.from_options(values, DrafterContext(draft_model, draft_tokenizer))
