"""Retrieval datastores for REST-style drafting: open and query one (:class:`Datastore`),
build one from token sequences (:func:`build_datastore`). Building from a corpus of files or of
the target's own answers (``specdec datastore build`` / ``corpus``) is an asset builder:
:mod:`specdec_kernels.training.retrieval_corpus`."""

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
    "tokenizer_fingerprint",
]
