"""llama.cpp as a benchmark peer: `llama-cpp-python <https://pypi.org/project/llama-cpp-python/>`_
on the same GGUF file and prompts, plain decoding and its prompt-lookup drafter.

Optional and never a dependency; build it from source for this CPU (a few minutes)::

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python --no-binary llama-cpp-python
"""

from __future__ import annotations

import importlib.util
import time

from specdec_kernels.bench.methods import RunRecord, Sampling

__all__ = ["LlamaCppMethod", "llama_cpp_missing"]

INSTALL_HINT = ('CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python '
                "--no-binary llama-cpp-python")


def llama_cpp_missing() -> str | None:
    """Why the llama.cpp peer cannot run here (None: it can)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({INSTALL_HINT})"
    return None


class LlamaCppMethod:
    """``llama_cpp.Llama.generate`` on a GGUF file, one prompt at a time, from an empty cache.

    Parameters
    ----------
    name : str
        The method's name in reports.
    gguf_path : str
        The model file (the same one our methods load).
    eos_ids : set of int
        Tokens that end a request (the target's, so every method stops alike).
    threads : int
        CPU threads (torch's, for a like-for-like comparison).
    prompt_lookup : int
        Draft tokens of llama-cpp-python's prompt-lookup drafter per step (0: plain decoding).
    context : int
        The context window allocated (prompt + new tokens must fit).
    """

    kind = "llama-cpp"

    def __init__(self, name: str, gguf_path: str, eos_ids: set, *, threads: int,
                 prompt_lookup: int = 0, context: int = 4096):
        reason = llama_cpp_missing()
        if reason is not None:
            raise ValueError(f"{name}: {reason}")
        from llama_cpp import Llama

        draft = None
        if prompt_lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)
        self.name = name
        self.eos_ids = set(eos_ids)
        # With a draft model llama-cpp-python (0.3.36) keeps logits of every position but sizes
        # its score buffer by logits_all: without it a prompt longer than n_batch overruns it.
        self.llm = Llama(model_path=str(gguf_path), n_ctx=context, n_batch=512,
                         n_threads=threads, n_threads_batch=threads, draft_model=draft,
                         logits_all=draft is not None, verbose=False)
        self.settings = {"gguf": str(gguf_path), "threads": threads,
                         "prompt_lookup_tokens": prompt_lookup}

    def run(self, prompts: list, max_new_tokens: int, sampling: Sampling) -> RunRecord:
        """Generate for a batch of one prompt (token id list); prefill included in the time."""
        if len(prompts) != 1:
            raise ValueError(f"{self.name}: llama-cpp-python decodes one prompt at a time")
        kwargs = dict(temp=0.0, top_k=1) if sampling.greedy else dict(
            temp=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p, min_p=0.0)
        if not sampling.greedy:
            self.llm.set_seed(sampling.seed)
        tokens: list = []
        start = time.perf_counter()
        self.llm.reset()  # no prefix reuse from an earlier run
        for token in self.llm.generate(list(prompts[0]), reset=True, **kwargs):
            tokens.append(int(token))
            if token in self.eos_ids or len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return RunRecord([tokens], seconds)
