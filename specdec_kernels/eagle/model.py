"""The EAGLE-3 draft network and its files: what
:class:`~specdec_kernels.decoding.eagle.EagleDrafter` runs and what ``specdec train eagle``
writes (no training code here).

The network (Li et al., EAGLE-3): the target's hidden states at three capture points (low,
middle, high decoder layers) are fused by ``fc`` into one hidden vector; one decoder layer of
the target's own architecture (Llama: RMSNorm, GQA attention with RoPE, SwiGLU MLP) takes that
vector together with the embedding of the next token (each normed, concatenated: the
attention's projections read ``2 H``); its output, through the final ``norm`` and a head over a
*draft vocabulary* (the data's most frequent tokens), gives the next draft token. The layer's
pre-norm output is also the hidden vector of the next draft step (the draft feeds on its own
features past the first step).

Files are the published EAGLE-3 layout that the EAGLE repository, SpecForge, vLLM and SGLang
use: a ``config.json`` (a Llama config with ``draft_vocab_size``, ``target_hidden_size`` and
``eagle_config.eagle_aux_hidden_state_layer_ids``) and ``model.safetensors`` (or
``pytorch_model.bin``, read with ``weights_only``) holding ``fc.weight``, ``midlayer.*`` (or
``layers.0.*``), ``norm.weight``, ``lm_head.weight``, ``d2t`` (draft id -> target id offset:
``target = draft + d2t[draft]``), ``t2d`` (``[V]`` bool, which target ids are in the draft
vocabulary) and optionally ``embed_tokens.weight`` (else the target's embedding is used).
Published layer ids name the hidden state *entering* decoder layer ``i`` (the output of layer
``i - 1``); this package's capture points name layer outputs, so point = id - 1. Files written
here add a ``specdec`` block to the config (what the drafter was trained for and how).
EAGLE-1/2 checkpoints (``fc`` over ``2 H`` with bias, ``layers.0.*``, no head of their own) load
as :class:`Eagle1DraftModel` and run on the target's final-norm state and LM head.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec_kernels.weight_files import read_json, read_weight_folder

__all__ = ["Eagle1DraftModel", "EagleConfig", "EagleDraftModel", "load_eagle", "save_eagle"]


@dataclass
class EagleConfig:
    """Shape of a draft network (the target's own layer shape, plus the draft vocabulary).

    Attributes
    ----------
    hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size : int
        The decoder layer's shape (the target's).
    vocab_size : int
        The target's vocabulary.
    draft_vocab_size : int
        Rows of the draft head.
    target_hidden_size : int
        Width of one captured target hidden state (``fc`` reads three of them).
    capture_layers : tuple
        Target decoder layers whose outputs are fused (low, middle, high); ``("final_norm",)``
        for an EAGLE-1 draft.
    rms_norm_eps, rope_theta : float
    info : dict
        What the drafter was trained for and how (the config's ``specdec`` block).
    kind : str
        ``"eagle3"`` or ``"eagle1"`` (:class:`Eagle1DraftModel`).
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    capture_layers: tuple
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    info: dict = field(default_factory=dict)
    kind: str = "eagle3"

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, capture_layers) -> "EagleConfig":
        """The config of a drafter for a Hugging Face (Llama-family) target config."""
        hidden = int(target_config.hidden_size)
        heads = int(target_config.num_attention_heads)
        rope = getattr(target_config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(target_config, "rope_theta", 10000.0))
        return cls(
            hidden_size=hidden, num_heads=heads,
            num_kv_heads=int(getattr(target_config, "num_key_value_heads", heads) or heads),
            head_dim=int(getattr(target_config, "head_dim", None) or hidden // heads),
            intermediate_size=int(target_config.intermediate_size),
            vocab_size=int(target_config.vocab_size), draft_vocab_size=int(draft_vocab_size),
            target_hidden_size=hidden, capture_layers=tuple(int(i) for i in capture_layers),
            rms_norm_eps=float(target_config.rms_norm_eps), rope_theta=float(theta),
        )

    def to_json(self) -> dict:
        """The published EAGLE-3 config (plus this package's ``specdec`` block)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": [i + 1 for i in self.capture_layers],
                "use_aux_hidden_state": True,
            },
            "specdec": self.info,
        }

    @classmethod
    def from_json(cls, data: dict, target_num_layers: int | None = None) -> "EagleConfig":
        """From a published (or this package's) EAGLE-3 ``config.json``.

        Without ``eagle_aux_hidden_state_layer_ids`` the published default ids
        ``(2, L // 2, L - 3)`` of an ``L``-layer target are used (``target_num_layers``
        needed then)."""
        for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
            if key not in data:
                raise ValueError(f"EAGLE config.json lacks {key!r}")
        if data.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"EAGLE drafts with hidden_act {data['hidden_act']!r} are not supported")
        if int(data.get("num_hidden_layers", 1)) != 1:
            raise ValueError("only one-layer EAGLE-3 drafts are supported "
                             f"(num_hidden_layers={data['num_hidden_layers']})")
        rope = data.get("rope_parameters") or {}
        scaling = data.get("rope_scaling") or {}
        kind = scaling.get("rope_type", scaling.get("type", rope.get("rope_type", "default")))
        if kind not in (None, "default"):
            raise ValueError(f"EAGLE drafts with rope scaling {kind!r} are not supported")
        ids = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if target_num_layers is None:
                raise ValueError("the EAGLE config names no aux hidden-state layers; "
                                 "the target's layer count is needed for the defaults")
            n = target_num_layers
            ids = [2, n // 2, n - 3]
        if len(ids) != 3:
            raise ValueError(f"EAGLE-3 fuses three target layers, the config names {ids}")
        heads = int(data["num_attention_heads"])
        hidden = int(data["hidden_size"])
        return cls(
            hidden_size=hidden, num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            intermediate_size=int(data["intermediate_size"]),
            vocab_size=int(data["vocab_size"]),
            draft_vocab_size=int(data.get("draft_vocab_size") or data["vocab_size"]),
            target_hidden_size=int(data.get("target_hidden_size") or hidden),
            capture_layers=tuple(int(i) - 1 for i in ids),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
            rope_theta=float(data.get("rope_theta", rope.get("rope_theta", 10000.0))),
            info=dict(data.get("specdec") or {}),
        )


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


@functools.lru_cache(maxsize=8)
def _inverse_frequencies(dim: int, theta: float, device) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))


def rope_tables(positions: Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple:
    """``cos``, ``sin`` ``[B, N, dim]`` of the rotary embedding at ``positions`` ``[B, N]``
    (Llama's half-split convention), in ``dtype``."""
    inv = _inverse_frequencies(dim, float(theta), positions.device)
    angles = positions.to(torch.float32)[..., None] * inv  # [B, N, D/2]
    emb = torch.cat([angles, angles], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary embedding (Llama's half-split convention) of ``x`` ``[B, heads, N, D]`` at
    ``positions`` ``[B, N]``."""
    dim = x.shape[-1]
    cos, sin = rope_tables(positions, dim, theta, x.dtype)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, N, D]
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class EagleDraftModel(nn.Module):
    """The EAGLE-3 draft network (see the module notes); parameter names follow the published
    files (``midlayer`` is the one decoder layer).

    Parameters
    ----------
    config : EagleConfig
    draft_ids : Tensor, optional
        ``[Vd]`` int64 target id of every draft-head row (ascending); ``arange`` by default.
    """

    def __init__(self, config: EagleConfig, draft_ids: Tensor | None = None):
        super().__init__()
        c = config
        self.config = c
        h, hd = c.hidden_size, c.head_dim
        self.fc = nn.Linear(3 * c.target_hidden_size, h, bias=False)
        layer = nn.Module()
        layer.input_layernorm = _RMSNorm(h, c.rms_norm_eps)
        layer.hidden_norm = _RMSNorm(h, c.rms_norm_eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(2 * h, c.num_heads * hd, bias=False)
        attn.k_proj = nn.Linear(2 * h, c.num_kv_heads * hd, bias=False)
        attn.v_proj = nn.Linear(2 * h, c.num_kv_heads * hd, bias=False)
        attn.o_proj = nn.Linear(c.num_heads * hd, h, bias=False)
        layer.self_attn = attn
        layer.post_attention_layernorm = _RMSNorm(h, c.rms_norm_eps)
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        layer.mlp = mlp
        self.midlayer = layer
        self.norm = _RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        self.embed_tokens: nn.Embedding | None = None  # the target's unless a file has one
        if draft_ids is None:
            draft_ids = torch.arange(c.draft_vocab_size)
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.int64)
        if draft_ids.shape != (c.draft_vocab_size,):
            raise ValueError(f"draft_ids has shape {tuple(draft_ids.shape)}, the config's "
                             f"draft vocabulary is {c.draft_vocab_size}")
        if int(draft_ids.min()) < 0 or int(draft_ids.max()) >= c.vocab_size:
            raise ValueError(f"draft_ids must be target ids in [0, {c.vocab_size})")
        self.register_buffer("draft_ids", draft_ids, persistent=False)

    # ------------------------------------------------------------------ pieces

    def fuse(self, features: Tensor) -> Tensor:
        """``[..., 3 Ht]`` captured target states -> ``[..., H]`` hidden vectors."""
        return self.fc(features)

    def bind_target(self, model) -> None:
        """Borrow what the draft shares with its target (the token embedding, unless the
        draft has its own), without registering it as a submodule: the draft's ``to()`` and
        ``state_dict()`` never touch the target's weights."""
        self.__dict__["_borrowed_embedding"] = model.get_input_embeddings()

    def embed(self, tokens: Tensor) -> Tensor:
        table = self.embed_tokens or self.__dict__.get("_borrowed_embedding")
        if table is None:
            raise ValueError("the draft has no token embedding: bind it to its target first")
        return table(tokens).to(self.fc.weight.dtype)

    def project(self, hidden: Tensor, tokens: Tensor, positions: Tensor):
        """Queries, keys and values of rows ``(hidden, tokens)`` at ``positions``.

        Parameters
        ----------
        hidden : Tensor
            ``[B, N, H]`` hidden vectors (fused target states, or the draft's own).
        tokens : Tensor
            ``[B, N]`` the token after each row.
        positions : Tensor
            ``[B, N]`` RoPE positions.

        Returns
        -------
        q, k, v : Tensor
            ``[B, heads, N, D]``, ``[B, kv_heads, N, D]`` twice (RoPE applied to q and k).
        residual : Tensor
            ``[B, N, H]`` what the layer's output adds to (:meth:`finish`).
        """
        layer, c = self.midlayer, self.config
        x = torch.cat([layer.input_layernorm(self.embed(tokens)), layer.hidden_norm(hidden)], -1)
        b, n, _ = x.shape
        attn = layer.self_attn
        q = attn.q_proj(x).view(b, n, c.num_heads, c.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v, hidden

    def finish(self, residual: Tensor, attended: Tensor) -> Tensor:
        """The rest of the layer: ``attended`` ``[B, heads, N, D]`` (attention output) with
        the ``residual`` ``[B, N, H]`` of :meth:`project` -> ``[B, N, H]`` pre-norm output."""
        layer = self.midlayer
        b, _, n, _ = attended.shape
        out = residual + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(b, n, -1))
        mlp = layer.mlp
        x = layer.post_attention_layernorm(out)
        return out + mlp.down_proj(nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))

    def logits(self, output: Tensor) -> Tensor:
        """Draft-vocabulary logits ``[..., Vd]`` of pre-norm outputs ``[..., H]``."""
        return self.lm_head(self.norm(output))

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """Attention of ``q`` ``[B, heads, N, D]`` over ``keys``/``values``
        ``[B, kv_heads, S, D]`` under the boolean ``mask`` ``[B, N, S]`` (True: visible)."""
        return nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask[:, None],
            enable_gqa=self.config.num_heads != self.config.num_kv_heads,
        )

    # ------------------------------------------------------------------ checks

    def check_target(self, hidden_size: int, vocab_size: int, num_layers: int) -> None:
        """Raise ``ValueError`` unless the draft fits a target of this shape."""
        c = self.config
        if c.target_hidden_size != hidden_size:
            raise ValueError(
                f"the EAGLE draft was trained for a target of hidden size {c.target_hidden_size};"
                f" this target's is {hidden_size}"
            )
        if c.vocab_size != vocab_size:
            raise ValueError(
                f"the EAGLE draft was trained for a vocabulary of {c.vocab_size} tokens; this "
                f"target's has {vocab_size}"
            )
        bad = [i for i in c.capture_layers if isinstance(i, int) and not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"the EAGLE draft reads target layers {list(c.capture_layers)}; "
                             f"this target has {num_layers}")


# ---------------------------------------------------------------------------- files


def save_eagle(model: EagleDraftModel, folder) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (published EAGLE-3 names; weights in
    bfloat16, the vocabulary maps as ``d2t``/``t2d``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    tensors = {k: v.detach().to(torch.bfloat16).contiguous()
               for k, v in model.state_dict().items() if not k.startswith("embed_tokens")}
    ids = model.draft_ids.cpu()
    tensors["d2t"] = (ids - torch.arange(c.draft_vocab_size)).contiguous()
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(c.to_json(), indent=1) + "\n")
    return folder


class Eagle1DraftModel(EagleDraftModel):
    """An EAGLE-1 (and EAGLE-2) draft, as the EAGLE repository publishes them: ``fc`` over
    ``[embedding of the next token, the target's final-norm state]`` (``2 H -> H``, with bias),
    one Llama decoder layer without its input norm (``layers.0.*``), and the *target's* LM head
    on the layer's output (no norm, the whole vocabulary). Its features are the final norm's.
    Runs under :class:`~specdec_kernels.decoding.eagle.EagleDrafter` like an EAGLE-3 draft."""

    def __init__(self, config: EagleConfig, bias: bool = True):
        nn.Module.__init__(self)
        c = config
        self.config = c
        h, hd = c.hidden_size, c.head_dim
        self.fc = nn.Linear(2 * h, h, bias=bias)
        layer = nn.Module()
        attn = nn.Module()
        attn.q_proj = nn.Linear(h, c.num_heads * hd, bias=False)
        attn.k_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        attn.v_proj = nn.Linear(h, c.num_kv_heads * hd, bias=False)
        attn.o_proj = nn.Linear(c.num_heads * hd, h, bias=False)
        layer.self_attn = attn
        layer.post_attention_layernorm = _RMSNorm(h, c.rms_norm_eps)
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        mlp.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        mlp.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        layer.mlp = mlp
        self.midlayer = layer
        self.embed_tokens = None
        self.register_buffer("draft_ids", torch.arange(c.vocab_size), persistent=False)

    def fuse(self, features: Tensor) -> Tensor:
        return features

    def bind_target(self, model) -> None:
        super().bind_target(model)
        self.__dict__["_borrowed_head"] = model.get_output_embeddings()

    def project(self, hidden: Tensor, tokens: Tensor, positions: Tensor):
        c = self.config
        x = self.fc(torch.cat([self.embed(tokens), hidden], -1))
        b, n, _ = x.shape
        attn = self.midlayer.self_attn
        q = attn.q_proj(x).view(b, n, c.num_heads, c.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v, x

    def logits(self, output: Tensor) -> Tensor:
        head = self.__dict__.get("_borrowed_head")
        if head is None:
            raise ValueError("an EAGLE-1 draft uses its target's LM head: bind it first")
        return head(output.to(head.weight.dtype)).float()


def _eagle1_config(data: dict) -> EagleConfig:
    heads = int(data["num_attention_heads"])
    hidden = int(data["hidden_size"])
    rope = data.get("rope_parameters") or {}
    return EagleConfig(
        hidden_size=hidden, num_heads=heads,
        num_kv_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads),
        intermediate_size=int(data["intermediate_size"]), vocab_size=int(data["vocab_size"]),
        draft_vocab_size=int(data["vocab_size"]), target_hidden_size=hidden,
        capture_layers=("final_norm",), rms_norm_eps=float(data.get("rms_norm_eps", 1e-5)),
        rope_theta=float(data.get("rope_theta", rope.get("rope_theta", 10000.0))),
        kind="eagle1",
    )


def load_eagle(folder, target_num_layers: int | None = None) -> EagleDraftModel:
    """An EAGLE-3 draft from a folder in the published layout (see the module notes).

    Raises
    ------
    FileNotFoundError
        No ``config.json`` or weights in ``folder``.
    ValueError
        A config or weights this network cannot run (shapes, missing tensors, maps that
        disagree).
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no EAGLE draft at {folder} (config.json missing)")
    data = read_json(folder / "config.json")
    weights = {k.replace("layers.0.", "midlayer.").removeprefix("model."): v
               for k, v in read_weight_folder(folder).items()}
    fc = weights.get("fc.weight")
    if fc is not None and "hidden_size" in data and fc.shape[1] == 2 * int(data["hidden_size"]):
        return _load_eagle1(data, weights)
    config = EagleConfig.from_json(data, target_num_layers)
    if "fc.weight" in weights and weights["fc.weight"].shape[1] != 3 * config.target_hidden_size:
        raise ValueError(
            f"fc.weight reads {weights['fc.weight'].shape[1]} features; an EAGLE-3 draft reads "
            f"3 x {config.target_hidden_size}, an EAGLE-1 draft 2 x {config.hidden_size}"
        )
    vd = config.draft_vocab_size
    if "d2t" in weights:
        d2t = weights.pop("d2t").to(torch.int64)
        if d2t.shape != (vd,):
            raise ValueError(f"d2t has shape {tuple(d2t.shape)}, expected ({vd},)")
        draft_ids = torch.arange(vd) + d2t
    elif vd == config.vocab_size:
        draft_ids = torch.arange(vd)
    else:
        raise ValueError(f"the draft vocabulary ({vd}) differs from the target's "
                         f"({config.vocab_size}) but the checkpoint has no d2t map")
    t2d = weights.pop("t2d", None)
    if t2d is not None:
        inside = torch.zeros(config.vocab_size, dtype=torch.bool)
        inside[draft_ids.clamp(0, config.vocab_size - 1)] = True
        if t2d.shape != (config.vocab_size,) or not torch.equal(t2d.bool(), inside):
            raise ValueError("t2d does not mark the same target ids as d2t")
    model = EagleDraftModel(config, draft_ids)
    embed = weights.pop("embed_tokens.weight", None)
    if embed is not None:
        model.embed_tokens = nn.Embedding.from_pretrained(embed.float(), freeze=True)
    return _fill(model, weights)


def _load_eagle1(data: dict, weights: dict) -> "Eagle1DraftModel":
    for key in ("num_attention_heads", "intermediate_size", "vocab_size"):
        if key not in data:
            raise ValueError(f"EAGLE config.json lacks {key!r}")
    model = Eagle1DraftModel(_eagle1_config(data), bias="fc.bias" in weights)
    embed = weights.pop("embed_tokens.weight", None)
    if embed is not None:
        model.embed_tokens = nn.Embedding.from_pretrained(embed.float(), freeze=True)
    return _fill(model, weights)


def _fill(model: EagleDraftModel, weights: dict) -> EagleDraftModel:
    """Load ``weights`` into ``model``, every tensor present and of its shape."""
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens")}
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    if missing or unexpected:
        raise ValueError(f"EAGLE weights do not match the network: missing {missing}, "
                         f"unexpected {unexpected}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the config gives "
                             f"{tuple(own[name].shape)}")
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    return model.eval()


def init_scale(module: nn.Module, std: float = 0.02) -> None:
    """Random initialisation for training (normal weights, unit norms)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
