"""The Medusa-only cache format that earlier versions wrote (final-norm features only), still
read by ``specdec train medusa``; the data phase now writes the shared self-distillation cache
(:mod:`specdec_kernels.training.selfdistill`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["CHUNK_SUFFIX", "chunk_path", "load_cache", "load_chunk", "refuse_pickles",
           "save_chunk"]

#: Cache chunks are safetensors files (tensors plus a JSON header): loading one cannot run
#: code, unlike a pickle (``torch.save``), so a cache folder from anywhere is safe to reuse.
CHUNK_SUFFIX = ".safetensors"

#: The ``format`` field of a chunk's metadata.
CHUNK_FORMAT = "specdec_kernels.medusa.cache/1"

#: Files that an older version wrote (or anyone could plant): pickles, never loaded.
_PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".bin")

def chunk_path(folder: Path, index: int) -> Path:
    """Where chunk ``index`` of a cache stage lives."""
    return Path(folder) / f"chunk_{index:04d}{CHUNK_SUFFIX}"


def save_chunk(records: list, path: Path) -> None:
    """Write records as one Medusa-only cache chunk: per record ``prompt``, ``sampled``,
    ``text``, ``tokens`` (the pending token, then every new token) and ``features``
    ``[len(tokens), H]``, where ``features[j]`` is the final-norm hidden state whose logits gave
    ``tokens[j]``. One safetensors file: the tensors
    ``features`` ``[R, H]`` float16 and ``tokens`` ``[R]`` int64 of all records end to end,
    ``lengths`` ``[n]`` int64; the prompts, texts and sampled flags as JSON in its header.
    Written to a temporary name and renamed, so a chunk is whole or absent."""
    from safetensors.torch import save_file

    tensors = {
        "features": torch.cat([r["features"].to(torch.float16) for r in records]).contiguous(),
        "tokens": torch.tensor([t for r in records for t in r["tokens"]], dtype=torch.int64),
        "lengths": torch.tensor([len(r["tokens"]) for r in records], dtype=torch.int64),
    }
    texts = [{"prompt": r["prompt"], "sampled": bool(r["sampled"]), "text": r["text"]}
             for r in records]
    metadata = {"format": CHUNK_FORMAT, "records": json.dumps(texts)}
    tmp = Path(str(path) + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.rename(path)


def _bad_chunk(path: Path, why: str) -> ValueError:
    return ValueError(
        f"{path} is not a Medusa cache chunk of this package ({why}); delete it, or make the "
        "data again in a new folder (`specdec train medusa --data NEW_FOLDER`)"
    )


def load_chunk(path: Path) -> list:
    """The records of one chunk written by :func:`save_chunk`, each checked against the
    format (tensor names, dtypes and shapes, the JSON header).

    Raises
    ------
    ValueError
        The file is not a readable safetensors file, or its contents do not match the format.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError) as error:
        raise _bad_chunk(path, f"unreadable as safetensors: {error}") from None
    if metadata.get("format") != CHUNK_FORMAT:
        raise _bad_chunk(path, f"format {metadata.get('format')!r}, expected {CHUNK_FORMAT!r}")
    if sorted(tensors) != ["features", "lengths", "tokens"]:
        raise _bad_chunk(path, f"tensors {sorted(tensors)}, expected features, lengths, tokens")
    features, tokens, lengths = tensors["features"], tensors["tokens"], tensors["lengths"]
    rows = features.shape[0] if features.dim() == 2 else -1
    if (features.dtype != torch.float16 or rows < 0 or tokens.dtype != torch.int64
            or lengths.dtype != torch.int64 or tokens.shape != (rows,) or lengths.dim() != 1
            or bool((lengths < 1).any()) or int(lengths.sum()) != rows):
        raise _bad_chunk(
            path, f"features {features.dtype} {tuple(features.shape)}, tokens {tokens.dtype} "
            f"{tuple(tokens.shape)}, lengths {lengths.dtype} {tuple(lengths.shape)} do not fit "
            "together"
        )
    try:
        texts = json.loads(metadata.get("records", ""))
    except json.JSONDecodeError as error:
        raise _bad_chunk(path, f"its records header is not JSON: {error}") from None
    fields = {"prompt": str, "sampled": bool, "text": str}
    if (not isinstance(texts, list) or len(texts) != lengths.numel() or not all(
            isinstance(t, dict) and all(isinstance(t.get(k), kind) for k, kind in fields.items())
            for t in texts)):
        raise _bad_chunk(path, f"its header does not describe {lengths.numel()} records with "
                         f"{sorted(fields)}")
    records = []
    for text, feats, ids in zip(texts, features.split(lengths.tolist()),
                                tokens.split(lengths.tolist())):
        records.append({**text, "tokens": ids.tolist(), "features": feats})
    return records


def refuse_pickles(folder: Path) -> None:
    """Raise ``ValueError`` when ``folder`` holds pickle files (e.g. chunks an older version
    wrote with ``torch.save``): loading a pickle can run any code, so none is ever read."""
    found = sorted(p for p in Path(folder).glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if found:
        raise ValueError(
            f"{found[0]} is a pickle file (an older cache format, or planted): pickles can run "
            f"code when loaded, so this package never reads them. Move or delete the "
            f"{len(found)} pickle file(s) in {folder}; the data phase writes chunks as "
            f"*{CHUNK_SUFFIX}"
        )


def load_cache(folder: Path) -> list:
    """Every record of every chunk in ``folder`` (see :func:`save_chunk`).

    Raises
    ------
    ValueError
        The folder holds a pickle (never loaded, see :func:`refuse_pickles`) or a chunk that
        does not match the format (see :func:`load_chunk`).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    refuse_pickles(folder)
    records = []
    for path in sorted(folder.glob(f"chunk_*{CHUNK_SUFFIX}")):
        records.extend(load_chunk(path))
    return records
