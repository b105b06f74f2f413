"""Retrieval datastores for REST-style drafting: build one from a corpus
(:func:`build_from_files`, ``specdec datastore build``), make a corpus of the target's own
answers (``specdec datastore corpus``), open and query one (:class:`Datastore`)."""

from specdec_kernels.retrieval.corpus import build_from_files, read_corpus
from specdec_kernels.retrieval.datastore import (
    Datastore,
    Lookup,
    build_datastore,
    tokenizer_fingerprint,
)

__all__ = [
    "Datastore",
    "Lookup",
    "build_datastore",
    "build_from_files",
    "read_corpus",
    "tokenizer_fingerprint",
]
