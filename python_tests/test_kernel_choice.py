"""The per-machine choice of CPU kernels (kernel_choice), its cache (machine_cache), and the
runner's routing by the kind of forward: prefill linears may go to torch's GEMM, verification
never."""

import os
import subprocess
import sys

import pytest
import torch

from python_tests.decoding_helpers import tiny_model
from specdec_kernels import ops
from specdec_kernels.bench import machine
from specdec_kernels.decoding import cpu_matmul, kernel_choice, machine_cache
from specdec_kernels.decoding.kernel_choice import KernelChoice, choose, decide
from specdec_kernels.decoding.runner import ModelRunner


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def times(decode, prefill):
    """A measure_linears result from {rows: (package ms, torch ms)} tables."""
    def table(rows):
        return {str(r): {"package": p, "torch": t} for r, (p, t) in rows.items()}
    return {"decode": table(decode), "prefill": table(prefill)}


def test_decide():
    fast = {1: (10.0, 14.0), 8: (12.0, 40.0)}
    assert decide(times(fast, {32: (1.0, 2.0), 128: (4.0, 3.0), 512: (16.0, 9.0)})) == (True, 128)
    assert decide(times(fast, {32: (1.0, 2.0), 128: (4.0, 5.0), 512: (16.0, 17.0)})) == (True, None)
    # torch faster at 32 and 512 but not at 128: only 512 rows and up go to torch
    assert decide(times(fast, {32: (2.0, 1.0), 128: (4.0, 5.0), 512: (16.0, 9.0)})) == (True, 512)
    slow = {1: (20.0, 14.0), 8: (42.0, 40.0)}
    assert decide(times(slow, {32: (1.0, 2.0)}))[0] is False


def test_machine_cache_round_trip(cache_dir):
    calls = []

    def measure():
        calls.append(1)
        return {"value": 3}

    assert machine_cache.lookup("probe", {"shape": 1}) is None
    assert machine_cache.measured("probe", {"shape": 1}, measure) == {"value": 3}
    assert machine_cache.measured("probe", {"shape": 1}, measure) == {"value": 3}
    assert len(calls) == 1  # the second call read the file
    assert machine_cache.lookup("probe", {"shape": 2}) is None
    ops.cpu_isa("portable")
    try:  # another instruction set is another machine
        assert machine_cache.lookup("probe", {"shape": 1}) is None
    finally:
        ops.cpu_isa("none")
    machine_cache.forget("probe")
    assert machine_cache.lookup("probe", {"shape": 1}) is None
    fp = machine_cache.fingerprint()
    assert set(fp) == {"cpu", "isa", "threads", "torch", "code"} and fp["isa"] == ops.cpu_isa()
    assert len(fp["code"]) == 16 and fp["code"] == machine_cache.code_revision()


def test_other_code_is_another_measurement(cache_dir, monkeypatch):
    """A measurement made with other kernels (another build) is not read back."""
    machine_cache.store("probe", {"shape": 2}, {"v": 1})
    assert machine_cache.lookup("probe", {"shape": 2}) == {"v": 1}
    monkeypatch.setattr(machine_cache, "code_revision", lambda: "another build")
    assert machine_cache.lookup("probe", {"shape": 2}) is None


def test_unwritable_cache_still_measures(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(blocker / "sub"))  # cannot be created
    assert machine_cache.measured("probe", None, lambda: {"v": 1}) == {"v": 1}


def test_choose_measures_once_and_says_why(cache_dir, monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "auto")
    model = tiny_model("llama", layers=1)
    calls = []
    real = kernel_choice.measure_linears

    def counted(weights, repeats=3, prefill_weights=None):
        calls.append(len(weights))
        return real(weights, repeats=1, prefill_weights=prefill_weights)

    monkeypatch.setattr(kernel_choice, "measure_linears", counted)
    first = choose(model)
    again = choose(model)
    assert len(calls) == 1 and first == again
    assert first.isa == ops.cpu_isa() and "measured" in first.reason
    assert first.describe()["path"] in ("package", "torch")
    # the weights measured: every linear of the model, the tied LM head once
    assert calls[0] == len(kernel_choice.linear_weights(model))


def test_choose_by_request_and_environment(cache_dir, monkeypatch):
    model = tiny_model("llama", layers=1)
    assert choose(model, False) == KernelChoice(False, None, "asked for", ops.cpu_isa())
    assert choose(model, True).package
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "torch")
    assert not choose(model).package
    assert choose(model, True).package  # an explicit request wins
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "fastest")
    with pytest.raises(ValueError, match="SPECDEC_CPU_KERNELS"):
        choose(model)


def test_quantized_linears_are_not_measured(cache_dir, monkeypatch):
    """Weights at a file's precision have only the package's kernel: they are not timed, and a
    model with nothing else keeps the package's kernels."""
    from specdec_kernels.models.quantized_weight import quantize_model

    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "auto")
    model = tiny_model("llama", layers=1)
    dense = len(kernel_choice.linear_weights(model))
    quantize_model(model, 8, 32)
    assert 0 < dense and kernel_choice.linear_weights(model) == []
    monkeypatch.setattr(kernel_choice, "measure_linears", lambda *a, **k: pytest.fail("measured"))
    assert choose(model).package


