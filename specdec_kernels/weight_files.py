"""Reading drafter checkpoints safely: JSON configs, safetensors files and ``torch.save``
checkpoints (read with ``weights_only=True``, so a planted pickle payload is refused, never
run). Every damaged or unexpected file is a ``ValueError`` naming it. Shared by the Medusa heads
(:mod:`specdec_kernels.medusa.heads`) and the EAGLE drafts (:mod:`specdec_kernels.eagle.model`).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch

__all__ = ["read_json", "read_safetensors", "read_torch_weights", "read_weight_folder"]


def read_json(path: Path) -> dict:
    """A JSON file's object; invalid JSON is a ``ValueError`` naming the file."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def read_safetensors(path: Path) -> dict:
    """The tensors of a safetensors file (a format that cannot run code); a damaged file is a
    ``ValueError`` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as error:
        raise ValueError(
            f"{path} is not a readable safetensors file (corrupt or truncated: {error})"
        ) from None


def read_torch_weights(path: Path) -> dict:
    """The tensors of a ``torch.save`` checkpoint, read with ``weights_only=True``: torch's
    restricted unpickler builds tensors and plain containers only, so a planted payload is
    refused, never run. A damaged or non-tensor file is a ``ValueError`` naming it."""
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        # torch's own message advises turning the restriction off: not repeated here.
        reason = re.search(r"WeightsUnpickler error:\s*(.+?)(\.\s|\n|$)", str(error), re.S)
        why = reason.group(1).strip() if reason else str(error).split(".")[0]
        raise ValueError(
            f"{path} is not a plain tensor checkpoint; it is refused, never executed "
            f"(torch.load with weights_only=True: {why})"
        ) from None
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path} does not hold a state dict of named tensors")
    return state


def read_weight_folder(folder: Path) -> dict:
    """Every tensor of a checkpoint folder in Hugging Face's layout: its ``*.safetensors``
    shards, else its ``pytorch_model*.bin`` shards.

    Raises
    ------
    FileNotFoundError
        Neither kind of file is there.
    ValueError
        A damaged or non-tensor file (named).
    """
    folder = Path(folder)
    shards = sorted(folder.glob("*.safetensors"))
    read = read_safetensors
    if not shards:
        shards, read = sorted(folder.glob("pytorch_model*.bin")), read_torch_weights
    if not shards:
        raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {folder}")
    out = {}
    for shard in shards:
        out.update(read(shard))
    return out
