#!/usr/bin/env bash
# The merged prophet with its default prophets, and with EAGLE among them (prompt lookup,
# suffix, EAGLE), 36 dev prompts, greedy, AVX-512 path; one run each, each with its plain loop.
set -e
R=results/cpu-2026-11-27/session10
B="python3 -m specdec_kernels.bench --max-new-tokens 128 --prompts-per-category 6"
$B --methods ours-autoregressive,ours-multi,ours-eagle --out "$R/bench6-multi-default"
$B --methods ours-autoregressive,ours-multi --prophets prompt-lookup,suffix,eagle --out "$R/bench6-multi-eagle"