def test_measured_slower_package_defaults_to_torch(cache_dir, monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "auto")
    monkeypatch.setattr(kernel_choice, "measure_linears", lambda weights, **kwargs: times(
        {1: (20.0, 10.0), 8: (40.0, 20.0)}, {32: (1.0, 2.0)}))
    model = tiny_model("llama", layers=1)
    runner = ModelRunner(model)
    assert not runner.cpu_kernels and runner.kernels.path == "torch"
    from specdec_kernels.decoding import generate

    out = generate(model, [[1, 2, 3]], max_new_tokens=3, eos_token_id=[])
    assert out.stats.kernels["path"] == "torch" and "torch kernels" in out.stats.summary()


def rows_counted(linear, seen: list):
    """``linear`` that appends the rows of each call's ``x`` to ``seen``."""
    def counted(x, *args):
        seen.append(x.numel() // x.shape[-1])
        return linear(x, *args)
    return counted


def test_prefill_linears_go_to_gemm_verification_never(cache_dir, monkeypatch):
    """With a GEMM threshold of 4 rows, a prefill forward of 9 tokens leaves its linears to
    torch, while a 9-row verification block stays on the batch-invariant kernel (its rows equal
    one-token decoding bit for bit)."""
    model = tiny_model("qwen2", layers=2)
    runner = ModelRunner(model, cpu_kernels=True)
    runner._kernels = KernelChoice(True, 4, "test", ops.cpu_isa())
    rows_seen, gemm_rows_seen = [], []
    monkeypatch.setattr(ops, "small_batch_linear", rows_counted(ops.small_batch_linear, rows_seen))
    monkeypatch.setattr(cpu_matmul, "gemm_linear", rows_counted(cpu_matmul.gemm_linear, gemm_rows_seen))
    prompt = list(range(1, 10))
    block = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        cache = runner.new_cache(1, 64)
        runner.append(cache, [prompt])
        prefill_rows, rows_seen[:] = list(rows_seen), []
        verified = runner.forward(cache, block, cache.host_lens)[0]
        verify_rows, rows_seen[:] = list(rows_seen), []
        step_cache = runner.new_cache(1, 64)
        runner.append(step_cache, [prompt])
        for j in range(block.shape[1]):
            one = runner.forward(step_cache, block[:, j : j + 1], step_cache.host_lens)[0, 0]
            step_cache.extend([1])
            assert torch.equal(one, verified[j]), j
    runner.release()
    assert 9 not in prefill_rows  # the prompt's 9-row linears went to torch's GEMM
    assert gemm_rows_seen and set(gemm_rows_seen) == {9}
    assert prefill_rows  # (the last-position LM head, one row, stayed on the kernel)
    assert verify_rows and set(verify_rows) == {9}


def test_cap_isa_restarts_with_torch_capped():
    """``cap_isa("avx2")`` re-executes the process with torch's own kernels capped too."""
    if ops.cpu_isa() == "portable":
        pytest.skip("this CPU has no AVX2")
    code = ("from specdec_kernels.bench import machine; import torch; "
            "print(machine.cap_isa('avx2'), torch.backends.cpu.get_cpu_capability())")
    env = {k: v for k, v in os.environ.items() if k not in machine.TORCH_ISA_ENV["avx2"]}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["avx2", "AVX2"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, n, bias", [((37, 19), 7, True), ((2, 131, 64), 45, False),
                                            ((1, 5, 576), 1, True), ((3, 8), 33, False)])
def test_gemm_linear_is_a_linear(dtype, shape, n, bias):
    """torch's GEMM for prefill rows (oneDNN's where torch has it) computes ``F.linear``."""
    gen = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(*shape, generator=gen).to(dtype)
    w = torch.randn(n, shape[-1], generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    out = cpu_matmul.gemm_linear(x, w, b)
    ref = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert out.shape == ref.shape and out.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * shape[-1] ** 0.5)


def test_gemm_linear_leaves_gradients_and_other_dtypes_to_f_linear(monkeypatch):
    """oneDNN's op is for inference: with a gradient wanted, or a dtype or device it does not
    take, ``F.linear`` runs (and the gradient flows)."""
    called = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(cpu_matmul.F, "linear", lambda *a: called.append(a[0].dtype) or real(*a))
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(4, 5)
    cpu_matmul.gemm_linear(x, w).sum().backward()
    assert x.grad is not None and called == [torch.float32]
    cpu_matmul.gemm_linear(torch.randn(6, 5).half(), w.half())
    assert called[-1] == torch.float16
    with torch.no_grad():
        cpu_matmul.gemm_linear(x, w)
    assert len(called) == 2 or cpu_matmul.GEMM_LIBRARY == "torch"


def test_the_lm_head_is_not_timed_at_prefill_rows(cache_dir, monkeypatch):
    """A prefill forward runs the LM head on its last row only: the prefill check times the
    layers' weights, the decoding check all of them."""
    seen = {}

    def measure(weights, **kwargs):
        seen["decode"] = {tuple(w.shape) for w in weights}
        seen["prefill"] = {tuple(w.shape) for w in kwargs["prefill_weights"]}
        return times({1: (1.0, 2.0), 8: (1.0, 2.0)}, {32: (1.0, 2.0)})

    monkeypatch.setattr(kernel_choice, "measure_linears", measure)
    model = tiny_model("llama", layers=1, vocab=97)
    choose(model, True)
    head = tuple(model.get_output_embeddings().weight.shape)
    assert head in seen["decode"] and head not in seen["prefill"]
    assert seen["prefill"] == seen["decode"] - {head}
