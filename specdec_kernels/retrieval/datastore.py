"""A retrieval datastore of token ids (REST, He et al. 2024): built once from a corpus,
memory-mapped from disk, queried with the longest suffix of a request's context.

Layout of a datastore folder
----------------------------
``tokens.npy``
    ``[N]`` int32, every document's token ids, each followed by a separator (the value
    ``vocab_size``, which no context holds), stored **reversed**.
``sa.npy``
    ``[N]`` int32 suffix array of ``tokens.npy`` (``pydivsufsort``, integer alphabet).
``meta.json``
    Format version, the tokenizer's name, vocabulary size and vocabulary hash, sizes, and how
    the store was built.

Why reversed: a suffix of the context read backwards is a *prefix* of a suffix of the
reversed text, so the suffix-array ranges of the context's last 1, 2, 3, ... tokens are
nested; one narrowing pass finds the longest suffix that occurs (up to ``max_suffix``
tokens), each step a binary search inside the previous range. A match ending at original
position ``e`` continues with the tokens after ``e``, read forwards from the reversed array.
"""

from __future__ import annotations

import hashlib
import json
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "Datastore",
    "Lookup",
    "build_datastore",
    "check_datastore",
    "tokenizer_fingerprint",
]

FORMAT_VERSION = 1

#: The longest context suffix looked up by default (REST uses up to 16 tokens).
MAX_SUFFIX = 16


_FINGERPRINTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer) -> dict:
    """What identifies a tokenizer's ids: its name, vocabulary size and a hash of its
    vocabulary (sha256 over the sorted ``(token, id)`` pairs). Cached per tokenizer object
    (hashing a 49k-entry vocabulary takes ~60 ms, paid once rather than every run)."""
    try:
        cached = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and cached["vocab_size"] == len(tokenizer):
        return dict(cached)
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()
    out = {
        "tokenizer": Path(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__).name,
        "vocab_size": len(tokenizer),
        "vocab_hash": digest,
    }
    try:
        _FINGERPRINTS[tokenizer] = dict(out)
    except TypeError:
        pass
    return out


def _suffix_array(tokens: np.ndarray) -> np.ndarray:
    """``[N]`` int32 suffix array of an int32 array (pydivsufsort; numpy if absent)."""
    try:
        from pydivsufsort import divsufsort
    except ImportError:  # pragma: no cover - the package depends on pydivsufsort
        return _numpy_suffix_array(tokens)
    return np.asarray(divsufsort(np.ascontiguousarray(tokens, dtype=np.int32)), dtype=np.int32)


