"""The end-to-end benchmark harness behind ``specdec bench``: every decoding method and its
peers on the same prompts, interleaved, reported per Spec-Bench category."""

from specdec_kernels.bench.cli import add_subcommand

__all__ = ["add_subcommand"]
