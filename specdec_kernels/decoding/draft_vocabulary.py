"""A draft model's LM head over the tokens that matter: its rows for the ``N`` most frequent
tokens only (frequency-ranked drafting, FR-Spec: Zhao et al., 2025).

A draft forward at batch 1 streams the draft's weights, and the LM head is a large part of
them: the default model's tied 49152 x 576 head is a fifth of its parameters (in the int4
quantized-self copy, whose head is int8, about a third of the bytes), a 0.5B Qwen's 151936 x
896 head 28%. Nearly every token an assistant writes is among a few thousand; the draft scores
only those, and its logits are widened back to the target's vocabulary with the others at
``-1e30`` (never drafted, probability zero: drafts sampled from that ``q`` keep the tree rule
lossless, and greedy output is the target's either way). A token outside the set costs a
rejected draft, never correctness.

The ranking
-----------
Which tokens: a ranking file made by ``specdec draft-vocab`` (token counts of a corpus, e.g. the
target's own answers from ``specdec datastore corpus``, or text of the user's own workload),
tied to the tokenizer it counted with; the package ships one for the default model. Without a
ranking for the tokenizer, token ids in order: byte-pair vocabularies number their merges in
the order they were learned, most frequent first, a weaker but free ranking (coverage figures in
bench/RESULTS.md). Tokens a ranking never saw follow in id order.
"""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec_kernels.models.quantized_weight import set_weight, weight_rows

__all__ = [
    "DEFAULT_RANKING",
    "RANKING_FORMAT",
    "count_ranking",
    "default_ranking_path",
    "draft_vocabulary",
    "restricted_head_copy",
    "shared_copy",
    "token_ranking",
    "vocabulary_fingerprint",
]

#: Package file of the ranking made for the default model's tokenizer (``specdec draft-vocab``).
DEFAULT_RANKING = "draft_vocab/smollm2-135m-instruct.json"

RANKING_FORMAT = "specdec-token-ranking/1"


def default_ranking_path() -> Path:
    return Path(str(resources.files("specdec_kernels.data").joinpath(DEFAULT_RANKING)))


def vocabulary_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's ``{string: id}`` vocabulary: a ranking counted with one
    tokenizer means nothing to another."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]


def count_ranking(token_lists, tokenizer, vocab_size: int, info: dict | None = None) -> dict:
    """A ranking (the file's content) from tokenized text: every token seen, most frequent
    first (ties: lower id first).

    Parameters
    ----------
    token_lists : iterable of list of int
    tokenizer
        The tokenizer that made them (its fingerprint is kept).
    vocab_size : int
        The model's vocabulary (ids at or above it are an error).
    info : dict, optional
        Kept in the file (the command that made it, the corpus).
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    total = 0
    for tokens in token_lists:
        ids = torch.as_tensor(tokens, dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"token ids must be in [0, {vocab_size}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        counts += torch.bincount(ids, minlength=vocab_size)
        total += ids.numel()
    if total == 0:
        raise ValueError("the corpus holds no tokens")
    seen = torch.nonzero(counts).flatten()
    order = sorted(seen.tolist(), key=lambda t: (-int(counts[t]), t))
    return {"format": RANKING_FORMAT, "vocabulary": vocabulary_fingerprint(tokenizer),
            "vocab_size": vocab_size, "tokens_counted": total, **(info or {}),
            "ranked": order}


def token_ranking(tokenizer, vocab_size: int, source=None) -> tuple:
    """Every token id of the vocabulary, most frequent first.

    Parameters
    ----------
    tokenizer : optional
        The target's tokenizer (``None``: only id order, or a ranking given by path, can be
        used).
    vocab_size : int
    source : str or Path, optional
        A ranking file (``specdec draft-vocab``). Default: the package's ranking when it was
        counted with this tokenizer, else id order.

    Returns
    -------
    (list of int, str)
        The ``vocab_size`` ids, and where the order came from.

    Raises
    ------
    ValueError
        A ranking file of another format, vocabulary size or tokenizer.
    FileNotFoundError
        ``source`` does not exist.
    """
    in_order = list(range(vocab_size)), "token ids in order"
    path = Path(source) if source is not None else default_ranking_path()
    if source is None and (tokenizer is None or not path.is_file()):
        return in_order
    ranking = json.loads(path.read_text())
    if ranking.get("format") != RANKING_FORMAT:
        raise ValueError(f"token_ranking: {path} is not a {RANKING_FORMAT} file")
    mine = tokenizer is None or ranking["vocabulary"] == vocabulary_fingerprint(tokenizer)
    if source is None and not (mine and ranking["vocab_size"] == vocab_size):
        return in_order  # the package's ranking is another tokenizer's
    if ranking["vocab_size"] != vocab_size:
        raise ValueError(f"token_ranking: {path} ranks a vocabulary of {ranking['vocab_size']} "
                         f"tokens, the model has {vocab_size}")
    if not mine:
        raise ValueError(f"token_ranking: {path} was counted with another tokenizer")
    ranked = [int(t) for t in ranking["ranked"]]
    if len(set(ranked)) != len(ranked) or any(not 0 <= t < vocab_size for t in ranked):
        raise ValueError(f"token_ranking: {path} holds repeated or out-of-range ids")
    seen = set(ranked)
    order = ranked + [t for t in range(vocab_size) if t not in seen]
    return order, f"{path.name} ({ranking['tokens_counted']} tokens counted)"


def draft_vocabulary(order: list, size: int) -> Tensor:
    """``[size]`` int64: the first ``size`` ids of ``order``, ascending."""
    if not 1 <= size <= len(order):
        raise ValueError(f"draft_vocab must be in [1, {len(order)}] (the vocabulary), got {size}")
    return torch.tensor(sorted(order[:size]), dtype=torch.int64)


def shared_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s modules that shares every parameter and buffer with it (to swap
    some of the copy's weights and leave ``model`` untouched)."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def restricted_head_copy(model: nn.Module, ids: Tensor) -> nn.Module:
    """A copy of ``model`` (everything shared but the head) whose LM head holds only the rows
    ``ids``: its logits are the model's at those ids, in that order. A quantized head keeps
    those rows' values, scales and mins as they are.

    Raises
    ------
    ValueError
        A model without an ``nn.Linear``-like LM head, or ids out of its range.
    """
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    restrictable = isinstance(weight, Tensor) and weight.dim() == 2
    if not restrictable or not hasattr(model, "set_output_embeddings"):
        raise ValueError(f"draft_vocab: {type(model).__name__} has no LM head weight to restrict "
                         f"(its output embedding is {type(head).__name__})")
    rows = weight.shape[0]
    if ids.numel() < 1 or int(ids.min()) < 0 or int(ids.max()) >= rows:
        raise ValueError(f"draft_vocab: ids must lie in [0, {rows}), the head's rows")
    ids = ids.to(weight.device)
    bias = getattr(head, "bias", None)
    new = nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None,
                    device="meta")
    set_weight(new, weight_rows(weight, ids))
    if bias is not None:
        new.bias = nn.Parameter(bias.detach()[ids].clone(), requires_grad=False)
    clone = shared_copy(model)
    clone.set_output_embeddings(new)
    return clone.eval()