def _numpy_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Prefix doubling with numpy (O(N log^2 N)): the fallback without pydivsufsort."""
    n = len(tokens)
    rank = tokens.astype(np.int64)
    sa = np.arange(n)
    k = 1
    while True:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:] if k < n else second[:0]
        sa = np.lexsort((second, rank))
        keys = np.stack([rank[sa], second[sa]], 1)
        new = np.concatenate([[0], np.cumsum(np.any(keys[1:] != keys[:-1], 1))])
        rank = np.empty(n, dtype=np.int64)
        rank[sa] = new
        if new[-1] == n - 1 or k >= n:
            return sa.astype(np.int32)
        k *= 2


def build_datastore(
    documents,
    out,
    *,
    fingerprint: dict,
    info: dict | None = None,
) -> dict:
    """Write a datastore of token-id documents to the folder ``out``.

    Parameters
    ----------
    documents : iterable of sequence of int
        Each document's token ids (empty ones are skipped).
    out : str or Path
        The folder (created; existing files are replaced).
    fingerprint : dict
        The tokenizer's :func:`tokenizer_fingerprint` (at least ``vocab_size``): lookups
        refuse another tokenizer.
    info : dict, optional
        Anything else worth recording (the command, the corpus files).

    Returns
    -------
    dict
        The metadata written to ``meta.json``.

    Raises
    ------
    ValueError
        ``documents`` holds no token at all, or ids outside ``[0, vocab_size)``.
    """
    vocab = int(fingerprint["vocab_size"])
    start = time.perf_counter()
    parts, count = [], 0
    for doc in documents:
        ids = np.asarray(list(doc), dtype=np.int64)
        if ids.size == 0:
            continue
        if ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(
                f"documents: document {count} has token ids outside [0, {vocab}) "
                "(another tokenizer?)"
            )
        parts.append(np.append(ids, vocab))  # the separator ends every document
        count += 1
    if not parts:
        raise ValueError("documents: the corpus is empty (no document has any token)")
    forward = np.concatenate(parts).astype(np.int32)
    reversed_tokens = np.ascontiguousarray(forward[::-1])
    sa = _suffix_array(reversed_tokens)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "tokens.npy", reversed_tokens)
    np.save(out / "sa.npy", sa)
    meta = {
        "format": FORMAT_VERSION,
        **fingerprint,
        "separator": vocab,
        "num_tokens": int(forward.size - count),
        "num_documents": count,
        "build_seconds": round(time.perf_counter() - start, 3),
        "suffix_array": "pydivsufsort" if _has_pydivsufsort() else "numpy",
        **(info or {}),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _has_pydivsufsort() -> bool:
    try:
        import pydivsufsort  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def _read_meta(path: Path) -> dict:
    """``meta.json`` with the fields a lookup needs, checked."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"datastore: {path} is not valid JSON ({error})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"datastore: {path} must hold a JSON object")
    for key in ("separator", "vocab_size"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"datastore: {path} needs a positive integer {key!r}, got {value!r}")
    if meta["separator"] != meta["vocab_size"]:
        raise ValueError(
            f"datastore: {path}: separator {meta['separator']} must be the vocabulary size "
            f"{meta['vocab_size']} (an id no context holds)"
        )
    return meta


def _load_array(path: Path) -> np.ndarray:
    """A 1-D integer ``.npy`` file, memory-mapped (``allow_pickle`` stays off: an object
    array, which would need a pickle, is refused)."""
    if not path.is_file():
        raise FileNotFoundError(f"datastore: {path} is missing")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:  # a pickled object array, a bad header, a short file
        raise ValueError(f"datastore: {path} is not a plain .npy array ({error})") from None
    if array.dtype.kind not in "iu" or array.ndim != 1:
        raise ValueError(
            f"datastore: {path} must be a 1-D integer array (`specdec datastore build` writes "
            f"int32), got {array.dtype} with shape {array.shape}"
        )
    return array


#: Adjacent suffix pairs of ``sa`` compared on each load, and tokens compared per pair.
SA_SAMPLE_PAIRS, SA_SAMPLE_DEPTH = 256, 64


