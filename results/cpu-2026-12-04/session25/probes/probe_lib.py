"""What the session's probes share (run them from the repository root with PYTHONPATH=.): a
median timer, and the int4 quantized-self draft of the default model with a prefilled cache
(bfloat16 K/V, as the drafter keeps them)."""
import torch

from bench.linear_peers import median_ms


def median_us(fn, rounds: int = 400, warm: int = 20) -> float:
    """Median wall time of ``fn()`` in microseconds over ``rounds`` calls after ``warm``."""
    for _ in range(warm):
        fn()
    return 1e3 * median_ms(fn, rounds)


def int4_draft(prefix: int = 256):
    """(runner, cache, tokens, step): the default quantized-self draft (int4, re-scored head),
    ``prefix`` tokens cached, and ``step()`` one one-token forward after them."""
    from specdec_kernels.decoding.quantized import quantized_copy
    from specdec_kernels.decoding.runner import ModelRunner
    from specdec_kernels.models import load_model

    target = load_model(weights="float32").model
    runner = ModelRunner(quantized_copy(target, bits=4, group=32, head_bits=4, rerank=4))
    cache = runner.new_cache(1, prefix + 200, runner.narrow_kv_dtype())
    tokens = torch.tensor([[11]])
    with torch.inference_mode():
        runner.prefill(cache, [[(i * 7919) % 1000 + 10 for i in range(prefix)]])
    return runner, cache, tokens, lambda: runner.forward(cache, tokens, [prefix])


def stack_arguments(runner, step):
    """The arguments of the ``decoder_stack_`` call ``step()`` makes (captured once)."""
    captured = {}
    real = torch.ops.specdec.decoder_stack_

    class Spy:
        def __call__(self, *args, **kwargs):
            captured["args"] = (args, kwargs)
            return real(*args, **kwargs)

    torch.ops.specdec.decoder_stack_ = Spy()
    try:
        step()
    finally:
        torch.ops.specdec.decoder_stack_ = real
    return captured["args"]
