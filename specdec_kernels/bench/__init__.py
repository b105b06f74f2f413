"""The end-to-end benchmark harness behind ``specdec bench``: every decoding method and its
peers on the same prompts, interleaved, reported per Spec-Bench category."""
