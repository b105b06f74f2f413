"""Medusa heads (Cai et al. 2024): ``N`` heads on the target's final-norm hidden state, head
``k`` guessing the token ``k + 2`` positions ahead (the target's own LM head guesses the next
one). Each head is ``L`` residual blocks ``x + SiLU(W x + b)``, zero-initialised so that an
untrained head starts as the base model's own next-token guess, then a projection:

- shared: the target's LM head (frozen, never stored with the heads), over the whole
  vocabulary or only its rows of a *draft vocabulary* (``draft_ids``: the ``Vd`` most
  frequent tokens of the training data, mapped back to full ids); or
- own: each head's own ``[Vd, H]`` projection over the draft vocabulary (or ``[V, H]``, the
  FasterDecoding layout), initialised from the LM head's rows and trained.

On this CPU one full-vocabulary projection of SmolLM2 (49152 x 576) costs a large share of a
target forward (``bench/medusa_cost.py`` measures it), so heads over a few thousand tokens
cost a small fraction of what full-vocabulary heads would.

Files: ``medusa_heads.safetensors`` + ``medusa_config.json`` (this package's format, which
also records training accuracies), or the FasterDecoding/Medusa format
(``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` beside a ``config.json`` with
``medusa_num_heads`` / ``medusa_num_layers``), see :func:`load_heads`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec_kernels.models.quantized_weight import QuantizedWeight, weight_rows
from specdec_kernels.weight_files import read_json, read_safetensors, read_torch_weights

__all__ = [
    "CONFIG_NAME",
    "FASTERDECODING_NAMES",
    "MedusaHeads",
    "WEIGHTS_NAME",
    "load_heads",
]

CONFIG_NAME = "medusa_config.json"
WEIGHTS_NAME = "medusa_heads.safetensors"
FASTERDECODING_NAMES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
FORMAT_VERSION = 1


class MedusaHeads(nn.Module):
    """``N`` Medusa heads over a target's final-norm hidden states.

    Parameters
    ----------
    hidden_size : int
        ``H`` of the target.
    vocab_size : int
        ``V``, the target's vocabulary (ids the heads emit).
    num_heads : int
        ``N`` (head ``k`` guesses the token ``k + 2`` ahead of the hidden state's position).
    num_layers : int
        ``L`` residual blocks per head.
    draft_ids : Tensor, optional
        ``[Vd]`` int64 distinct full-vocabulary ids the heads may guess (the draft
        vocabulary); ``None``: the whole vocabulary.
    own_projection : bool
        Each head has its own trainable projection (``[Vd, H]``, or ``[V, H]`` without
        ``draft_ids``); otherwise the heads share the target's frozen LM head (or its
        draft-vocabulary rows), passed to :meth:`forward`.
    info : dict, optional
        Free-form metadata saved with the heads (training data, accuracies).
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int,
        num_layers: int = 1,
        *,
        draft_ids: Tensor | None = None,
        own_projection: bool = False,
        info: dict | None = None,
    ):
        super().__init__()
        if min(hidden_size, vocab_size, num_heads) < 1 or num_layers < 0:
            raise ValueError(
                f"need hidden_size, vocab_size, num_heads >= 1 and num_layers >= 0, got "
                f"{hidden_size}, {vocab_size}, {num_heads}, {num_layers}"
            )
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.info = dict(info or {})
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
            for _ in range(num_heads)
        )
        for head in self.blocks:
            for linear in head:
                nn.init.zeros_(linear.weight)
                nn.init.zeros_(linear.bias)
        self.projections = None
        if draft_ids is not None:
            draft_ids = torch.as_tensor(draft_ids, dtype=torch.int64).flatten()
            if draft_ids.numel() == 0 or int(draft_ids.min()) < 0 or int(
                draft_ids.max()
            ) >= vocab_size:
                raise ValueError(f"draft_ids must be non-empty ids in [0, {vocab_size})")
            if draft_ids.unique().numel() != draft_ids.numel():
                raise ValueError("draft_ids must be distinct")
            self.register_buffer("draft_ids", draft_ids.clone())
        else:
            self.draft_ids = None
        if own_projection:
            self.projections = nn.ModuleList(
                nn.Linear(hidden_size, self.output_size, bias=False) for _ in range(num_heads)
            )
        self._rows_cache: tuple | None = None

    @property
    def projection(self) -> str:
        """``"shared"`` (the target's LM head) or ``"own"``."""
        return "shared" if self.projections is None else "own"

    @property
    def output_size(self) -> int:
        """Columns of :meth:`forward`'s logits: ``Vd`` with a draft vocabulary, else ``V``."""
        return self.draft_ids.numel() if self.draft_ids is not None else self.vocab_size

    def init_projections_from(self, lm_head_weight: Tensor) -> None:
        """Start every own projection as the target's LM head (its draft-vocabulary rows)."""
        if self.projections is None:
            return
        rows = lm_head_weight if self.draft_ids is None else lm_head_weight[self.draft_ids]
        with torch.no_grad():
            for proj in self.projections:
                proj.weight.copy_(rows)

    def hidden(self, features: Tensor) -> Tensor:
        """``[..., N, H]`` each head's residual-block output for ``[..., H]`` features."""
        if features.shape[-1] != self.hidden_size:
            raise ValueError(
                f"features have hidden size {features.shape[-1]}, the heads expect "
                f"{self.hidden_size}"
            )
        outs = []
        for head in self.blocks:
            x = features
            for linear in head:
                x = x + nn.functional.silu(linear(x))
            outs.append(x)
        return torch.stack(outs, -2)

    def forward(self, features: Tensor, lm_head: nn.Module | None = None,
                linear=nn.functional.linear) -> Tensor:
        """Logits of every head.

        Parameters
        ----------
        features : Tensor
            ``[..., H]`` final-norm hidden states of the target.
        lm_head : nn.Module, optional
            The target's LM head, for shared projections.
        linear : callable, optional
            ``linear(x, weight)`` for the shared projection (a drafter passes its runner's
            kernels: :func:`~specdec_kernels.decoding.cpu_matmul.kernel_linear` on CPU).

        Returns
        -------
        Tensor
            ``[..., N, V]`` (shared or full projections) or ``[..., N, Vd]`` logits (draft
            vocabulary: column ``j`` is token ``draft_ids[j]``).
        """
        x = self.hidden(features.to(self._dtype()))
        if self.projections is None:
            if lm_head is None:
                raise ValueError("heads that share the LM head need lm_head=...")
            return linear(x.to(lm_head.weight.dtype), self._shared_rows(lm_head))
        return torch.stack([p(x[..., k, :]) for k, p in enumerate(self.projections)], -2)

    def _shared_rows(self, lm_head: nn.Module) -> Tensor:
        """The LM head's weight, or its draft-vocabulary rows (gathered once per weight)."""
        weight = lm_head.weight
        if self.draft_ids is None:
            return weight
        # Keyed by the weight itself and, for a dense one, its data (``module.to`` swaps
        # ``.data`` in place); a file-precision weight has no data of its own to point at.
        pointer = None if isinstance(weight, QuantizedWeight) else weight.data_ptr()
        key = (pointer, weight.device, weight.dtype, self.draft_ids.device)
        cached = self._rows_cache
        if cached is None or cached[0] is not weight or cached[1] != key:
            self._rows_cache = (weight, key, weight_rows(weight, self.draft_ids))
        return self._rows_cache[2]

    def _dtype(self) -> torch.dtype:
        for p in self.parameters():
            return p.dtype
        return torch.float32

    def check_target(self, hidden_size: int, vocab_size: int) -> None:
        """Raise ``ValueError`` unless the heads fit a target of these sizes."""
        if hidden_size != self.hidden_size or vocab_size != self.vocab_size:
            raise ValueError(
                f"Medusa heads made for hidden size {self.hidden_size} and vocabulary "
                f"{self.vocab_size}; the target has hidden size {hidden_size} and vocabulary "
                f"{vocab_size}"
            )

    # ------------------------------------------------------------------ files

    def config(self) -> dict:
        return {
            "format": "specdec_kernels.medusa",
            "version": FORMAT_VERSION,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "projection": self.projection,
            "draft_vocab_size": None if self.draft_ids is None else int(self.draft_ids.numel()),
            "info": self.info,
        }

    def save(self, folder: str | Path) -> Path:
        """Write ``medusa_heads.safetensors`` and ``medusa_config.json`` into ``folder``."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / WEIGHTS_NAME))
        (folder / CONFIG_NAME).write_text(json.dumps(self.config(), indent=1) + "\n")
        return folder


def _load_ours(folder: Path) -> MedusaHeads:
    config = read_json(folder / CONFIG_NAME)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has {CONFIG_NAME} but no {WEIGHTS_NAME}")
    missing = [k for k in ("hidden_size", "vocab_size", "num_heads", "num_layers", "projection")
               if k not in config]
    if missing:
        raise ValueError(f"{folder / CONFIG_NAME} lacks {missing}")
    state = read_safetensors(weights)
    if config["projection"] not in ("shared", "own"):
        raise ValueError(f"{folder / CONFIG_NAME}: unknown projection {config['projection']!r}")
    draft_ids = state.get("draft_ids")
    if config.get("draft_vocab_size") and draft_ids is None:
        raise ValueError(f"{weights} lacks draft_ids for a draft vocabulary")
    heads = MedusaHeads(
        config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_layers"],
        draft_ids=draft_ids, own_projection=config["projection"] == "own",
        info=config.get("info"),
    )
    _load_state(heads, state, weights)
    return heads


def _load_state(heads: MedusaHeads, state: dict, source) -> None:
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{source}: tensors do not match {heads.num_heads} heads of {heads.num_layers} "
            f"layers (missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{source}: {name} has shape {tuple(tensor.shape)}, expected "
                f"{tuple(expected[name].shape)} (hidden size {heads.hidden_size}, vocabulary "
                f"{heads.output_size})"
            )
    heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def _load_fasterdecoding(folder: Path, weights: Path) -> MedusaHeads:
    """Heads in FasterDecoding/Medusa's layout: ``medusa_head`` is a list of
    ``Sequential(ResBlock x L, Linear(H, V, bias=False))``, saved as its state dict with keys
    ``{k}.{j}.linear.weight`` / ``.bias`` (blocks) and ``{k}.{L}.weight`` (projection)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{folder} has {weights.name} but no config.json (with medusa_num_heads, "
            "medusa_num_layers)"
        )
    config = read_json(config_path)
    if "medusa_num_heads" not in config or "medusa_num_layers" not in config:
        raise ValueError(f"{config_path} lacks medusa_num_heads / medusa_num_layers")
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config["medusa_num_layers"])
    if weights.suffix == ".safetensors":
        state = read_safetensors(weights)
    else:
        state = read_torch_weights(weights)
    state = {k.removeprefix("medusa_head."): v for k, v in state.items()}
    proj = state.get(f"0.{num_layers}.weight")
    if proj is None:
        raise ValueError(
            f"{weights}: no projection 0.{num_layers}.weight for {num_heads} heads of "
            f"{num_layers} layers"
        )
    vocab, hidden = proj.shape
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers, own_projection=True,
                        info={"source": "FasterDecoding/Medusa",
                              "base_model": config.get("base_model_name_or_path")})
    mapped = {}
    for key, tensor in state.items():
        parts = key.split(".")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
            raise ValueError(f"{weights}: unexpected tensor {key!r}")
        k, j = int(parts[0]), int(parts[1])
        if j == num_layers and parts[2:] == ["weight"]:
            mapped[f"projections.{k}.weight"] = tensor
        elif j < num_layers and parts[2] == "linear" and len(parts) == 4:
            mapped[f"blocks.{k}.{j}.{parts[3]}"] = tensor
        else:
            raise ValueError(f"{weights}: unexpected tensor {key!r}")
    _load_state(heads, mapped, weights)
    return heads


def load_heads(path: str | Path) -> MedusaHeads:
    """Load Medusa heads from a folder (this package's format or FasterDecoding's).

    Parameters
    ----------
    path : str or Path
        A folder with ``medusa_config.json`` + ``medusa_heads.safetensors``, or with
        ``config.json`` + ``medusa_lm_head.safetensors`` / ``medusa_lm_head.pt``.

    Raises
    ------
    FileNotFoundError
        The folder or its files are missing.
    ValueError
        Malformed configs or tensors that do not match the configuration.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no Medusa heads folder at {folder}")
    if (folder / CONFIG_NAME).is_file():
        return _load_ours(folder)
    for name in FASTERDECODING_NAMES:
        if (folder / name).is_file():
            return _load_fasterdecoding(folder, folder / name)
    raise FileNotFoundError(
        f"{folder} holds no Medusa heads: expected {CONFIG_NAME} + {WEIGHTS_NAME}, or "
        f"config.json + one of {FASTERDECODING_NAMES}"
    )