def check_datastore(tokens: np.ndarray, sa: np.ndarray, separator: int, where="") -> None:
    """Check that ``tokens`` and ``sa`` form a datastore (see the module notes).

    What is checked, and what it guarantees:

    - ``tokens`` holds ids in ``[0, separator]`` and starts with the separator (the reversed
      stream ends every document with one): no lookup returns an id outside the vocabulary;
    - ``sa`` has ``tokens``' length, every entry in ``[0, N)``, and the sum of ``0 .. N-1``:
      every lookup reads inside the arrays (no ``IndexError`` mid-decode, whatever the files
      hold); a permutation always passes, and a swapped, truncated or foreign array fails
      (a non-permutation passes only if its errors cancel exactly in the sum);
    - :data:`SA_SAMPLE_PAIRS` adjacent pairs ``sa[i], sa[i + 1]`` at evenly spread ``i`` are
      in suffix order (on their first :data:`SA_SAMPLE_DEPTH` tokens): a shuffled or
      unsorted array fails unless nearly all of it is sorted.

    A store that passes yet is not exactly a suffix array can only give worse drafts
    (verification keeps the output the target's), never an error or a wrong token. The cost
    is one pass over both arrays (memory-mapped) plus the sample.

    Raises
    ------
    ValueError
        Naming ``where`` and the first check that failed.
    """
    n = len(tokens)
    prefix = f"datastore: {where}: " if where else "datastore: "
    if n == 0:
        raise ValueError(prefix + "tokens.npy is empty")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high > separator or int(tokens[0]) != separator:
        raise ValueError(
            prefix + f"tokens.npy holds values in [{low}, {high}] starting with "
            f"{int(tokens[0])}; a datastore's are token ids in [0, {separator}] starting with "
            f"the separator {separator} (are tokens.npy and sa.npy swapped?)"
        )
    if len(sa) != n:
        raise ValueError(prefix + f"sa.npy has {len(sa)} entries, tokens.npy {n}")
    low, high = int(sa.min()), int(sa.max())
    total = int(sa.sum(dtype=np.int64))
    if low != 0 or high != n - 1 or total != n * (n - 1) // 2:
        raise ValueError(
            prefix + f"sa.npy is not a permutation of 0..{n - 1} (values in [{low}, {high}], "
            f"sum {total}, expected {n * (n - 1) // 2}); rebuild it with `specdec datastore "
            "build`"
        )
    for i in np.unique(np.linspace(0, n - 2, num=min(SA_SAMPLE_PAIRS, n - 1)).astype(np.int64)):
        a, b = int(sa[i]), int(sa[i + 1])
        left = np.asarray(tokens[a : a + SA_SAMPLE_DEPTH], dtype=np.int64)
        right = np.asarray(tokens[b : b + SA_SAMPLE_DEPTH], dtype=np.int64)
        common = min(len(left), len(right))
        differ = np.flatnonzero(left[:common] != right[:common])
        if differ.size:
            ordered = left[differ[0]] < right[differ[0]]
        else:  # equal on the compared tokens: only the shorter suffix may come first
            ordered = common == SA_SAMPLE_DEPTH or len(left) < len(right)
        if not ordered:
            raise ValueError(
                prefix + f"sa.npy is not the suffix array of tokens.npy (suffixes {a} and {b} "
                f"at ranks {i} and {i + 1} are out of order); rebuild it with `specdec "
                "datastore build`"
            )


@dataclass
class Lookup:
    """What one query found.

    Attributes
    ----------
    suffix_length : int
        Length of the longest context suffix that occurs in the store (0: none does).
    matches : int
        Its occurrences (each with at least one continuation token or not).
    continuations : list of tuple of int
        The continuations read (up to ``depth`` tokens each, cut at a document's end), from
        at most ``max_matches`` occurrences spread evenly over all of them.
    """

    suffix_length: int
    matches: int
    continuations: list


