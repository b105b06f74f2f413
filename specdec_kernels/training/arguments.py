"""Command-line options of the self-distillation data builder, registered without importing the
builder (it imports the decoding layer and transformers; ``specdec --help`` must not)."""

from __future__ import annotations

__all__ = ["add_data_arguments"]


def add_data_arguments(p) -> None:
    """Options of :func:`specdec_kernels.training.selfdistill.build_data` on parser ``p``."""
    p.add_argument("--model", default="default", help="the frozen target")
    p.add_argument("--data", required=True, help="cache folder (resumed if present)")
    p.add_argument("--first-prompts", type=int, default=1280)
    p.add_argument("--second-prompts", type=int, default=640)
    p.add_argument("--task-prompts", type=int, default=640,
                   help="requests in user forms: code, questions, translation, summaries")
    p.add_argument("--self-prompts", type=int, default=0,
                   help="requests the target writes itself from its chat template's user turn")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64, help="prompts per chunk (one batch)")
    p.add_argument("--sampled-fraction", type=float, default=0.3,
                   help="share of answers sampled (T=0.8, top-p 0.95) instead of greedy")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="start no chunk after this many seconds (0: run to the end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
