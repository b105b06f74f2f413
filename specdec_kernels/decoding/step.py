"""The engine's only doorway to the verification and tree ops.

Everything the decoding step needs from the op families goes through the functions here:
sampling (plain and with the processed distribution, for drafts), chain and tree
verification, tree masks and positions, and the 4D attention mask Hugging Face models take.

TEMPORARY: until the ``verify`` and ``tree`` branches land, the bodies below are stand-ins in
plain torch with the interfaces of INTERFACES.md; they are replaced by calls to the real ops.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = [
    "SamplingParams",
    "chain_block_layout",
    "hf_attention_mask",
    "sample",
    "sample_with_probs",
    "select_params",
    "tree_block_layout",
    "verify_chain",
    "verify_tree",
]


@dataclass
class SamplingParams:  # stand-in for specdec_kernels.sampling.SamplingParams
    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    min_p: Tensor
    seed: Tensor

    @staticmethod
    def create(batch, *, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, device="cpu"):
        def col(value, dtype):
            t = torch.as_tensor(value, dtype=dtype)
            return (t.expand(batch) if t.dim() == 0 else t).clone().to(device)

        return SamplingParams(
            col(temperature, torch.float32),
            col(top_k, torch.int64),
            col(top_p, torch.float32),
            col(min_p, torch.float32),
            col(seed, torch.int64),
        )


def select_params(params: SamplingParams, index: Tensor) -> SamplingParams:
    """The parameters of the requests at ``index`` (a ``[B']`` int64 tensor)."""
    return type(params)(
        **{f.name: getattr(params, f.name).index_select(0, index) for f in fields(params)}
    )


def all_greedy(params: SamplingParams) -> bool:
    """Whether every request decodes greedily (reads the temperatures: call once per run)."""
    return bool((params.temperature <= 0).all())


# ----------------------------------------------------------------------------- stand-ins


def _processed_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    logits = logits.float()
    greedy = params.temperature <= 0
    temp = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    x = logits / temp[:, None]
    vocab = x.shape[-1]
    k = params.top_k
    k_on = (k > 0) & (k < vocab)
    if bool(k_on.any()):
        kth = x.sort(-1, descending=True).values.gather(-1, (k.clamp(1, vocab) - 1)[:, None])
        x = torch.where(k_on[:, None] & (x < kth), torch.full_like(x, -float("inf")), x)
    probs = torch.softmax(x, -1)
    p_on = params.top_p < 1
    if bool(p_on.any()):
        sp, si = probs.sort(-1, descending=True)
        before = sp.cumsum(-1) - sp
        drop = before >= params.top_p[:, None]
        sp = sp.masked_fill(drop & p_on[:, None], 0)
        probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], onehot, probs)


def _uniform(seed: Tensor, offset: Tensor, column: int) -> Tensor:
    out = []
    for s, o in zip(seed.tolist(), offset.tolist()):
        g = torch.Generator().manual_seed((s * 1000003 + o * 131 + column) % (2**62))
        out.append(torch.rand((), generator=g))
    return torch.stack(out).to(seed.device)


def _draw(probs: Tensor, u: Tensor) -> Tensor:
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None].contiguous()).squeeze(-1)
    return idx.clamp_max(probs.shape[-1] - 1)


def sample(logits: Tensor, params: SamplingParams, offset: Tensor) -> Tensor:
    """One token per row ``[N]`` from ``logits [N, V]`` (see INTERFACES.md ``ops.sample``)."""
    return sample_with_probs(logits, params, offset)[0]


def sample_with_probs(logits: Tensor, params: SamplingParams, offset: Tensor):
    """Tokens ``[N]`` and the processed distributions ``[N, V]`` they were drawn from."""
    probs = _processed_probs(logits, params)
    tokens = _draw(probs, _uniform(params.seed, offset, 0))
    return tokens, probs