class Datastore:
    """A datastore folder opened memory-mapped (see the module notes).

    Parameters
    ----------
    path : str or Path
        The folder written by :func:`build_datastore` (``specdec datastore build``).
    """

    def __init__(self, path):
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"no datastore at {path} (meta.json missing)")
        self.path = path
        self.meta = _read_meta(path / "meta.json")
        if self.meta.get("format") != FORMAT_VERSION:
            raise ValueError(
                f"datastore: {path} has format {self.meta.get('format')}, this package reads "
                f"{FORMAT_VERSION}; rebuild it with `specdec datastore build`"
            )
        self.tokens = _load_array(path / "tokens.npy")
        self.sa = _load_array(path / "sa.npy")
        self.separator = int(self.meta["separator"])
        self.size = len(self.tokens)
        check_datastore(self.tokens, self.sa, self.separator, path)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def check_tokenizer(self, tokenizer=None, vocab_size: int | None = None) -> None:
        """Raise ``ValueError`` unless the store was built with this tokenizer (its vocabulary
        hash), or, without a tokenizer, for ids that fit ``vocab_size``."""
        if tokenizer is not None:
            mine = tokenizer_fingerprint(tokenizer)
            if mine["vocab_hash"] != self.meta.get("vocab_hash"):
                raise ValueError(
                    f"datastore: {self.path} was built for tokenizer "
                    f"{self.meta.get('tokenizer')!r} ({self.meta.get('vocab_size')} tokens), "
                    f"not this target's {mine['tokenizer']!r} ({mine['vocab_size']} tokens); "
                    "build one with the target's tokenizer (`specdec datastore build --model`)"
                )
        elif vocab_size is not None and self.vocab_size > vocab_size:
            raise ValueError(
                f"datastore: {self.path} holds ids up to {self.vocab_size - 1}, the target's "
                f"vocabulary has {vocab_size}; it was built for another tokenizer"
            )

    # ------------------------------------------------------------------ queries

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple:
        """The sub-range of ``sa[lo:hi]`` (all sharing their first ``depth`` tokens) whose
        next token is ``token``."""
        tokens, sa, size = self.tokens, self.sa, self.size

        def at(i):
            j = int(sa[i]) + depth
            return int(tokens[j]) if j < size else -1

        if hi - lo <= 64:  # small ranges: one vectorised gather
            idx = np.asarray(sa[lo:hi], dtype=np.int64) + depth
            col = np.where(idx < size, tokens[np.minimum(idx, size - 1)], -1)
            left = lo + int(np.searchsorted(col, token, "left"))
            right = lo + int(np.searchsorted(col, token, "right"))
            return left, right
        a, b = lo, hi
        while a < b:  # first index whose token >= token
            m = (a + b) // 2
            if at(m) < token:
                a = m + 1
            else:
                b = m
        left, b = a, hi
        while a < b:  # first index whose token > token
            m = (a + b) // 2
            if at(m) <= token:
                a = m + 1
            else:
                b = m
        return left, a

    def longest_suffix(self, context, max_suffix: int = MAX_SUFFIX) -> tuple:
        """The longest suffix of ``context`` (at most ``max_suffix`` tokens) found in the
        store, as ``(length, lo, hi)``: its occurrences are ``sa[lo:hi]``."""
        lo, hi, length = 0, self.size, 0
        for depth in range(min(max_suffix, len(context))):
            a, b = self._narrow(lo, hi, depth, int(context[-1 - depth]))
            if a >= b:
                break
            lo, hi, length = a, b, depth + 1
        return length, lo, hi

    def lookup(
        self,
        context,
        depth: int,
        *,
        max_suffix: int = MAX_SUFFIX,
        min_suffix: int = 1,
        max_matches: int = 64,
    ) -> Lookup:
        """Continuations of the longest suffix of ``context`` found in the store.

        Parameters
        ----------
        context : sequence of int
            The request's tokens so far (prompt and output).
        depth : int
            Longest continuation read.
        max_suffix, min_suffix : int
            Suffix lengths tried (longest first); nothing is returned below ``min_suffix``.
        max_matches : int
            Occurrences read at most, evenly spread over all of them.

        Returns
        -------
        Lookup
        """
        if max_suffix < 1 or min_suffix < 1 or max_matches < 1:
            raise ValueError(
                f"max_suffix, min_suffix and max_matches must be >= 1, got "
                f"{max_suffix}, {min_suffix}, {max_matches}"
            )
        length, lo, hi = self.longest_suffix(context, max_suffix)
        if length < min_suffix or depth <= 0:
            return Lookup(length, hi - lo if length else 0, [])
        count = hi - lo
        picks = np.linspace(lo, hi - 1, num=min(count, max_matches)).round().astype(np.int64)
        found = []
        for i in np.unique(picks):
            # Reversed position p..p+length-1 is the suffix; the original continuation runs
            # backwards from p - 1.
            p = int(self.sa[i])
            start = max(p - depth, 0)
            seq = np.asarray(self.tokens[start:p])[::-1]
            cut = np.flatnonzero(seq == self.separator)
            if cut.size:
                seq = seq[: cut[0]]
            if seq.size:
                found.append(tuple(int(t) for t in seq))
        return Lookup(length, count, found)

    def describe(self) -> dict:
        return {
            "path": str(self.path),
            "tokens": self.meta.get("num_tokens"),
            "documents": self.meta.get("num_documents"),
            "tokenizer": self.meta.get("tokenizer"),
        }