def verify_chain(draft_tokens, num_draft, target_logits, draft_probs, params, offset):
    """Chain verification (see INTERFACES.md ``ops.verify_chain``)."""
    batch, k = draft_tokens.shape
    out = torch.full((batch, k + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    num_acc = torch.zeros(batch, dtype=torch.int64, device=draft_tokens.device)
    for b in range(batch):
        p_all = _processed_probs(target_logits[b], select_params(params, torch.full((k + 1,), b)))
        greedy = bool(params.temperature[b] <= 0)
        n = 0
        for i in range(int(num_draft[b])):
            x = int(draft_tokens[b, i])
            p = p_all[i]
            if greedy:
                ok = int(p.argmax()) == x
            else:
                q = draft_probs[b, i] if draft_probs is not None else None
                qx = float(q[x]) if q is not None else 1.0
                u = float(_uniform(params.seed[b : b + 1], offset[b : b + 1] + i, 1))
                ok = qx > 0 and u < min(1.0, float(p[x]) / qx)
            if not ok:
                if greedy:
                    nxt = int(p.argmax())
                else:
                    if q is None:
                        q = torch.zeros_like(p)
                        q[x] = 1
                    r = (p - q).clamp_min(0)
                    r = p if float(r.sum()) <= 0 else r
                    u2 = _uniform(params.seed[b : b + 1], offset[b : b + 1] + i, 2)
                    nxt = int(_draw(r[None], u2)[0])
                out[b, n] = nxt
                break
            out[b, n] = x
            n += 1
        else:
            p = p_all[n]
            u2 = _uniform(params.seed[b : b + 1], offset[b : b + 1] + n, 2)
            out[b, n] = int(p.argmax()) if greedy else int(_draw(p[None], u2)[0])
        num_acc[b] = n
    return out, num_acc


def verify_tree(tree_tokens, parents, target_logits, draft_probs, params, offset):
    """Tree verification (see INTERFACES.md ``ops.verify_tree``); greedy and deterministic
    drafts only in this stand-in."""
    batch, width = tree_tokens.shape
    nodes_out = torch.full((batch, width), -1, dtype=torch.int64, device=tree_tokens.device)
    out = torch.full((batch, width), -1, dtype=torch.int64, device=tree_tokens.device)
    num_acc = torch.zeros(batch, dtype=torch.int64, device=tree_tokens.device)
    for b in range(batch):
        par = parents[b].tolist()
        tok = tree_tokens[b].tolist()
        p_all = _processed_probs(target_logits[b], select_params(params, torch.full((width,), b)))
        greedy = bool(params.temperature[b] <= 0)
        node, n, depth = 0, 0, 0
        while True:
            children = [j for j in range(width) if par[j] == node]
            p = p_all[node].clone()
            chosen = None
            for c in children:
                x = tok[c]
                if greedy:
                    ok = int(p.argmax()) == x
                else:
                    u = float(_uniform(params.seed[b : b + 1], offset[b : b + 1] + depth, 1 + c))
                    ok = u < float(p[x]) / max(float(p.sum()), 1e-30)
                    if not ok:
                        p[x] = 0
                if ok:
                    chosen = c
                    break
            if chosen is None:
                if greedy:
                    nxt = int(p.argmax())
                else:
                    p = p_all[node] if float(p.sum()) <= 0 else p
                    u2 = _uniform(params.seed[b : b + 1], offset[b : b + 1] + depth, 0)
                    nxt = int(_draw(p[None], u2)[0])
                out[b, n] = nxt
                break
            nodes_out[b, n] = chosen
            out[b, n] = tok[chosen]
            n += 1
            depth += 1
            node = chosen
        num_acc[b] = n
    return nodes_out, out, num_acc


def tree_block_layout(parents: Tensor, prefix_lens: Tensor) -> tuple[Tensor, Tensor]:
    """Ancestor-or-self mask ``[B, T, T]`` (bool) and position ids ``[B, T]`` of a tree block
    whose node 0 sits right after each request's prefix. ``-2`` parents pad ragged trees."""
    batch, width = parents.shape
    anc = torch.zeros(batch, width, width, dtype=torch.bool, device=parents.device)
    depth = torch.zeros(batch, width, dtype=torch.int64, device=parents.device)
    par = parents.tolist()
    for b in range(batch):
        for j in range(width):
            anc[b, j, j] = True
            p = par[b][j]
            if p >= 0:
                anc[b, j] |= anc[b, p]
                depth[b, j] = depth[b, p] + 1
    return anc, prefix_lens[:, None] + depth


def chain_block_layout(prefix_lens: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """The same for a chain of ``width`` tokens: a causal mask and consecutive positions."""
    causal = torch.ones(width, width, dtype=torch.bool, device=prefix_lens.device).tril()
    steps = torch.arange(width, device=prefix_lens.device)
    return causal.expand(prefix_lens.shape[0], width, width), prefix_lens[:, None] + steps


def hf_attention_mask(
    ancestors: Tensor, prefix_lens: Tensor, kv_len: int, dtype: torch.dtype
) -> Tensor:
    """Additive 4D mask ``[B, 1, T, kv_len]`` over each request's ``[prefix + block]``: every
    prefix row is visible, block rows (at ``prefix_lens[b] + j``) by ``ancestors[b, i, j]``."""
    batch, width, _ = ancestors.shape
    kv = torch.arange(kv_len, device=ancestors.device)
    rel = kv[None, :] - prefix_lens[:, None]  # [B, KV]
    in_block = (rel >= 0) & (rel < width)
    cols = rel.clamp(0, width - 1)[:, None, :].expand(batch, width, kv_len)
    visible = ancestors.gather(2, cols) & in_block[:, None, :]
    visible |= (rel < 0)[:, None, :]
    mask = torch.zeros(batch, 1, width, kv_len, dtype=dtype, device=ancestors.device)
    return mask.masked_fill_(~visible[:, None], torch.finfo(dtype).min)


@dataclass
class _Tree:  # stand-in for specdec_kernels.tree.Tree
    parents: list
    tokens: list


def tree_from_sequences(sequences, root_token: int) -> _Tree:
    """Merge token sequences by common prefix into one tree rooted at ``root_token``."""
    parents, tokens, children = [-1], [root_token], [{}]
    for seq in sequences:
        node = 0
        for tok in seq:
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(tokens)
                parents.append(node)
                tokens.append(int(tok))
                children.append({})
                children[node][tok] = nxt
            node = nxt
    return _Tree(parents, tokens)


def stack_trees(trees) -> tuple[Tensor, Tensor]:
    """``(tokens [B, T], parents [B, T])`` of ragged trees, ``-2`` parents / 0 tokens padding."""
    width = max(len(t.parents) for t in trees)
    tokens = torch.zeros(len(trees), width, dtype=torch.int64)
    parents = torch.full((len(trees), width), -2, dtype=torch.int64)
    for b, t in enumerate(trees):
        tokens[b, : len(t.tokens)] = torch.tensor(t.tokens)
        parents[b, : len(t.parents)] = torch.tensor(t.parents)
    return tokens, parents
